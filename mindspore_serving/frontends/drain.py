"""Stopping a front end in one drain; runs in the master's loop.

A front end's `stop(grace)` goes through three states of its `Drain`:

    accepting  new requests are served
    draining   new requests are refused at once (HTTP 503 in the protocol's shape, gRPC UNAVAILABLE);
               the requests in flight go on, for at most `grace` seconds
    cut        the grace period is over: every guarded wait (a worker's Predict, an LLM generation's next
               event) raises `ServerStopping`, which each protocol answers as it answers any error (classic
               `{"error_msg"}`, OpenAI/TGI JSON or a stream's error event, gRPC UNAVAILABLE)

The master stops every front end at the same moment with the same grace period (master.py `Master.stop`),
so one deadline covers all of them. Front ends guard only waits: a cut never interrupts the writing of an
answer, and a request that ignores the cut is ended by its server `CUT_ANSWER_S` seconds later.
"""

import asyncio
import collections
import inspect
from collections import Counter
from collections.abc import AsyncIterator

from mindspore_serving.common import errors
from mindspore_serving.frontends.errors import Protocol, http_error
from mindspore_serving.master.llm_types import GenerationEvent, GenerationRequest, LlmBackend

CUT_ANSWER_S = 2.0
"""How long the requests cut at the end of the grace period have to write their error answer."""

REFUSED = "Serving Error: the server is stopping and accepts no new requests"


def cut_message(grace: float) -> str:
    return f"Serving Error: the server stopped before this request finished (its grace period of {grace:g} s ended)"


def describe_kinds(kinds: Counter) -> str:
    """`{"gRPC Predict add.add_common": 2}` -> "2 gRPC Predict add.add_common"."""
    return ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))


class Drain:
    """The requests in flight of one front end, by kind, and the cut that ends them."""

    def __init__(self):
        self.accepting = True
        self._running: Counter[str] = collections.Counter()
        self._idle: asyncio.Event | None = None
        self._guarded: set[asyncio.Task] = set()
        self._cut_tasks: set[asyncio.Task] = set()
        self._cut_error: errors.ServerStopping | None = None

    # NOTE: enter/leave rather than a context manager: they run twice per request on the hot path.
    def enter(self, kind: str) -> None:
        self._running[kind] += 1

    def leave(self, kind: str) -> None:
        running = self._running
        running[kind] -= 1
        if running[kind] <= 0:
            del running[kind]
            if not running and self._idle is not None:
                self._idle.set()

    def running(self) -> Counter:
        return collections.Counter(self._running)

    async def wait_idle(self, timeout: float) -> bool:
        """True once no request is in flight; False when `timeout` seconds pass first."""
        if not self._running:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), max(timeout, 0.0))
        except TimeoutError:
            return not self._running
        return True

    async def finish(self, grace: float) -> Counter:
        """Stops accepting, waits up to `grace` seconds for the requests in flight, then cuts the rest and gives
        them CUT_ANSWER_S seconds to answer. Returns the requests cut, by kind (empty when all finished)."""
        self.accepting = False
        if await self.wait_idle(grace):
            return collections.Counter()
        cut = self.cut(cut_message(grace))
        await self.wait_idle(CUT_ANSWER_S)
        return cut

    def cut(self, message: str) -> Counter:
        """Ends every guarded wait with ServerStopping(message); returns the requests still running, by kind."""
        self.accepting = False
        self._cut_error = errors.ServerStopping(message)
        for task in self._guarded:
            self._cut_tasks.add(task)
            task.cancel(errors.STOP_CUT)
        return self.running()

    async def guard(self, awaitable):
        """`await awaitable`, unless the cut comes first: then ServerStopping."""
        if self._cut_error is not None:
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            raise errors.ServerStopping(self._cut_error.message)
        task = asyncio.current_task()
        self._guarded.add(task)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if task not in self._cut_tasks:
                raise  # the client went away, or the task is cancelled for another reason
            self._cut_tasks.discard(task)
            task.uncancel()
            raise errors.ServerStopping(self._cut_error.message) from None
        finally:
            self._guarded.discard(task)

    def refusal(self) -> errors.ServerStopping:
        return errors.ServerStopping(REFUSED)


def refusal_reply(protocol: Protocol, error: errors.ServerStopping):
    """(HTTP status, JSON body) refusing a request while stopping: the protocol's error shape, always HTTP 503
    (the classic protocol answers errors with 200, but a refusal must tell load balancers to go elsewhere)."""
    _, body = http_error(protocol, error)
    return 503, body


class GuardedDispatcher:
    """The master's dispatcher, whose `predict` gives way to the drain's cut."""

    def __init__(self, dispatcher, drain: Drain):
        self._dispatcher = dispatcher
        self._drain = drain

    async def predict(self, spec, instances, timeout=None):
        call = (
            self._dispatcher.predict(spec, instances)
            if timeout is None
            else self._dispatcher.predict(spec, instances, timeout=timeout)
        )
        return await self._drain.guard(call)

    def __getattr__(self, name):
        return getattr(self._dispatcher, name)


class GuardedBackend:
    """An LlmBackend whose streams give way to the drain's cut (the backend's own stream is closed then, which
    aborts the generation)."""

    def __init__(self, backend: LlmBackend, drain: Drain):
        self._backend = backend
        self._drain = drain

    def models(self):
        return self._backend.models()

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        events = self._backend.stream(request).__aiter__()
        try:
            while True:
                try:
                    event = await self._drain.guard(events.__anext__())
                except StopAsyncIteration:
                    return
                yield event
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    def __getattr__(self, name):
        return getattr(self._backend, name)


class DrainingFrontend:
    """A front end that stops in two steps, `drain_requests(grace)` then `close()` (the master drains every front
    end before it closes any, so that the probes answer during the whole drain)."""

    async def stop(self, grace: float) -> "collections.Counter":
        """`drain_requests(grace)`, then `close()`; returns the requests cut, by kind."""
        try:
            return await self.drain_requests(grace)
        finally:
            await self.close()
