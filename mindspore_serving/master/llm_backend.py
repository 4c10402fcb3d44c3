"""The master's LlmBackend: forwards generation requests to the LLM servable's workers.

Each worker gets one gRPC Session (llm_worker.proto) shared by every generation the master routes to it:
a `generate` command per request, an `abort` when its client goes away, and one batch of events per engine
step coming back, fanned out here to the per-request queues. When a worker dies its session breaks and every
generation on it fails with "worker stopped"; the next request opens a new session. /tokenize and /detokenize
are one unary call each to a worker (its tokenizer and chat template).

A generation fails as hung (503, "... made no progress for N s") only when its worker's engine shows no progress
for the token timeout: no batch at all on its session, the worker sending an empty one every second while its
engine steps and the session's requests wait (worker/llm/session_service.py). A request queued behind work that
progresses waits as long as it takes; a full queue refuses a request at once instead (the worker's Overloaded
error event, before any token: 429 / RESOURCE_EXHAUSTED).

A request with several choices (n / best_of) streams the events of all of them and ends after one Final per
choice (or at an Error); its prompt tokens count once in the metrics, its completion tokens summed over the
choices.
"""

import asyncio
import itertools
from collections.abc import AsyncIterator

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.ipc import llm_session
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.master.llm_types import (
    FinalEvent,
    GenerationEvent,
    GenerationRequest,
    ModelInfo,
    TokenEvent,
    Tokenized,
    TokenizeRequest,
)
from mindspore_serving.master.metrics import MasterMetrics
from mindspore_serving.master.worker_registry import WorkerRegistry
from mindspore_serving.proto import llm_worker_pb2 as pb
from mindspore_serving.proto import llm_worker_pb2_grpc
from mindspore_serving.spec.llm import GENERATE_METHOD, LLM_EXTENSION

_LOST = object()
_STALLED = object()


def stall_left(timeout: float, progressed_at: float, since: float, now: float) -> float | None:
    """Seconds before a generation waiting since `since` gives its worker up as hung, the worker's engine having
    last shown progress at `progressed_at` (the later of the two starts the count); <= 0: hung now; None: never
    (timeout 0)."""
    if not timeout:
        return None
    return max(progressed_at, since) + timeout - now


def _restarting(model: str) -> str:
    return f"Model {model} is not available: its worker is restarting"


class WorkerSession:
    """The master's Session with one worker; `open` and `close` run on the master's event loop."""

    def __init__(self, worker):
        self.worker = worker
        self.closed = False
        self._ids = itertools.count(1)
        self._queues: dict[int, asyncio.Queue] = {}
        self._call = llm_worker_pb2_grpc.LlmWorkerStub(worker.channel).Session()
        self._write_lock = asyncio.Lock()
        self._clock = asyncio.get_running_loop().time
        self.progressed_at = self._clock()
        """When the last batch came: the worker's engine progressed then (an empty batch is its heartbeat)."""
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self):
        reason = "its session ended"
        try:
            async for batch in self._call:
                self.progressed_at = self._clock()
                for stream in batch.streams:
                    events = self._queues.get(stream.stream_id)
                    if events is not None:
                        for event in stream.events:
                            events.put_nowait(event)
        except grpc.aio.AioRpcError as err:
            reason = f"{err.code().name} {err.details()}"
        except asyncio.CancelledError:
            reason = "the master is stopping"
        finally:
            self.closed = True
            if self._queues:
                log.warning(
                    f"LLM session with worker pid {self.worker.pid} ended ({reason}) with "
                    f"{len(self._queues)} generation(s) running"
                )
            for events in self._queues.values():
                events.put_nowait(_LOST)

    async def _write(self, command: pb.SessionCommand):
        async with self._write_lock:
            await self._call.write(command)

    async def open(self, request_id: str, params: SamplingParams, request: GenerationRequest) -> int:
        stream_id = next(self._ids)
        self._queues[stream_id] = asyncio.Queue()
        try:
            await self._write(
                llm_session.generate_command(
                    stream_id,
                    request_id,
                    params,
                    request.prompt,
                    request.messages,
                    explicit=request.params,
                    tools=request.tools,
                    template_kwargs=request.chat_template_kwargs,
                    prompt_token_ids=request.prompt_token_ids,
                )
            )
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            del self._queues[stream_id]
            self.closed = True
            raise
        return stream_id

    async def next_event(self, stream_id: int, timeout: float = 0.0, since: float = 0.0):
        """The next GenerateEvent of the stream; _LOST when the session broke; _STALLED when no batch came for
        `timeout` seconds (0: no limit), counted from the last batch or from `since`, whichever is later."""
        events = self._queues[stream_id]
        while events.empty():
            left = stall_left(timeout, self.progressed_at, since, self._clock())
            if left is not None and left <= 0:
                return _STALLED
            try:
                return await asyncio.wait_for(events.get(), left)
            except TimeoutError:
                pass  # a batch for other streams (or a heartbeat) may have come meanwhile: count again
        return events.get_nowait()

    def finish(self, stream_id: int, aborted: bool):
        """The consumer is done with the stream; an unfinished one is aborted in the worker."""
        self._queues.pop(stream_id, None)
        if aborted and not self.closed:
            asyncio.ensure_future(self._abort(stream_id))

    async def _abort(self, stream_id: int):
        try:
            await self._write(llm_session.abort_command(stream_id))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the session is gone: the worker aborts everything it ran

    def close(self):
        self.closed = True
        self._call.cancel()


DEFAULT_TOKEN_TIMEOUT = 60.0
"""Seconds a worker's engine may show no progress (no batch on its session) while it has generations before they
fail as hung; 0: no limit. A generation merely waiting for its turn never times out."""


class MasterLlmBackend:
    def __init__(
        self,
        registry: WorkerRegistry,
        token_timeout: float = DEFAULT_TOKEN_TIMEOUT,
        metrics: MasterMetrics | None = None,
    ):
        self.registry = registry
        self.metrics = metrics if metrics is not None else MasterMetrics()
        self.token_timeout = token_timeout
        self._ids = itertools.count(1)
        self._sessions: dict[tuple, WorkerSession] = {}  # (worker key, pid) -> its session
        self._known: set[str] = set()  # every LLM servable a worker has registered, live or not now

    def models(self) -> list[ModelInfo]:
        infos = {}
        for record in self.registry.all():
            data = llm_session.read_facts(record.extensions.get(LLM_EXTENSION))
            if data is not None and record.servable_name not in infos:
                infos[record.servable_name] = ModelInfo(
                    record.servable_name,
                    data["max_model_len"],
                    data["max_num_seqs"],
                    data["max_queue_size"],
                    data["vocab_size"],
                    data.get("device", "CPU"),
                    data.get("tool_call_parser"),
                )
        self._known.update(infos)
        return list(infos.values())

    def unavailable_models(self) -> dict[str, str]:
        live = {info.name for info in self.models()}
        return {name: _restarting(name) for name in sorted(self._known - live)}

    def _session(self, worker) -> WorkerSession:
        key = (worker.key, worker.pid)
        session = self._sessions.get(key)
        if session is None or session.closed:
            live = {(w.key, w.pid) for w in self.registry.all()}
            for old_key in [k for k, s in self._sessions.items() if k not in live or s.closed]:
                self._sessions.pop(old_key).close()
            session = self._sessions[key] = WorkerSession(worker)
        return session

    def _pick(self, model: str):
        """A live LLM worker of `model`, the least busy."""
        try:
            candidates = [
                w
                for w in self.registry.candidates(model, GENERATE_METHOD, 0)
                if llm_session.read_facts(w.extensions.get(LLM_EXTENSION)) is not None
            ]
        except errors.ServableUnavailable:
            if model in self._known:  # served, but its worker is gone for now: retry later
                raise errors.WorkerUnavailable(_restarting(model)) from None
            raise
        if not candidates:
            raise errors.ServableUnavailable(f"Model {model} is not a language model")
        self._known.add(model)
        return self.registry.pick(candidates)

    async def _unary(self, model: str, rpc: str, message):
        """One unary call (Tokenize, Detokenize) to a worker of `model`."""
        worker = self._pick(model)
        try:
            return await getattr(llm_worker_pb2_grpc.LlmWorkerStub(worker.channel), rpc)(
                message, timeout=self.token_timeout or None
            )
        except grpc.aio.AioRpcError as err:
            log.warning(f"LLM {rpc} on worker pid {worker.pid} failed: {err.code().name} {err.details()}")
            raise errors.WorkerUnavailable(
                f"Model {model} is not available: {rpc} failed on its worker ({err.code().name})"
            ) from None

    async def tokenize(self, request: TokenizeRequest) -> Tokenized:
        reply = await self._unary(request.model, "Tokenize", llm_session.tokenize_request(request))
        return llm_session.read_tokenize_reply(reply, request.return_token_strs)

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        reply = await self._unary(model, "Detokenize", llm_session.detokenize_request(token_ids))
        return llm_session.read_detokenize_reply(reply)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        worker = self._pick(request.model)
        params = SamplingParams.from_dict(request.params)  # a bad value fails here, before any worker sees it
        request_id = request.request_id or f"gen-{next(self._ids)}"

        def lost():
            what = worker.lost_reason or f"the worker (pid {worker.pid}) stopped while generating"
            return errors.WorkerUnavailable(f"Model {request.model} is not available: {what}")

        session = self._session(worker)
        worker.outstanding += 1
        stream_id: int | None = None
        done = False
        stats = self.metrics.llm_model(request.model)
        clock = asyncio.get_running_loop().time
        started = last = clock()
        first = True
        finish_reason = "error"
        num_finals = 0
        try:
            try:
                stream_id = await session.open(request_id, params, request)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
                log.warning(f"generation on worker pid {worker.pid} could not start: {err}")
                raise lost() from None
            while True:
                event = await session.next_event(stream_id, self.token_timeout, started)
                if event is _STALLED:
                    log.error(
                        f"generation {request_id} on worker pid {worker.pid}: the worker's engine made no progress "
                        f"for {self.token_timeout:g} s; aborting it"
                    )
                    raise errors.WorkerUnavailable(
                        f"Model {request.model} is not available: its worker made no progress for "
                        f"{self.token_timeout:g} s"
                    )
                if event is _LOST:
                    done = True
                    raise lost()
                done = event.WhichOneof("event") == "error"  # the worker ends every choice of a failed stream
                if done:
                    finish_reason = "error"
                decoded = llm_session.read_event(event)  # an error event raises its ServingError
                now = clock()
                if isinstance(decoded, FinalEvent):
                    num_finals += 1
                    done = num_finals >= params.num_choices
                    finish_reason = decoded.finish_reason
                    if num_finals == 1:
                        stats.prompt_tokens += decoded.prompt_tokens
                    stats.generation_tokens += decoded.completion_tokens
                elif isinstance(decoded, TokenEvent) and decoded.choice == 0:
                    (stats.ttft if first else stats.tpot).observe(now - last)
                    first, last = False, now
                yield decoded
                if done:
                    return
        finally:
            stats.finished[finish_reason if done else "abort"] += 1
            stats.e2e.observe(clock() - started)
            worker.outstanding -= 1
            if stream_id is not None:
                session.finish(stream_id, aborted=not done)
