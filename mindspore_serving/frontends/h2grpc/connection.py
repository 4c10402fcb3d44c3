"""One HTTP/2 connection of the gRPC server: frames in, calls run as tasks on the event loop, replies out.

Writes of one event-loop turn leave together (one `writelines`), so the HEADERS, DATA and trailers of a reply,
and the replies of calls finishing in the same turn, share a send. Inbound flow control keeps windows wide (a
call's body is read whole anyway, bounded by the message limit); outbound flow control follows the peer's
windows, a stream's DATA waiting for its WINDOW_UPDATE (a streaming handler waits with it).
"""
import asyncio
import collections
from typing import Deque, Dict, List, Optional

import grpc
import hpack

from mindspore_serving import log
from mindspore_serving.frontends.h2grpc import frames as f
from mindspore_serving.frontends.h2grpc import wire
from mindspore_serving.frontends.h2grpc.context import ServicerContext

STREAM_WINDOW = 1 << 20          # what a client may send on one stream before we acknowledge it
CONNECTION_WINDOW = 16 << 20     # ... and on the whole connection
MAX_HEADER_LIST = 16 << 10       # request header fields, decoded
MAX_HEADER_BLOCK = 64 << 10      # a request's header block, encoded (HEADERS and CONTINUATION frames)
LINGER_S = 1.0                   # a failed connection reads and drops what the peer sends, at most this long
CACHED_BLOCKS = 32               # header blocks remembered per connection, with their fields
UNEXPECTED = "Unexpected error in RPC handling"


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
    __slots__ = ("id", "headers", "body", "receiving", "unacked", "send_window", "outbox", "trailers", "task",
                 "refused", "writable", "answered")

    def __init__(self, stream_id: int, headers, send_window: int):
        self.id = stream_id
        self.headers = headers
        self.body: List[bytes] = []
        self.receiving = 0          # bytes of body so far
        self.unacked = 0            # bytes received and not yet given back with WINDOW_UPDATE
        self.send_window = send_window
        self.outbox: Deque[bytes] = collections.deque()  # DATA payloads waiting for window
        self.trailers: Optional[bytes] = None            # the closing header block, after the outbox
        self.task: Optional[asyncio.Task] = None
        self.refused = False        # answered already (an error before the handler): further DATA is dropped
        self.writable: Optional[asyncio.Event] = None    # a streaming handler waiting for window
        self.answered = False       # response headers sent


class Connection(asyncio.Protocol):
    def __init__(self, server):
        self.server = server
        self.loop = asyncio.get_event_loop()
        self.transport = None
        self.peer = "unknown"
        self.buffer = b""
        self.preface = False
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.blocks: Dict[bytes, tuple] = {}  # block -> its fields, for blocks that leave the table as it is
        self.streams: Dict[int, Stream] = {}
        self.last_stream_id = 0
        self.send_window = f.DEFAULT_WINDOW
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.unacked = 0
        self.continuing = None      # (stream id, flags, [fragments], size) while a header block spans frames
        self.out: List[bytes] = []
        self.flush_scheduled = False
        self.closed = False
        self.going_away = False

    # ---- transport ----
    def connection_made(self, transport):
        self.transport = transport
        self.peer = _peer(transport)
        self.server.connections.add(self)
        self.out.append(f.settings([(f.MAX_CONCURRENT_STREAMS, self.server.max_streams_per_connection),
                                    (f.INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                                    (f.MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)]))
        self.out.append(f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW))
        self._flush()

    def connection_lost(self, exc):
        self.closed = True
        self.server.connections.discard(self)
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
            buffer = buffer[len(f.PREFACE):]
            self.preface = True
            if f.first_frame_is_settings(buffer) is False:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "the first frame is not SETTINGS")
        frames, self.buffer = f.cut(buffer, f.DEFAULT_MAX_FRAME)
        for kind, flags, stream_id, payload in frames:
            if self.closed:
                return
            self._frame(kind, flags, stream_id, payload)

    def _fail(self, code: int, why: str):
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
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._cancel(stream)
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
            if flags & f.END_STREAM:
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
        stream = Stream(stream_id, headers, self.peer_initial_window)
        self.streams[stream_id] = stream
        if flags & f.END_STREAM:
            self._request_complete(stream)

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
        if self.unacked >= CONNECTION_WINDOW // 2:
            self.out.append(f.window_update(0, self.unacked))
            self.unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.task is not None:
            if stream_id > self.last_stream_id:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream already reset or answered: its data is dropped
        data = f.unpad(flags, payload)
        if not stream.refused:
            stream.receiving += len(data)
            if stream.receiving > self.server.max_message_bytes + 5:
                self._refuse(stream, wire.too_large(stream.receiving - 5, self.server.max_message_bytes))
                self._write(f.rst_stream(stream_id, f.NO_ERROR))  # the rest of the body is not wanted
                stream.body = []
                return
            else:
                stream.body.append(data)
        if flags & f.END_STREAM:
            self._request_complete(stream)
            return
        stream.unacked += len(payload)
        if stream.unacked >= STREAM_WINDOW // 2:
            self.out.append(f.window_update(stream_id, stream.unacked))
            stream.unacked = 0

    # ---- calls ----
    def _request_complete(self, stream: Stream):
        if stream.refused:
            self._finish(stream)
            return
        server = self.server
        try:
            path, metadata, timeout = _request_of(stream.headers)
            handler = server.handler(path, metadata)
            if handler is None:
                raise wire.CallError(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            refusal = server.authorize(path, metadata)
            if refusal is not None:
                raise wire.CallError(grpc.StatusCode.UNAUTHENTICATED, refusal)
            if handler.request_streaming:
                raise wire.CallError(grpc.StatusCode.UNIMPLEMENTED, "client streaming is not served on this port")
            messages = wire.unprefixed(b"".join(stream.body), server.max_message_bytes)
            if len(messages) != 1:
                raise wire.CallError(grpc.StatusCode.INTERNAL, f"a unary request has {len(messages)} messages")
            if server.active_calls >= server.max_concurrent_rpcs:
                raise wire.CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
        except wire.CallError as err:
            self._refuse(stream, err)
            self._finish(stream)
            return
        stream.body = []
        request = messages[0]
        if handler.request_deserializer is not None:
            try:
                request = handler.request_deserializer(request)
            except Exception:  # grpcio's answer to a request it cannot decode
                self._refuse(stream, wire.CallError(grpc.StatusCode.INTERNAL, "Exception deserializing request!"))
                self._finish(stream)
                return
        context = ServicerContext(metadata, timeout, self.peer)
        server.active_calls += 1
        stream.task = self.loop.create_task(self._call(stream, handler, request, context))
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

    def _refuse(self, stream: Stream, err: wire.CallError):
        """Ends a call before its handler ran: a trailers-only response."""
        stream.refused = True
        self._close_with(stream, err.code, err.details, ())

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
            if self.server.stopping and not self.streams:
                self.server.connection_idle(self)

    def _cancel(self, stream: Stream):
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if stream.writable is not None:
            stream.writable.set()

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
