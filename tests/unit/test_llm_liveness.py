"""The master's watchdog over a real worker session and engine loop: a generation fails as hung only when its
worker's engine makes no progress, never for waiting its turn behind work that progresses.

The master's LLM backend talks gRPC to the worker's session service (in-process), whose runtime is a real
EngineLoop over a FakeModelRunner made slow (each step takes a fraction of the token timeout) or hung (no step
ever completes). Every wait has a deadline."""

import asyncio
import threading
import time
from concurrent import futures
from types import SimpleNamespace

import grpc
from llm_setup import llm_worker_registry

from mindspore_serving.common import errors
from mindspore_serving.ipc import llm_session
from mindspore_serving.llm import LLMEngine, SchedulerConfig
from mindspore_serving.llm.engine_loop import EngineLoop
from mindspore_serving.llm.generation_defaults import GenerationDefaults
from mindspore_serving.llm.testing import FakeModelRunner
from mindspore_serving.master import llm_backend
from mindspore_serving.master.llm_backend import MasterLlmBackend
from mindspore_serving.master.llm_types import FinalEvent, GenerationRequest, TokenEvent
from mindspore_serving.proto import llm_worker_pb2_grpc
from mindspore_serving.worker.llm.runtime import LlmRuntime
from mindspore_serving.worker.llm.session_service import LlmWorkerServicer

TOKEN_TIMEOUT_S = 0.5
PROGRESS_INTERVAL_S = 0.1  # the worker's heartbeat, well below the timeout as the real one (1 s) is below 60 s
DEADLINE_S = 20.0
NEW_TOKENS = 6


class SlowRunner(FakeModelRunner):
    """Each model step takes `step_s`; with `hang`, the first one never returns until `release` is set."""

    def __init__(self, step_s: float = 0.0, hang: bool = False):
        super().__init__(num_blocks=64, block_size=4, max_seq_len=64, vocab_size=97)
        self.step_s = step_s
        self.hang = hang
        self.release = threading.Event()

    def run(self, seqs):
        if self.hang:
            self.release.wait(DEADLINE_S)
        time.sleep(self.step_s)  # ok-sleep: the simulated cost of a model step, not a wait for a signal
        return super().run(seqs)


class LoopRuntime:
    """What the session service uses of an LlmRuntime, over a real engine loop (no tokenizer: token-id prompts)."""

    submit = LlmRuntime.submit
    engine_steps = LlmRuntime.engine_steps

    def __init__(self, loop: EngineLoop):
        self.loop = loop
        self.spec = SimpleNamespace(name="tiny")
        self.tokenizer = SimpleNamespace(special_ids=frozenset())
        self.generation_defaults = GenerationDefaults()


def serve(runner: SlowRunner, *groups: list[GenerationRequest], progress_interval: float = PROGRESS_INTERVAL_S):
    """Streams each group of requests through a master backend of its own (its own session with the worker, as the
    master and a front-end process have) to a worker over `runner`, which runs one request at a time; a group
    starts once the one before has its first event, so that it queues behind all of that group. Returns, per
    group, per request, its events and the seconds to its first one, or the error it raised."""
    config = SchedulerConfig.for_runner(runner, max_num_seqs=1, max_num_batched_tokens=64)
    total = sum(len(group) for group in groups)
    loop = EngineLoop(LLMEngine(runner, scheduler_config=config), max_waiting=total)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    llm_worker_pb2_grpc.add_LlmWorkerServicer_to_server(
        LlmWorkerServicer(LoopRuntime(loop), progress_interval=progress_interval), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    async def generate(backend, request, first_event):
        started = time.monotonic()
        waited = None
        events = []
        try:
            async for event in backend.stream(request):
                if waited is None:
                    waited = time.monotonic() - started
                    first_event.set()
                events.append(event)
        except errors.ServingError as err:
            first_event.set()
            return err
        return events, waited

    async def run_group(channel, group, after, first_event):
        await after.wait()
        facts = llm_session.registration_facts(
            model_id="tiny", max_model_len=64, max_num_seqs=1, max_queue_size=total, vocab_size=97
        )
        registry = llm_worker_registry(channel, facts)
        backend = MasterLlmBackend(registry, TOKEN_TIMEOUT_S)
        return await asyncio.gather(*(generate(backend, request, first_event) for request in group))

    async def main():
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        starts = [asyncio.Event() for _ in range(len(groups) + 1)]
        starts[0].set()
        try:
            return await asyncio.wait_for(
                asyncio.gather(
                    *(run_group(channel, group, starts[i], starts[i + 1]) for i, group in enumerate(groups))
                ),
                DEADLINE_S,
            )
        finally:
            await channel.close()

    try:
        return asyncio.run(main())
    finally:
        runner.release.set()
        loop.close()
        server.stop(None)


def requests(count: int, first: int = 0) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            model="tiny",
            params={"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
            request_id=f"r-{i}",
            prompt_token_ids=[1 + i, 2, 3],
        )
        for i in range(first, first + count)
    ]


def test_requests_queued_far_longer_than_the_token_timeout_all_complete_while_the_engine_steps():
    """12 requests, then 4 more on another session, one at a time, 6 steps each of 0.03 s: the last 4 wait ~2.1 s,
    about 4 token timeouts, with not one event on their session but the worker's heartbeats."""
    front, behind = serve(SlowRunner(step_s=0.03), requests(12), requests(4, first=12))
    failures = [r for r in front + behind if isinstance(r, BaseException)]
    assert not failures
    for events, _ in front + behind:
        assert [type(e) for e in events] == [TokenEvent] * NEW_TOKENS + [FinalEvent]
        assert events[-1].finish_reason == "length"
    assert min(waited for _, waited in behind) > 3 * TOKEN_TIMEOUT_S


def test_without_the_workers_heartbeats_requests_waiting_on_a_quiet_session_would_fail():
    """The control: on a session of its own, a request queued behind another session's work is kept alive by the
    heartbeats alone; without them it fails after the timeout (as every queued request did before them)."""
    front, behind = serve(SlowRunner(step_s=0.03), requests(6), requests(2, first=6), progress_interval=DEADLINE_S)
    assert not [r for r in front if isinstance(r, BaseException)]
    assert [type(r) for r in behind] == [errors.WorkerUnavailable] * 2


def test_a_hung_runner_fails_its_requests_as_unavailable_after_the_token_timeout(monkeypatch):
    logged = []
    monkeypatch.setattr(llm_backend.log, "error", logged.append)
    started = time.monotonic()
    (results,) = serve(SlowRunner(hang=True), requests(3))
    elapsed = time.monotonic() - started
    assert [type(r) for r in results] == [errors.WorkerUnavailable] * 3
    assert {r.message for r in results} == {"Model tiny is not available: its worker made no progress for 0.5 s"}
    assert TOKEN_TIMEOUT_S <= elapsed < TOKEN_TIMEOUT_S + 5
    assert sorted(logged) == [
        f"generation r-{i} on worker pid 4242: the worker's engine made no progress for 0.5 s; aborting it"
        for i in range(3)
    ]
