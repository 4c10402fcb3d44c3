"""uvicorn's HTTP/1.1 protocol (httptools) with each response leaving in one send, and read limits.

uvicorn writes a response's status line and headers when the app sends `http.response.start`, and the body at
`http.response.body`: two writes, so two send calls and two TCP segments for every small reply, each a wake-up of
the client. Here a connection's writes wait for the end of the event loop's current turn and leave together (the
app sends both messages in one turn), through the transport's `writelines` (one vectored send on uvloop).

uvicorn has no read timeouts: a client that opens connections and sends its request head a byte at a time
(slowloris), or stops in the middle of a body, holds them for ever. Here a connection is closed when its request
head has not arrived whole within `read_timeout` seconds (counted from the connection's start or the request's
first byte; between requests uvicorn's keep-alive timeout applies), or when its body stalls that long (no byte
for `read_timeout` seconds while the server is ready to read it). And beyond `max_connections` open connections a
new request is refused in its protocol's shape (uvicorn's own limit answers a plain-text 503).
"""

import asyncio
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mindspore_serving import log


class CorkedTransport:
    """Wraps a transport: write() gathers the bytes of one event-loop turn; everything else goes straight through
    (close and write_eof send what is gathered first)."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._pending = []

    def write(self, data) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            if not self._transport.is_closing():  # a connection closed meanwhile takes nothing more, as uvicorn's
                self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name):
        return getattr(self._transport, name)


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol writing through a CorkedTransport (pass the class as uvicorn.Config(http=...)), with
    the read timeout and the connection limit of the class made by `limited_protocol` (none here)."""

    read_timeout: float | None = None
    max_connections: int | None = None
    refuse_app = None  # the ASGI app that answers a request beyond max_connections
    # one timer per connection, created only when none is pending: arming a phase moves the deadline (a float),
    # and the timer, when it fires early, waits for the deadline it finds
    _read_timer: asyncio.TimerHandle | None = None
    _read_deadline: float | None = None
    _read_what = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CorkedTransport(transport, self.loop))
        self._arm("request head")

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm("request head")

    def on_headers_complete(self) -> None:
        self._arm("request body")  # disarmed at once by on_message_complete when there is none
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            app, self.app = self.app, self.refuse_app
            try:
                super().on_headers_complete()
            finally:
                self.app = app
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._arm("request body")  # also for the body of a request already answered, which uvicorn drops
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, what: str) -> None:
        if self.read_timeout is None:
            return
        self._read_deadline = self.loop.time() + self.read_timeout
        self._read_what = what
        if self._read_timer is None:
            self._read_timer = self.loop.call_at(self._read_deadline, self._read_timed_out)

    def _disarm(self) -> None:
        self._read_deadline = None  # a pending timer finds no deadline and ends

    def _read_timed_out(self) -> None:
        self._read_timer = None
        deadline, what = self._read_deadline, self._read_what
        if deadline is None or self.transport.is_closing():
            return
        if deadline > self.loop.time():  # re-armed since: wait for the new deadline
            self._read_timer = self.loop.call_at(deadline, self._read_timed_out)
            return
        if self.flow.read_paused:  # the server, not the client, is behind: the app has not taken the body yet
            self._arm(what)
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.warning(
            f"RESTful server: closing the connection of {client}: its {what} stalled for "
            f"{self.read_timeout:g} s (--read_timeout)"
        )
        self.transport.close()


def limited_protocol(read_timeout: float, max_connections: int, refuse_app: Callable) -> type:
    """A CorkedHttpToolsProtocol class with these limits, for one server's uvicorn.Config(http=...)."""
    return type(
        "LimitedHttpToolsProtocol",
        (CorkedHttpToolsProtocol,),
        {"read_timeout": read_timeout, "max_connections": max_connections, "refuse_app": refuse_app},
    )
