"""One request's run through the backend, shared by every protocol.

`Generation.start()` opens the backend's stream and waits for its first token or final event (a scored
prompt, PromptEvent, comes before them and is kept in `prompt_scores`), so errors the backend raises up
front (bad parameters, overload, unknown model) are known before an HTTP status is chosen. `outputs()` then
yields the TokenEvents and FinalEvents of every choice (a request with n or best_of has several, each
ending with its own FinalEvent) and keeps them; `events()` yields the TokenEvents only. `close()` closes
the backend's iterator, which aborts the request in the engine when the client went away, and logs the
request's timing.
"""

import asyncio
import math
import time
from collections.abc import AsyncIterator

import anyio

from mindspore_serving import log
from mindspore_serving.common.errors import GenerationFailed, IncompleteGeneration, message_of
from mindspore_serving.llm.request import inter_token_latency
from mindspore_serving.master.llm_types import (
    FinalEvent,
    GenerationRequest,
    LlmBackend,
    ModelInfo,
    PromptEvent,
    TokenEvent,
)

_CLOSE_TIMEOUT_S = 5.0
"""How long closing the backend's iterator may take (it normally only cancels a call)."""


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"


_FAILED = ("error", "abort")


def _check(final: FinalEvent, request_id: str) -> None:
    """Raises GenerationFailed for a choice the engine finished with "error" or "abort"."""
    if final.finish_reason == "error":
        raise GenerationFailed(f"the model failed while generating request {request_id}")
    if final.finish_reason == "abort":
        raise GenerationFailed(f"request {request_id} was aborted before it finished")


def finite(value: float, default: float | None = None) -> float | None:
    """`value` as a JSON-safe float (log-probabilities can be -inf)."""
    value = float(value)
    return value if math.isfinite(value) else default


class Generation:
    def __init__(
        self,
        backend: LlmBackend,
        request: GenerationRequest,
        model: ModelInfo,
        protocol: str,
        arrival: float | None = None,
    ):
        self.backend = backend
        self.request = request
        self.model = model
        self.protocol = protocol
        self.arrival = time.perf_counter() if arrival is None else arrival
        self.created = int(time.time())
        self.submitted: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.ended: float | None = None
        self.tokens: list[TokenEvent] = []
        """Every choice's tokens, in the order they came."""
        self.finals: dict[int, FinalEvent] = {}
        """The FinalEvent of each choice that finished, by choice index."""
        self.final: FinalEvent | None = None
        """The first FinalEvent (the only one of a request with one choice)."""
        self.prompt_scores: PromptEvent | None = None
        self.error: BaseException | None = None
        self._events = None
        self._first = None
        self._closed = False

    @property
    def request_id(self) -> str:
        return self.request.request_id or ""

    @property
    def max_new_tokens(self) -> int | None:
        value = self.request.params.get("max_new_tokens")
        return value if isinstance(value, int) else None

    @property
    def num_choices(self) -> int:
        """Choices the engine generates (best_of, else n): the stream ends after that many FinalEvents."""
        params = self.request.params
        return int(params.get("best_of") or params.get("n") or 1)

    @property
    def done(self) -> bool:
        return len(self.finals) >= self.num_choices

    def choice_tokens(self, choice: int) -> list[TokenEvent]:
        return [t for t in self.tokens if t.choice == choice]

    @property
    def prompt_tokens(self) -> int:
        return self.final.prompt_tokens if self.final is not None else 0

    @property
    def completion_tokens(self) -> int:
        """Tokens generated for all choices (those best_of dropped included)."""
        if not self.finals:
            return len(self.tokens)
        return sum(f.completion_tokens for f in self.finals.values())

    async def start(self) -> None:
        """Sends the request and waits for its first event; raises what the backend raises."""
        self.submitted = time.perf_counter()
        try:
            self._events = self.backend.stream(self.request).__aiter__()
            first = await self._next()
            while isinstance(first, PromptEvent):
                self.prompt_scores = first
                first = await self._next()
            if first is None:
                raise IncompleteGeneration("the generation stream ended before its first event")
            if isinstance(first, FinalEvent):
                _check(first, self.request_id)  # a request that failed without a token fails before any reply
            self._first = first
        except Exception as exc:
            self.error = exc
            raise

    async def _next(self):
        try:
            return await self._events.__anext__()
        except StopAsyncIteration:
            return None

    async def outputs(self) -> AsyncIterator[TokenEvent | FinalEvent]:
        """Every choice's TokenEvents and FinalEvents as they come, until each choice has its FinalEvent
        (`finals`, `final`). Raises GenerationFailed when the engine finished a choice with "error" or
        "abort", IncompleteGeneration when the stream ends before every FinalEvent came."""
        try:
            event, self._first = self._first, None
            while event is not None:
                if isinstance(event, FinalEvent):
                    self._finish(event)
                    yield event
                    if self.done:
                        return
                elif isinstance(event, PromptEvent):
                    self.prompt_scores = event
                else:
                    now = time.perf_counter()
                    if self.first_token_at is None:
                        self.first_token_at = now
                    self.last_token_at = now
                    self.tokens.append(event)
                    yield event
                event = await self._next()
            raise IncompleteGeneration("the generation stream ended before its final event")
        except Exception as exc:
            self.error = exc
            raise

    async def events(self) -> AsyncIterator[TokenEvent]:
        """The TokenEvents of `outputs()`."""
        async for event in self.outputs():
            if isinstance(event, TokenEvent):
                yield event

    def _finish(self, final: FinalEvent) -> None:
        if self.final is None:
            self.final = final
        self.finals[final.choice] = final
        if self.done or final.finish_reason in _FAILED:
            self.ended = time.perf_counter()
        _check(final, self.request_id)

    async def collect(self) -> FinalEvent:
        async for _ in self.outputs():
            pass
        return self.final

    async def close(self) -> None:
        """Closes the backend's iterator (aborting an unfinished request) and logs the outcome. Idempotent."""
        if self._closed:
            return
        self._closed = True
        events, self._events = self._events, None
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT_S, shield=True):
                try:
                    await aclose()
                except Exception:  # a failing close must not hide the request's own outcome
                    log.exception(f"closing the generation stream of request {self.request_id} failed")
        if self.ended is None:
            self.ended = time.perf_counter()
        log.info(self.summary())

    def outcome(self) -> str:
        if self.error is not None:
            return f"failed ({message_of(self.error)})"
        if self.final is not None and self.done:
            return f"finished ({self.final.finish_reason})"
        return f"cancelled after {len(self.tokens)} tokens (client went away)"

    def timings(self) -> dict:
        """Seconds, measured here (the engine's own figures are in `final.timing`)."""
        ttft = None if self.first_token_at is None else self.first_token_at - self.arrival
        itl = inter_token_latency(self.first_token_at, self.last_token_at, len(self.tokens))
        e2e = None if self.ended is None else self.ended - self.arrival
        queue = self.final.timing.queue_time if self.final is not None and self.final.timing is not None else None
        return {"queue_time": queue, "time_to_first_token": ttft, "inter_token_latency": itl, "e2e_latency": e2e}

    def summary(self) -> str:
        t = self.timings()
        prompt_tokens = self.final.prompt_tokens if self.final is not None else "-"
        completion_tokens = self.completion_tokens
        text = (
            f"LLM request {self.request_id} ({self.protocol}, model {self.request.model}) {self.outcome()}: "
            f"prompt_tokens={prompt_tokens} completion_tokens={completion_tokens} "
            f"queue={_ms(t['queue_time'])} ttft={_ms(t['time_to_first_token'])} "
            f"itl={_ms(t['inter_token_latency'])} e2e={_ms(t['e2e_latency'])}"
        )
        engine = self.final.timing if self.final is not None else None
        if engine is not None:
            text += (
                f" (engine: ttft={_ms(engine.time_to_first_token)} itl={_ms(engine.inter_token_latency)} "
                f"e2e={_ms(engine.e2e_latency)})"
            )
        return text

    def timing_headers(self, compute_characters: int) -> dict:
        """TGI's per-request headers: x-compute-time in seconds, the other times in whole milliseconds."""
        final = self.final
        total = (self.ended or time.perf_counter()) - self.arrival
        validation = (self.submitted or self.arrival) - self.arrival
        queue = final.timing.queue_time if final is not None and final.timing is not None else 0.0
        inference = max(total - validation - queue, 0.0)
        generated = self.completion_tokens
        per_token = inference / generated if generated else 0.0
        return {
            "x-compute-type": self.model.device.lower(),
            "x-compute-time": f"{total:.6f}",
            "x-compute-characters": str(compute_characters),
            "x-total-time": str(int(total * 1000)),
            "x-validation-time": str(int(validation * 1000)),
            "x-queue-time": str(int(queue * 1000)),
            "x-inference-time": str(int(inference * 1000)),
            "x-time-per-token": str(int(per_token * 1000)),
            "x-prompt-tokens": str(final.prompt_tokens if final is not None else 0),
            "x-generated-tokens": str(generated),
        }


class GenerationBatch:
    """Several prompts of one request (OpenAI completions' prompt batches), each its own Generation, answered as
    one: they start together, so the engine runs them at once, and a failure of any fails the request (closing
    the others aborts them). Streamed, they are read one after the other (the engine still generates them at
    once; the events wait in the backend)."""

    def __init__(self, items: list[Generation]):
        self.items = items

    @property
    def request_id(self) -> str:
        return self.items[0].request_id

    @property
    def created(self) -> int:
        return self.items[0].created

    @property
    def model(self) -> ModelInfo:
        return self.items[0].model

    async def start(self) -> None:
        await _all(g.start() for g in self.items)

    async def collect(self) -> None:
        await _all(g.collect() for g in self.items)

    async def close(self) -> None:
        for generation in self.items:
            await generation.close()

    def timing_headers(self, compute_characters: int) -> dict:
        """The headers of the prompt that ended last, with the tokens of all."""
        last = max(self.items, key=lambda g: g.ended or 0.0)
        headers = last.timing_headers(compute_characters)
        headers["x-prompt-tokens"] = str(sum(g.prompt_tokens for g in self.items))
        headers["x-generated-tokens"] = str(sum(g.completion_tokens for g in self.items))
        return headers


async def _all(awaitables) -> None:
    """Runs the awaitables at once and waits for all of them; then raises the first one's error, if any."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
