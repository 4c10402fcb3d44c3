"""uvicorn's HTTP/1.1 protocol (httptools) with each response leaving in one send.

uvicorn writes a response's status line and headers when the app sends `http.response.start`, and the body at
`http.response.body`: two writes, so two send calls and two TCP segments for every small reply, each a wake-up of
the client. Here a connection's writes wait for the end of the event loop's current turn and leave together (the
app sends both messages in one turn), through the transport's `writelines` (one vectored send on uvloop).
"""
import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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
    """HttpToolsProtocol writing through a CorkedTransport (pass the class as uvicorn.Config(http=...))."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CorkedTransport(transport, self.loop))
