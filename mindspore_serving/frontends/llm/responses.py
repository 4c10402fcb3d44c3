"""ASGI responses that run a Generation while watching the client's connection.

Both kinds listen for `http.disconnect` while they work (whatever the server's ASGI version), and cancel
the work when it comes: the Generation is then closed, which closes the backend's iterator and so aborts
the request in the engine. Both wait for the backend's first event before choosing the HTTP status, so an
error raised up front gets the protocol's status and JSON body; an error after the stream started becomes
one error event (`error_chunk`), never a silent close.
"""

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mindspore_serving import log
from mindspore_serving.common.errors import Kind, kind_of
from mindspore_serving.frontends.errors import Protocol, http_error, http_error_headers
from mindspore_serving.frontends.llm import sse
from mindspore_serving.frontends.llm.generation import Generation

Headers = dict[str, str]


def _raw_headers(headers: Headers, media_type: str):
    items = [(b"content-type", media_type.encode())]
    items += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return items


async def send_json(send: Send, status: int, payload, headers: Headers | None = None) -> None:
    body = sse.dumps(payload)
    raw = _raw_headers(headers or {}, sse.JSON_MEDIA_TYPE) + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def log_failure(protocol: Protocol, exc: BaseException) -> None:
    kind = kind_of(exc)
    if kind is Kind.INTERNAL:
        log.error(f"LLM {protocol.value} request failed with an unexpected error: {exc!r}", exc_info=exc)
    elif kind in (Kind.VALIDATION, Kind.NOT_FOUND):
        log.info(f"LLM {protocol.value} request refused: {exc!r}")
    else:
        log.warning(f"LLM {protocol.value} request failed: {exc!r}")


def error_response(protocol: Protocol, exc: BaseException) -> Response:
    """A plain reply for an error found before any generation started."""
    log_failure(protocol, exc)
    status, payload = http_error(protocol, exc)
    return Response(
        sse.dumps(payload), status_code=status, media_type=sse.JSON_MEDIA_TYPE, headers=http_error_headers(exc)
    )


class WatchedResponse(Response):
    """Runs `produce(send)` and cancels it when the client disconnects first."""

    def __init__(self, produce: Callable[[Send], Awaitable[None]]):  # pylint: disable=super-init-not-called
        self.produce = produce
        self.status_code = 200
        self.background = None
        self.init_headers({})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def run():
                    try:
                        await self.produce(send)
                    finally:
                        group.cancel_scope.cancel()

                group.start_soon(run)
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()
        except BaseExceptionGroup as group_error:  # one task failed: raise its own error, as a plain call would
            if len(group_error.exceptions) == 1:
                raise group_error.exceptions[0] from None
            raise
        if self.background is not None:
            await self.background()


def json_reply(
    generation: Generation, protocol: Protocol, build: Callable[[Generation], tuple[object, Headers]]
) -> Response:
    """Runs the generation to its end, then answers `build(generation)` -> (JSON payload, headers)."""

    async def produce(send: Send) -> None:
        try:
            try:
                await generation.start()
                await generation.collect()
                payload, headers = build(generation)
            except Exception as exc:  # the protocol's error reply, whatever failed
                log_failure(protocol, exc)
                status, payload = http_error(protocol, exc)
                await send_json(send, status, payload, http_error_headers(exc))
                return
        finally:
            await generation.close()
        await send_json(send, 200, payload, headers)

    return WatchedResponse(produce)


def stream_reply(
    generation: Generation,
    protocol: Protocol,
    chunks: Callable[[], AsyncIterator[bytes]],
    error_chunk: Callable[[BaseException], bytes],
    headers: Headers | None = None,
    media_type: str = sse.SSE_MEDIA_TYPE,
    keep_alive_s: float = 0.0,
) -> Response:
    """Streams `chunks()` (built from `generation.events()`); a keep-alive comment goes out every
    `keep_alive_s` seconds while the stream is open (0: none)."""

    async def produce(send: Send) -> None:
        try:
            try:
                await generation.start()
            except Exception as exc:
                log_failure(protocol, exc)
                status, payload = http_error(protocol, exc)
                await send_json(send, status, payload, http_error_headers(exc))
                return
            raw = _raw_headers({**sse.SSE_HEADERS, **(headers or {})}, media_type)
            await send({"type": "http.response.start", "status": 200, "headers": raw})
            lock = anyio.Lock()

            async def write(chunk: bytes) -> None:
                async with lock:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})

            # the keep-alive task has a cancel scope of its own, ended when the body is written: cancelling the
            # group's scope would also cancel this task, which a drain's cut may just have cancelled and resumed
            keep_alive = anyio.CancelScope()
            async with anyio.create_task_group() as group:
                if keep_alive_s > 0:
                    group.start_soon(_keep_alive, write, keep_alive_s, keep_alive)
                try:
                    async with contextlib.aclosing(chunks()) as body:
                        async for chunk in body:
                            await write(chunk)
                except Exception as exc:  # mid-stream: the error becomes the stream's last event
                    log_failure(protocol, exc)
                    await write(error_chunk(exc))
                keep_alive.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await generation.close()

    return WatchedResponse(produce)


async def _keep_alive(write: Callable[[bytes], Awaitable[None]], interval_s: float, scope: anyio.CancelScope) -> None:
    with scope:
        while True:
            await anyio.sleep(interval_s)
            await write(sse.KEEP_ALIVE)


def guarded(protocol: Protocol):
    """Decorates an endpoint: any exception it raises becomes `protocol`'s error reply."""

    def wrap(endpoint):
        @functools.wraps(endpoint)
        async def guarded_endpoint(*args, **kwargs):
            try:
                return await endpoint(*args, **kwargs)
            except Exception as exc:
                return error_response(protocol, exc)

        return guarded_endpoint

    return wrap
