"""The worker's side of the agents: a ModelRunner whose `run` is one Step call to every rank."""

import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence

import grpc
import numpy as np

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.ipc import agent as protocol
from mindspore_serving.ipc import internal_tls
from mindspore_serving.llm.model_io import MultiStepRunner, PromptScorer, SeqStep, StepSubmitter, is_mixed_step
from mindspore_serving.proto import agent_pb2, agent_pb2_grpc

CONNECT_TIMEOUT = 5.0


class AgentLost(errors.WorkerUnavailable, RuntimeError):
    """A rank of the agent group died or stopped answering: the steps in flight cannot complete. It is the
    unavailable kind: the worker restarts with new agents, so its requests are worth retrying (HTTP 503, gRPC
    UNAVAILABLE); the message names the model, the rank and what happened, never a gRPC object."""


class AgentRunner(MultiStepRunner, StepSubmitter, PromptScorer):
    """ModelRunner over agent processes. Rank 0 returns the logits; every rank runs the step (the worker sends
    each step to every rank itself: a relay through rank 0 would add a hop to every step). Every token's logits of
    a sequence that asks for them (SeqStep.all_logits) come from rank 0 too; every rank runs the same graph
    calls (a tensor-parallel group's all-reduce in each), so a group scores prompts when every rank can.

    It attaches to each agent with a stream held open for its whole life, so an agent exits when this
    worker does, and pings each one every `heartbeat_interval` s: a rank whose stream ends, or that misses
    `heartbeat_misses` pings in a row (a hung process), is lost. Then every step in flight fails at once with
    AgentLost (the other ranks of a cluster would block in their next collective) and `on_agent_lost(rank,
    reason)` is called once.

    It runs mixed steps (model_io): the ranks choose the greedy rows' tokens, and only the rows the engine samples
    bring their logits back. `spec_tokens`: the most proposed tokens a row may carry and be verified in one call on
    every rank (GraphRunner's step graphs: any number its max_seq_len holds).
    """

    mixed_steps = True

    def __init__(
        self,
        addresses: Sequence[str],
        on_agent_lost: Callable[[int, str], None] | None = None,
        heartbeat_interval: float = 1.0,
        heartbeat_misses: int = 3,
        connect_timeout: float = CONNECT_TIMEOUT,
        model_name: str = "the model",
        secret: str = "",
        expected_pids: dict | None = None,
    ):
        self.addresses = list(addresses)
        self.secret = secret
        self._step_metadata = ((protocol.SECRET_METADATA, secret),) if secret else None
        self.model_name = model_name
        self.on_agent_lost = on_agent_lost
        self._closing = threading.Event()
        self._lost_lock = threading.Lock()
        self.lost: str | None = None  # why the group is lost, once it is
        self._in_flight: set[_StepCall] = set()
        self._step_ids = itertools.count(1)
        self._last_step_id = 0
        self._encoder = protocol.StepEncoder()
        tls = internal_tls.from_env(internal_tls.AGENT_PREFIX)  # agents on TCP ports: mutual TLS when set
        self.channels = [internal_tls.open_channel(a, protocol.AGENT_CHANNEL_OPTIONS, tls) for a in self.addresses]
        for address, channel in zip(self.addresses, self.channels):
            try:
                grpc.channel_ready_future(channel).result(timeout=connect_timeout)
            except grpc.FutureTimeoutError:
                self.close()
                raise RuntimeError(f"no LLM agent answers at {address}; start it with start_agent.py") from None
        self.stubs = [agent_pb2_grpc.LlmAgentStub(channel) for channel in self.channels]
        infos = [stub.Info(agent_pb2.AgentInfoRequest(), timeout=CONNECT_TIMEOUT) for stub in self.stubs]
        for rank, (info, address) in enumerate(zip(infos, self.addresses)):
            if info.protocol_version != protocol.AGENT_PROTOCOL_VERSION:
                self.close()
                raise RuntimeError(
                    f"agent at {address} speaks protocol {info.protocol_version}, this worker "
                    f"{protocol.AGENT_PROTOCOL_VERSION}"
                )
            expected = (expected_pids or {}).get(rank)
            if expected is not None and info.pid != expected:  # another process took its address
                self.close()
                raise RuntimeError(
                    f"the agent at {address} is pid {info.pid}, not the rank {rank} this worker "
                    f"started (pid {expected})"
                )
        info = infos[0]
        self.block_size = info.block_size
        self.num_blocks = min(i.num_blocks for i in infos)  # ranks measured on different hosts may differ
        self.max_seq_len = info.max_seq_len
        self.vocab_size = info.vocab_size
        self.device = info.device
        refusals = [(rank, i.score_refusal) for rank, i in enumerate(infos) if i.score_refusal]
        self._score_refusal = f"agent rank {refusals[0][0]}: {refusals[0][1]}" if refusals else None
        # the longest rows every rank verifies in one call (spec_tokens + 1 tokens)
        self.spec_tokens = min(i.spec_tokens for i in infos)
        self._attachments = [
            stub.Attach(agent_pb2.AttachRequest(worker_pid=os.getpid(), secret=secret)) for stub in self.stubs
        ]
        for rank, call in enumerate(self._attachments):
            next(call)  # the agent has registered this worker
            threading.Thread(target=self._watch, args=(rank, call), name=f"agent-watch-{rank}", daemon=True).start()
        threading.Thread(
            target=self._heartbeat, args=(heartbeat_interval, heartbeat_misses), name="agent-heartbeat", daemon=True
        ).start()

    def _watch(self, rank: int, call):
        reason = "its stream ended"
        try:
            for _ in call:
                pass
        except grpc.RpcError as err:
            reason = f"{err.code().name}: {err.details()}"
        self._lose(rank, f"LLM agent rank {rank} of {self.model_name} is gone ({self.addresses[rank]}: {reason})")

    def _heartbeat(self, interval: float, misses: int):
        """Pings every rank each `interval` s (Info, answered beside a running step); a rank that misses `misses`
        pings in a row is lost. A ping that times out takes the cycle's whole interval, so a hung rank is lost
        about (misses + 1) * interval after it stopped."""
        missed = [0] * len(self.stubs)
        request = agent_pb2.AgentInfoRequest()
        wait = interval
        while not self._closing.wait(wait):
            started = time.monotonic()
            pings = [stub.Info.future(request, timeout=interval) for stub in self.stubs]
            for rank, ping in enumerate(pings):
                try:
                    ping.result()
                    missed[rank] = 0
                except grpc.RpcError:
                    missed[rank] += 1
                    if missed[rank] >= misses:
                        self._lose(
                            rank,
                            f"LLM agent rank {rank} of {self.model_name} is not responding "
                            f"({self.addresses[rank]}: {misses} heartbeats of {interval:g} s missed)",
                        )
                        return
            if self.lost is not None:
                return
            wait = max(0.0, interval - (time.monotonic() - started))

    def _lose(self, rank: int, reason: str):
        """The group cannot go on: fails every step in flight and every later one with `reason`."""
        with self._lost_lock:
            if self._closing.is_set() or self.lost is not None:
                return
            self.lost = reason
            in_flight, self._in_flight = list(self._in_flight), set()
        log.error(reason)
        for call in in_flight:
            call.abort(reason)
        if self.on_agent_lost is not None:
            self.on_agent_lost(rank, reason)

    def score_refusal(self) -> str | None:
        return self._score_refusal

    def run(self, seqs: list[SeqStep]) -> np.ndarray:
        return self.submit(seqs).result()

    def run_greedy(self, seqs: list[SeqStep], num_steps: int):
        """Multi-step greedy decoding (model_io.run_greedy_steps), done by the agents in one Step call."""
        return self.submit(seqs, num_steps).result()

    def submit(
        self,
        seqs: Sequence[SeqStep],
        greedy_steps: int = 0,
        prev_rows: Sequence[int] = (),
        logits_rows: Sequence[int] = (),
    ) -> "_StepCall":
        """Sends a step to every rank and returns at once (model_io: steps run in the order they are submitted,
        placeholder rows continue from the step submitted before). `.result()`: rank 0's logits, (tokens,
        logprobs) of a greedy step, or a MixedStep (`logits_rows`); raises when any rank failed. Called from one
        thread (the engine's)."""
        step_id = next(self._step_ids)
        request = self._encoder.encode(step_id, seqs, greedy_steps, self._last_step_id, prev_rows, logits_rows)
        mixed = is_mixed_step(greedy_steps, logits_rows, any(seq.all_logits for seq in seqs))
        call = _StepCall(greedy_steps, self._finished, self.model_name, len(logits_rows), mixed)
        with self._lost_lock:
            if self.lost is not None:
                raise AgentLost(self.lost)
            self._in_flight.add(call)
        call.start([stub.Step.future(request, metadata=self._step_metadata) for stub in self.stubs])
        self._last_step_id = step_id  # sent: the next step runs after it
        return call

    def _finished(self, call: "_StepCall", failed: bool):
        with self._lost_lock:
            self._in_flight.discard(call)
        if failed:
            self._encoder.reset()

    def close(self):
        self._closing.set()
        for call in getattr(self, "_attachments", []):
            call.cancel()
        for channel in self.channels:
            channel.close()


class _StepCall:
    """A step sent to every rank; `result()` waits until every rank replied, or raises as soon as one rank failed
    or the group was lost (`abort`): the other ranks of a cluster may never reply. `on_finished(call, failed)`
    runs once (after a failure a rank may not have kept that step's block tables)."""

    def __init__(
        self,
        greedy_steps: int,
        on_finished: Callable[["_StepCall", bool], None],
        model_name: str = "the model",
        num_logits_rows: int = 0,
        mixed: bool | None = None,
    ):
        self.greedy_steps = greedy_steps
        self.num_logits_rows = num_logits_rows  # a mixed step's
        self.mixed = bool(num_logits_rows) if mixed is None else mixed
        self.model_name = model_name
        self.on_finished = on_finished
        self.calls = []
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._pending = 0
        self._failure: BaseException | None = None

    def start(self, calls):
        self.calls = calls
        self._pending = len(calls)
        for rank, call in enumerate(calls):
            call.add_done_callback(lambda future, rank=rank: self._reply(rank, future))

    def _reply(self, rank: int, future):
        with self._lock:
            self._pending -= 1
            if self._failure is None:
                if future.cancelled():
                    self._failure = AgentLost(f"the step to LLM agent rank {rank} of {self.model_name} was cancelled")
                elif future.exception() is not None:
                    self._failure = AgentLost(
                        f"LLM agent rank {rank} of {self.model_name} did not answer the step "
                        f"({_rpc_failure(future.exception())})"
                    )
                elif rank > 0 and future.result().error:  # rank 0's error is raised by its decoding
                    self._failure = RuntimeError(f"agent rank {rank} step failed: {future.result().error}")
            if self._pending == 0 or self._failure is not None:
                self._done.set()

    def abort(self, reason: str):
        with self._lock:
            if self._failure is None:
                self._failure = AgentLost(reason)
            self._done.set()

    def result(self):
        self._done.wait()
        if self._failure is not None:
            for call in self.calls:
                call.cancel()
            self.on_finished(self, True)
            raise self._failure
        try:
            reply = self.calls[0].result()
        except (grpc.RpcError, grpc.FutureCancelledError) as err:  # never hand a gRPC object to the engine
            self.on_finished(self, True)
            raise AgentLost(
                f"LLM agent rank 0 of {self.model_name} did not answer the step ({_rpc_failure(err)})"
            ) from None
        try:
            if self.mixed:
                out = protocol.decode_mixed(reply, self.num_logits_rows)
            elif self.greedy_steps:
                out = protocol.decode_greedy(reply, self.greedy_steps)
            else:
                out = protocol.decode_logits(reply)
        except BaseException:
            self.on_finished(self, True)
            raise
        self.on_finished(self, False)
        return out


def _rpc_failure(err: BaseException) -> str:
    """What a failed call says, as text ("UNAVAILABLE: Socket closed"); str() of a gRPC error is its repr."""
    code, details = getattr(err, "code", None), getattr(err, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"
    return type(err).__name__
