"""One HTTP/2 connection of the gRPC server: frames in, calls run as tasks on the event loop, replies out.

Writes of one event-loop turn leave together (one `writelines`), so the HEADERS, DATA and trailers of a reply,
and the replies of calls finishing in the same turn, share a send. Inbound flow control keeps windows wide (a
call's body is read whole anyway, bounded by the message limit); outbound flow control follows the peer's
windows, a stream's DATA waiting for its WINDOW_UPDATE (a streaming handler waits with it).

What a client may hold of a connection is bounded before its bodies arrive:
- a call is admitted or refused when its HEADERS arrive (method, API key, calls at once, the connection limit):
  a refused call is answered at once (trailers-only) and its body dropped unread, its bytes given back to the
  connection's window;
- a message whose 5-byte prefix declares more than the message limit is refused from the prefix;
- the request bodies a connection holds, not yet handed to their calls, stay under the server's
  `max_buffered_bytes`: beyond it the connection's window is withheld, and when the client can send no more the
  newest bodies are refused until the rest fit (so a peer ignoring the windows holds no more);
- one timer per connection closes it when its first call's HEADERS have not come within `read_timeout`, when a
  body stalls that long (a call running, waiting on the server, is not stalled), or when it has had no stream
  open for `idle_timeout`.
"""

import asyncio
import collections

import grpc
import hpack

from mindspore_serving import log
from mindspore_serving.frontends.h2grpc import frames as f
from mindspore_serving.frontends.h2grpc import wire
from mindspore_serving.frontends.h2grpc.context import ServicerContext

STREAM_WINDOW = 1 << 20  # what a client may send on one stream before we acknowledge it
CONNECTION_WINDOW = 16 << 20  # ... and on the whole connection
MAX_HEADER_LIST = 16 << 10  # request header fields, decoded
MAX_HEADER_BLOCK = 64 << 10  # a request's header block, encoded (HEADERS and CONTINUATION frames)
LINGER_S = 1.0  # a failed connection reads and drops what the peer sends, at most this long
CACHED_BLOCKS = 32  # header blocks remembered per connection, with their fields
UNEXPECTED = "Unexpected error in RPC handling"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"  # still answered on a connection beyond the limit: a full server is live


def _int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with `prefix_bits` bits in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(fields) -> bytes:
    """Header fields as literals without indexing (no Huffman): our encoder keeps no dynamic table, so the
    peer's SETTINGS_HEADER_TABLE_SIZE never matters. `:status: 200` is the static table's index 8."""
    out = []
    for name, value in fields:
        if name == b":status" and value == b"200":
            out.append(b"\x88")
            continue
        out.append(b"\x00" + _int(len(name), 7) + name + _int(len(value), 7) + value)
    return b"".join(out)


RESPONSE_BLOCK = header_block(wire.RESPONSE_HEADERS)


class Stream:
    __slots__ = (
        "id",
        "headers",
        "body",
        "receiving",
        "unacked",
        "send_window",
        "outbox",
        "trailers",
        "task",
        "refused",
        "writable",
        "answered",
        "handler",
        "metadata",
        "timeout",
        "last_read",
    )

    def __init__(self, stream_id: int, headers, send_window: int, now: float = 0.0):
        self.id = stream_id
        self.headers = headers
        self.body: list[bytes] = []
        self.receiving = 0  # bytes of body held (counted in the connection's `buffered`)
        self.unacked = 0  # bytes received and not yet given back with WINDOW_UPDATE
        self.send_window = send_window
        self.outbox: collections.deque[bytes] = collections.deque()  # DATA payloads waiting for window
        self.trailers: bytes | None = None  # the closing header block, after the outbox
        self.task: asyncio.Task | None = None
        self.refused = False  # answered already (an error before the handler)
        self.writable: asyncio.Event | None = None  # a streaming handler waiting for window
        self.answered = False  # response headers sent
        self.handler = None  # the method handler, metadata and grpc-timeout of an admitted call
        self.metadata: tuple = ()
        self.timeout: float | None = None
        self.last_read = now  # when its HEADERS or its last DATA arrived (loop time)


class Connection(asyncio.Protocol):
    def __init__(self, server, loop: asyncio.AbstractEventLoop | None = None):
        self.server = server
        self.loop = loop or asyncio.get_event_loop()
        self.transport = None
        self.peer = "unknown"
        self.buffer = b""
        self.preface = False
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.blocks: dict[bytes, tuple] = {}  # block -> its fields, for blocks that leave the table as it is
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0  # 0: no call's HEADERS yet
        self.send_window = f.DEFAULT_WINDOW
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.unacked = 0  # bytes of DATA received and not yet given back to the connection's window
        self.buffered = 0  # bytes of request bodies held, not yet handed to their calls
        self.continuing = None  # (stream id, flags, [fragments], size) while a header block spans frames
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.closed = False
        self.going_away = False
        self.over_limit = False  # opened beyond the server's max_connections: its calls are refused
        self.now = 0.0  # loop time of the read being handled
        self.idle_since = 0.0  # loop time since which no stream is open
        self.opened = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # ---- transport ----
    def connection_made(self, transport):
        self.transport = transport
        self.peer = _peer(transport)
        server = self.server
        self.over_limit = len(server.connections) >= server.max_connections
        if self.over_limit:
            server.note_over_limit()
        server.connections.add(self)
        self.out.append(
            f.settings(
                [
                    (f.MAX_CONCURRENT_STREAMS, server.max_streams_per_connection),
                    (f.INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                    (f.MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
                ]
            )
        )
        self.out.append(f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW))
        self._flush()
        self.opened = self.idle_since = self.now = self.loop.time()
        if server.timer_period:
            self.timer = self.loop.call_at(self.opened + server.timer_period, self._timed)

    def connection_lost(self, exc):
        self.closed = True
        self.server.connection_closed(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()

    def _write(self, data: bytes):
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self):
        self.flush_scheduled = False
        if self.out and not self.closed:
            out, self.out = self.out, []
            self.transport.writelines(out)

    def data_received(self, data: bytes):
        if self.closed:
            return  # a connection failed: lingering until the peer closes
        self.now = self.loop.time()
        try:
            self._receive(data)
        except f.ConnectionError_ as err:
            self._fail(err.code, str(err))
        except (hpack.HPACKError, UnicodeError) as err:
            self._fail(f.COMPRESSION_ERROR, f"header block: {err}")
        if self.out:  # the answers of this read leave in one send
            self._flush()

    def _receive(self, data: bytes):
        buffer = self.buffer + data if self.buffer else data
        if not self.preface:
            if len(buffer) < len(f.PREFACE):
                if not f.PREFACE.startswith(buffer):
                    raise f.ConnectionError_(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self.buffer = buffer
                return
            if not buffer.startswith(f.PREFACE):
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            buffer = buffer[len(f.PREFACE) :]
            self.preface = True
            if f.first_frame_is_settings(buffer) is False:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "the first frame is not SETTINGS")
        frames, self.buffer = f.cut(buffer, f.DEFAULT_MAX_FRAME)
        for kind, flags, stream_id, payload in frames:
            if self.closed:
                return
            self._frame(kind, flags, stream_id, payload)

    def _fail(self, code: int, why: str, warn: bool = True):
        """GOAWAY(code), then the connection is closed (after a linger that reads and drops what the peer sends)."""
        if warn:
            log.warning(f"gRPC server: closing the HTTP/2 connection of {self.peer}: {why}")
        self.out.append(f.goaway(self.last_stream_id, code, why.encode()[:256]))
        self._flush()
        self.closed = True
        if self.transport.can_write_eof():
            # closed with bytes of the peer unread, the socket would be reset, and the GOAWAY could be lost on the
            # way: what the peer still sends is read and dropped until it closes, or for LINGER_S
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    # ---- frames ----
    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes):
        if self.continuing is not None and kind != f.CONTINUATION:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "a header block interrupted")
        if kind == f.DATA:
            self._data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            if stream_id == 0:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "HEADERS on stream 0")
            fragment = f.unpad(flags, payload, priority=True)
            if flags & f.END_HEADERS:
                self._headers(stream_id, flags, fragment)
            else:
                self.continuing = (stream_id, flags, [fragment], len(fragment))
        elif kind == f.CONTINUATION:
            if self.continuing is None or self.continuing[0] != stream_id:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "CONTINUATION out of place")
            first_id, first_flags, fragments, size = self.continuing
            size += len(payload)
            if size > MAX_HEADER_BLOCK:
                raise f.ConnectionError_(f.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
            fragments.append(payload)
            self.continuing = (first_id, first_flags, fragments, size)
            if flags & f.END_HEADERS:
                self.continuing = None
                self._headers(first_id, first_flags, b"".join(fragments))
        elif kind == f.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(stream_id, f.u32(payload) & 0x7FFFFFFF)
        elif kind == f.PING:
            if len(payload) != 8 or stream_id:
                raise f.ConnectionError_(f.FRAME_SIZE_ERROR, "a PING must be 8 bytes on stream 0")
            if not flags & f.ACK:
                self.out.append(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                self._cancel(stream)
                self._release(stream)
                self._finish(stream)
        elif kind == f.GOAWAY:
            self.going_away = True
        elif kind == f.PUSH_PROMISE:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # PRIORITY and unknown frame types are ignored

    def _settings(self, flags: int, stream_id: int, payload: bytes):
        if stream_id:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            return
        for key, value in f.parse_settings(payload):
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.ConnectionError_(f.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= (1 << 24) - 1:
                    raise f.ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
        self.out.append(f.frame(f.SETTINGS, f.ACK, 0))
        self._send_waiting()

    def _window_update(self, stream_id: int, increment: int):
        if increment == 0:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        if stream_id == 0:
            self.send_window += increment
            self._send_waiting()
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.send_window += increment
            self._send(stream)

    def _headers(self, stream_id: int, flags: int, block: bytes):
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers of a request body
            self._decode(block)
            if flags & f.END_STREAM and stream.task is None:
                self._request_complete(stream)
            return
        headers = self._decode(block)  # always decoded: the decoder's table must follow
        if not stream_id % 2:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, f"stream id {stream_id} is not a client's")
        if stream_id <= self.last_stream_id:
            return  # a stream that ended or was reset already
        self.last_stream_id = stream_id
        if self.going_away or self.server.stopping:
            self.out.append(f.rst_stream(stream_id, f.REFUSED_STREAM))
            return
        if len(self.streams) >= self.server.max_streams_per_connection:
            self.out.append(f.rst_stream(stream_id, f.REFUSED_STREAM))
            return
        stream = Stream(stream_id, headers, self.peer_initial_window, self.now)
        self.streams[stream_id] = stream
        try:
            self._admit(stream)
        except wire.CallError as err:  # answered now: its body, if one comes, is dropped unread
            self._refuse(stream, err, rest_unwanted=not flags & f.END_STREAM)
            return
        if flags & f.END_STREAM:
            self._request_complete(stream)

    def _admit(self, stream: Stream):
        """Looks the call up and checks what its HEADERS decide, before any of its body is held: CallError for a
        call refused (the checks and statuses of grpcio's server with our API-key interceptor)."""
        server = self.server
        path, metadata, timeout = _request_of(stream.headers)
        if self.over_limit and path != HEALTH_CHECK:
            raise wire.CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server has reached its limit of {server.max_connections} open connections (--max_connections)",
            )
        handler = server.handler(path, metadata)
        if handler is None:
            raise wire.CallError(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        refusal = server.authorize(path, metadata)
        if refusal is not None:
            raise wire.CallError(grpc.StatusCode.UNAUTHENTICATED, refusal)
        if handler.request_streaming:
            raise wire.CallError(grpc.StatusCode.UNIMPLEMENTED, "client streaming is not served on this port")
        if server.active_calls >= server.max_concurrent_rpcs:
            raise wire.CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
        stream.handler, stream.metadata, stream.timeout = handler, metadata, timeout

    def _decode(self, block: bytes) -> tuple:
        """The fields of a header block. A client repeating its headers sends the same block call after call (its
        fields indexed, or literals it does not index); a block whose decoding left the table as it was decodes
        the same way until the table changes, so its fields are remembered until a block changes the table."""
        headers = self.blocks.get(block)
        if headers is not None:
            return headers
        table = self.decoder.header_table
        entries = table.dynamic_entries
        newest, count, size = entries[0] if entries else None, len(entries), table.maxsize
        headers = tuple(self.decoder.decode(block, raw=True))
        # an insertion puts a new tuple first; a size update changes maxsize
        if (entries[0] if entries else None) is newest and len(entries) == count and table.maxsize == size:
            if len(self.blocks) < CACHED_BLOCKS:
                self.blocks[block] = headers
        else:
            self.blocks.clear()
        return headers

    def _data(self, flags: int, stream_id: int, payload: bytes):
        self.unacked += len(payload)
        stream = self.streams.get(stream_id)
        if stream is not None and stream.task is None:
            self._body(stream, flags, payload)
        elif stream_id > self.last_stream_id:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
        # else a stream already reset, refused or answered: its data is dropped
        if self.unacked >= CONNECTION_WINDOW // 2:
            if (
                self.buffered > self.server.max_buffered_bytes
                and self.unacked > CONNECTION_WINDOW - f.DEFAULT_MAX_FRAME
            ):
                self._shed_bodies()  # the client can send no more: whatever it sends, buffered stays bounded
            self._give_back()

    def _body(self, stream: Stream, flags: int, payload: bytes):
        """A DATA frame of a request body being received."""
        stream.unacked += len(payload)
        data = f.unpad(flags, payload)
        stream.last_read = self.now
        held = stream.receiving
        received = held + len(data)
        limit = self.server.max_message_bytes
        if held < 5 <= received:  # the message's length prefix is whole: one over the limit is refused now
            declared = wire.PREFIX.unpack_from(data if not held else b"".join(stream.body) + data)[1]
            if declared > limit:
                self._refuse(stream, wire.too_large(declared, limit), rest_unwanted=not flags & f.END_STREAM)
                return
        if received > limit + 5:  # more than one message: never held past the limit
            self._refuse(stream, wire.too_large(received - 5, limit), rest_unwanted=not flags & f.END_STREAM)
            return
        stream.body.append(data)
        stream.receiving = received
        self.buffered += len(data)
        if flags & f.END_STREAM:
            self._request_complete(stream)
        elif stream.unacked >= STREAM_WINDOW // 2:
            self.out.append(f.window_update(stream.id, stream.unacked))
            stream.unacked = 0

    def _give_back(self):
        """Returns the DATA received to the connection's window, unless the bodies held are over the limit."""
        if self.unacked >= CONNECTION_WINDOW // 2 and self.buffered <= self.server.max_buffered_bytes:
            self._write(f.window_update(0, self.unacked))
            self.unacked = 0

    def _shed_bodies(self):
        """The window is withheld and the client can send no more: no held body can complete, so the newest are
        refused until the rest fit under the limit, and the window opens again."""
        limit = self.server.max_buffered_bytes
        refusal = wire.CallError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the connection holds more than {limit} bytes of request bodies not yet complete",
        )
        shed = []
        for stream in reversed(list(self.streams.values())):
            if self.buffered <= limit:
                break
            if stream.task is None and stream.receiving:
                shed.append(stream.id)
                self._refuse(stream, refusal, rest_unwanted=True)
        log.warning(
            f"gRPC server: {self.peer} sent more than {limit} bytes of request bodies that are not complete "
            f"on one connection: refused the calls of streams {shed}"
        )

    def _release(self, stream: Stream):
        """Drops a stream's body from what the connection holds, and gives back the window it held up."""
        if stream.receiving:
            self.buffered -= stream.receiving
            stream.receiving = 0
            stream.body = []
            if self.unacked >= CONNECTION_WINDOW // 2:
                self._give_back()

    # ---- calls ----
    def _request_complete(self, stream: Stream):
        if stream.refused:
            self._finish(stream)
            return
        server = self.server
        body = stream.body
        self._release(stream)
        try:
            messages = wire.unprefixed(b"".join(body), server.max_message_bytes)
            if len(messages) != 1:
                raise wire.CallError(grpc.StatusCode.INTERNAL, f"a unary request has {len(messages)} messages")
            if server.active_calls >= server.max_concurrent_rpcs:
                raise wire.CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
        except wire.CallError as err:
            self._refuse(stream, err)
            return
        handler = stream.handler
        request = messages[0]
        if handler.request_deserializer is not None:
            try:
                request = handler.request_deserializer(request)
            except Exception:  # grpcio's answer to a request it cannot decode
                self._refuse(stream, wire.CallError(grpc.StatusCode.INTERNAL, "Exception deserializing request!"))
                return
        context = ServicerContext(stream.metadata, stream.timeout, self.peer)
        server.active_calls += 1
        stream.task = self.loop.create_task(self._call(stream, handler, request, context))
        timeout = stream.timeout
        if timeout is not None:
            deadline = self.loop.call_later(timeout, self._deadline, stream)
            stream.task.add_done_callback(lambda _: deadline.cancel())

    def _deadline(self, stream: Stream):
        if stream.task is not None and not stream.task.done() and self.streams.get(stream.id) is stream:
            stream.task.cancel()
            self._close_with(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ())

    async def _call(self, stream: Stream, handler, request, context: ServicerContext):
        try:
            if handler.response_streaming:
                await self._stream_replies(stream, handler, request, context)
            else:
                self._reply(stream, _serialized(handler, await handler.unary_unary(request, context)), context)
        except grpc.aio.AbortError:
            self._close_with(stream, context.code, context.details, context.trailing)
        except asyncio.CancelledError:
            pass  # the client reset the stream, the deadline passed or the connection closed
        except wire.CallError as err:
            self._close_with(stream, err.code, err.details, context.trailing)
        except Exception:
            log.exception(f"gRPC call {_path(stream)} failed")
            self._close_with(stream, grpc.StatusCode.UNKNOWN, UNEXPECTED, context.trailing)
        finally:
            self.server.active_calls -= 1

    async def _stream_replies(self, stream: Stream, handler, request, context: ServicerContext):
        async for response in handler.unary_stream(request, context):
            if self.streams.get(stream.id) is not stream:
                return
            self._respond_headers(stream)
            stream.outbox.append(wire.prefixed(_serialized(handler, response)))
            self._send(stream)
            while stream.outbox and self.streams.get(stream.id) is stream:  # back-pressure: wait for window
                stream.writable = asyncio.Event()
                await stream.writable.wait()
        self._close_with(stream, context.code or grpc.StatusCode.OK, context.details, context.trailing)

    def _reply(self, stream: Stream, payload: bytes, context: ServicerContext):
        if self.streams.get(stream.id) is not stream or self.closed:
            return
        code = context.code or grpc.StatusCode.OK
        if code is not grpc.StatusCode.OK:
            self._close_with(stream, code, context.details, context.trailing)
            return
        self._respond_headers(stream)
        stream.outbox.append(wire.prefixed(payload))
        stream.trailers = header_block(wire.trailers(code, context.details, context.trailing))
        self._send(stream)

    def _respond_headers(self, stream: Stream):
        if not stream.answered:
            stream.answered = True
            self._write(f.frame(f.HEADERS, f.END_HEADERS, stream.id, RESPONSE_BLOCK))

    def _refuse(self, stream: Stream, err: wire.CallError, rest_unwanted: bool = False):
        """Ends a call before its handler ran: a trailers-only response, its body dropped; `rest_unwanted`: the
        client has more of it to send, and is asked to stop (RST_STREAM NO_ERROR after the response)."""
        stream.refused = True
        self._close_with(stream, err.code, err.details, ())
        self._release(stream)
        self._finish(stream)
        if rest_unwanted:
            self._write(f.rst_stream(stream.id, f.NO_ERROR))

    def _close_with(self, stream: Stream, code: grpc.StatusCode, details: str, trailing):
        if self.streams.get(stream.id) is not stream or self.closed or stream.trailers is not None:
            return
        fields = wire.trailers(code, details, trailing)
        if not stream.answered:  # trailers-only: one HEADERS frame
            stream.answered = True
            fields = list(wire.RESPONSE_HEADERS) + fields
            stream.outbox.clear()
        stream.trailers = header_block(fields)
        self._send(stream)

    def _send(self, stream: Stream):
        """Sends what the windows allow of the stream's DATA, then its trailers once the DATA is out."""
        outbox = stream.outbox
        while outbox and self.send_window > 0 and stream.send_window > 0:
            chunk = outbox[0]
            size = min(len(chunk), self.send_window, stream.send_window, self.peer_max_frame)
            if size == len(chunk):
                outbox.popleft()
            else:
                outbox[0] = chunk[size:]
                chunk = chunk[:size]
            self.send_window -= size
            stream.send_window -= size
            self._write(f.frame(f.DATA, 0, stream.id, chunk))
        if not outbox:
            if stream.writable is not None:
                stream.writable.set()
            if stream.trailers is not None:
                self._write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream.id, stream.trailers))
                self._finish(stream)

    def _send_waiting(self):
        for stream in list(self.streams.values()):
            if stream.outbox:
                self._send(stream)

    def _finish(self, stream: Stream):
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
            if not self.streams:
                if self.server.stopping:
                    self.server.connection_idle(self)
                elif self.over_limit:  # its answer given: closed, as a RESTful one beyond the limit is
                    self.going_away = True
                    self._fail(f.NO_ERROR, "over the connection limit", warn=False)
                else:
                    self.idle_since = self.loop.time()

    def _cancel(self, stream: Stream):
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if stream.writable is not None:
            stream.writable.set()

    # ---- timeouts ----
    def _timed(self):
        """The connection's one timer: it fires at the earliest deadline it knows of, or a period later, and a
        deadline set since (a new stream's, a body's latest read) is never earlier than that."""
        self.timer = None
        if self.closed:
            return
        why, stalled, next_at = self._expired(self.loop.time())
        if why is not None:
            (log.warning if stalled else log.info)(f"gRPC server: closing the HTTP/2 connection of {self.peer}: {why}")
            self._fail(f.NO_ERROR, why, warn=False)
        elif next_at is not None:
            self.timer = self.loop.call_at(next_at, self._timed)

    def _expired(self, now: float) -> tuple[str | None, bool, float | None]:
        """(why the connection is closed now or None, whether the client stalled (else it was idle), when to look
        again or None)."""
        server = self.server
        read, idle = server.read_timeout, server.idle_timeout
        next_at = now + server.timer_period
        if not self.streams:
            if read and not self.last_stream_id:
                due = self.opened + read
                if now >= due:
                    return f"no call within {read:g} s of its opening (--read_timeout)", True, None
                next_at = min(next_at, due)
            if idle:
                due = self.idle_since + idle
                if now >= due:
                    return f"no call for {idle:g} s", False, None
                next_at = min(next_at, due)
        elif read:
            withheld = self.buffered > server.max_buffered_bytes  # the server, not the client, is behind
            for stream in self.streams.values():
                if stream.task is None:  # its body still arriving
                    due = stream.last_read + read
                    if now < due:
                        next_at = min(next_at, due)
                    elif not withheld:
                        return (
                            f"the request body of {_path(stream)} stalled for {read:g} s (--read_timeout)",
                            True,
                            None,
                        )
        return None, False, next_at

    # ---- stopping ----
    def go_away(self):
        """No new streams from now on; those running finish."""
        if not self.closed:
            self._write(f.goaway(self.last_stream_id, f.NO_ERROR))

    def abort_calls(self):
        for stream in list(self.streams.values()):
            self._cancel(stream)
            self._close_with(stream, grpc.StatusCode.UNAVAILABLE, "the server is stopping", ())

    def close(self):
        if not self.closed:
            self._flush()
            self.closed = True
            self.transport.close()


def _serialized(handler, response) -> bytes:
    if handler.response_serializer is None:
        return response
    try:
        return handler.response_serializer(response)
    except Exception as err:
        raise wire.CallError(grpc.StatusCode.INTERNAL, "Failed to serialize response!") from err


def _request_of(headers):
    """(path, metadata, timeout) of a request's header fields; CallError for one that is no gRPC call."""
    path = method = content_type = timeout_value = None
    for name, value in headers:
        if name == b":path":
            path = value
        elif name == b":method":
            method = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout_value = value
    if method != b"POST" or path is None:
        raise wire.CallError(grpc.StatusCode.UNIMPLEMENTED, "a gRPC call is a POST with a :path")
    if content_type is None or not content_type.startswith(b"application/grpc"):
        raise wire.CallError(grpc.StatusCode.INTERNAL, "content-type is not application/grpc")
    timeout = None if timeout_value is None else wire.parse_timeout(timeout_value)
    return path.decode("ascii", "replace"), wire.metadata_of(headers), timeout


def _path(stream: Stream) -> str:
    for name, value in stream.headers:
        if name == b":path":
            return value.decode("ascii", "replace")
    return "?"


def _peer(transport) -> str:
    address = transport.get_extra_info("peername")
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    sockname = transport.get_extra_info("sockname")
    return f"unix:{sockname}" if sockname else "unix:"
