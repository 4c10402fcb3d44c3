"""The worker's side of the agents: a ModelRunner whose `run` is one Step call to every rank."""
import itertools
import os
import threading
from typing import Callable, List, Optional, Sequence

import grpc
import numpy as np

from mindspore_serving import log
from mindspore_serving.ipc import agent as protocol
from mindspore_serving.llm.model_io import MultiStepRunner, SeqStep, StepSubmitter
from mindspore_serving.proto import agent_pb2, agent_pb2_grpc

CONNECT_TIMEOUT = 5.0


class AgentRunner(MultiStepRunner, StepSubmitter):
    """ModelRunner over agent processes. Rank 0 returns the logits; every rank runs the step.

    It attaches to each agent with a stream held open for its whole life, so an agent exits when this
    worker does; `on_agent_lost(rank, reason)` is called when an agent goes away.
    """

    def __init__(self, addresses: Sequence[str], on_agent_lost: Optional[Callable[[int, str], None]] = None):
        self.addresses = list(addresses)
        self.on_agent_lost = on_agent_lost
        self._closing = threading.Event()
        self._step_ids = itertools.count(1)
        self._last_step_id = 0
        self._encoder = protocol.StepEncoder()
        self.channels = [grpc.insecure_channel(a, options=protocol.AGENT_CHANNEL_OPTIONS) for a in self.addresses]
        for address, channel in zip(self.addresses, self.channels):
            try:
                grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
            except grpc.FutureTimeoutError:
                self.close()
                raise RuntimeError(f"no LLM agent answers at {address}; start it with start_agent.py") from None
        self.stubs = [agent_pb2_grpc.LlmAgentStub(channel) for channel in self.channels]
        infos = [stub.Info(agent_pb2.AgentInfoRequest(), timeout=CONNECT_TIMEOUT) for stub in self.stubs]
        for info, address in zip(infos, self.addresses):
            if info.protocol_version != protocol.AGENT_PROTOCOL_VERSION:
                raise RuntimeError(f"agent at {address} speaks protocol {info.protocol_version}, this worker "
                                   f"{protocol.AGENT_PROTOCOL_VERSION}")
        info = infos[0]
        self.block_size = info.block_size
        self.num_blocks = info.num_blocks
        self.max_seq_len = info.max_seq_len
        self.vocab_size = info.vocab_size
        self.device = info.device
        self._attachments = [stub.Attach(agent_pb2.AttachRequest(worker_pid=os.getpid())) for stub in self.stubs]
        for rank, call in enumerate(self._attachments):
            next(call)  # the agent has registered this worker
            threading.Thread(target=self._watch, args=(rank, call), name=f"agent-watch-{rank}", daemon=True).start()

    def _watch(self, rank: int, call):
        reason = "its stream ended"
        try:
            for _ in call:
                pass
        except grpc.RpcError as err:
            reason = f"{err.code().name}: {err.details()}"
        if not self._closing.is_set():
            log.error(f"LLM agent rank {rank} at {self.addresses[rank]} is gone ({reason})")
            if self.on_agent_lost is not None:
                self.on_agent_lost(rank, reason)

    def run(self, seqs: List[SeqStep]) -> np.ndarray:
        return self.submit(seqs).result()

    def run_greedy(self, seqs: List[SeqStep], num_steps: int):
        """Multi-step greedy decoding (model_io.run_greedy_steps), done by the agents in one Step call."""
        return self.submit(seqs, num_steps).result()

    def submit(self, seqs: Sequence[SeqStep], greedy_steps: int = 0, prev_rows: Sequence[int] = ()) -> "_StepCall":
        """Sends a step to every rank and returns at once (model_io: steps run in the order they are submitted,
        placeholder rows continue from the step submitted before). `.result()`: rank 0's logits, or (tokens,
        logprobs) of a greedy step; raises when any rank failed. Called from one thread (the engine's)."""
        step_id = next(self._step_ids)
        request = self._encoder.encode(step_id, seqs, greedy_steps, self._last_step_id, prev_rows)
        call = _StepCall([stub.Step.future(request) for stub in self.stubs], greedy_steps, self._encoder.reset)
        self._last_step_id = step_id  # sent: the next step runs after it
        return call

    def close(self):
        self._closing.set()
        for call in getattr(self, "_attachments", []):
            call.cancel()
        for channel in self.channels:
            channel.close()


class _StepCall:
    """A step sent to every rank; `result()` waits for the replies. A failed step calls `on_failure` (a rank
    may not have kept that step's block tables)."""

    def __init__(self, calls, greedy_steps: int, on_failure: Callable[[], None]):
        self.calls = calls
        self.greedy_steps = greedy_steps
        self.on_failure = on_failure

    def result(self):
        try:
            replies = [call.result() for call in self.calls]
            for rank, reply in enumerate(replies[1:], start=1):
                if reply.error:
                    raise RuntimeError(f"agent rank {rank} step failed: {reply.error}")
            if self.greedy_steps:
                return protocol.decode_greedy(replies[0], self.greedy_steps)
            return protocol.decode_logits(replies[0])
        except BaseException:
            self.on_failure()
            raise
