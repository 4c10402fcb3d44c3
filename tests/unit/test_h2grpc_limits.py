"""What one client may hold of an h2grpc connection, on a Connection driven frame by frame through a fake transport
and a fake clock: calls refused at their HEADERS with their bodies dropped (and the window given back), a message
refused from its length prefix, the bodies a connection holds capped, the read and idle timeouts, and the
connection limit. No sockets, no sleeps."""

import grpc
import hpack
import pytest

from mindspore_serving.frontends import h2grpc
from mindspore_serving.frontends.h2grpc import connection as h2
from mindspore_serving.frontends.h2grpc import frames as f

SERVICE = "test.Echo"
KEY = ("authorization", "Bearer k")
READ_S, IDLE_S = 2.0, 10.0
FRAME = 16384


class FakeHandle:
    def __init__(self, when, callback, args):
        self.when, self.callback, self.args, self.cancelled = when, callback, args, False

    def cancel(self):
        self.cancelled = True


class FakeLoop:
    """The clock and timers of an event loop; tasks are created and never run (a call stays running)."""

    def __init__(self):
        self.now = 1000.0
        self.timers = []
        self.tasks = []

    def time(self):
        return self.now

    def call_at(self, when, callback, *args):
        self.timers.append(FakeHandle(when, callback, args))
        return self.timers[-1]

    def call_later(self, delay, callback, *args):
        return self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback, *args):
        return self.call_at(self.now, callback, *args)

    def create_task(self, coroutine):
        coroutine.close()
        self.tasks.append(FakeTask())
        return self.tasks[-1]

    def advance(self, seconds):
        self.now += seconds
        while True:
            due = [timer for timer in self.timers if not timer.cancelled and timer.when <= self.now]
            if not due:
                return
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            timer.callback(*timer.args)


class FakeTask:
    def done(self):
        return False

    def cancel(self):
        pass

    def add_done_callback(self, callback):
        pass


class FakeTransport:
    def __init__(self):
        self.sent = b""
        self.closed = self.eof = False

    def write(self, data):
        self.sent += data

    def writelines(self, chunks):
        self.sent += b"".join(chunks)

    def can_write_eof(self):
        return True

    def write_eof(self):
        self.eof = True

    def close(self):
        self.closed = True

    def get_extra_info(self, name):
        return ("127.0.0.1", 50000) if name == "peername" else None


class Client:
    """One HTTP/2 connection to the server as a raw client sees it: frames in, frames out."""

    def __init__(self, server, loop):
        self.connection = h2.Connection(server, loop)
        self.transport = FakeTransport()
        self.connection.connection_made(self.transport)
        self.encoder, self.decoder, self.read = hpack.Encoder(), hpack.Decoder(), 0
        self.send(f.PREFACE + f.settings([]))

    def send(self, *data):
        self.connection.data_received(b"".join(data))

    def headers(self, stream_id, method="Echo", key=True, end=False, path=None):
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path or f"/{SERVICE}/{method}"),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        fields += [KEY] if key else []
        return f.frame(f.HEADERS, f.END_HEADERS | (f.END_STREAM if end else 0), stream_id, self.encoder.encode(fields))

    def frames(self):
        """The frames the server sent since the last look: (type, flags, stream id, payload or decoded fields)."""
        got, rest = f.cut(self.transport.sent[self.read :], 1 << 20)
        assert not rest
        self.read = len(self.transport.sent)
        return [
            (kind, flags, stream, dict(self.decoder.decode(payload)) if kind == f.HEADERS else payload)
            for kind, flags, stream, payload in got
        ]

    def status(self, stream_id):
        """(grpc-status, grpc-message) of the trailers-only answer on a stream, from the frames since the last look."""
        for kind, flags, stream, fields in self.frames():
            if kind == f.HEADERS and stream == stream_id and flags & f.END_STREAM:
                return int(fields["grpc-status"]), fields.get("grpc-message", "")
        return None

    def closed(self):
        return self.connection.closed and self.transport.eof


def _message(size, declared=None):
    return bytes((0,)) + (size if declared is None else declared).to_bytes(4, "big") + b"m" * size


def _data(stream_id, payload, end=False):
    return f.frame(f.DATA, f.END_STREAM if end else 0, stream_id, payload)


def _body_frames(stream_id, body, end=False):
    chunks = [body[i : i + FRAME] for i in range(0, len(body), FRAME)]
    return [_data(stream_id, chunk, end and i == len(chunks) - 1) for i, chunk in enumerate(chunks)]


def _granted(frames):
    """The connection-level window the server gave back in these frames."""
    return sum(f.u32(payload) for kind, _, stream, payload in frames if kind == f.WINDOW_UPDATE and stream == 0)


@pytest.fixture
def serve():
    loop = FakeLoop()

    def make(**options):
        options.setdefault("read_timeout", READ_S)
        options.setdefault("idle_timeout", IDLE_S)
        server = h2grpc.Server(
            options.pop("max_message_bytes", 1 << 20),
            authorize=lambda method, metadata: None if KEY in metadata else "no key",
            **options,
        )
        handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
        check = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),
                grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": check}),
            )
        )
        return server, loop

    return make


def test_a_call_is_refused_at_its_headers_and_its_body_dropped_with_the_window_given_back(serve):
    server, loop = serve(max_concurrent_rpcs=1)
    client = Client(server, loop)
    client.frames()
    client.send(client.headers(1, key=False))
    answer = client.frames()
    assert [(kind, stream) for kind, _, stream, _ in answer if kind != f.SETTINGS] == [
        (f.HEADERS, 1),
        (f.RST_STREAM, 1),
    ]
    assert (answer[-2][3]["grpc-status"], answer[-2][3]["grpc-message"]) == ("16", "no key")
    assert f.u32(answer[-1][3]) == f.NO_ERROR
    # a client that sends its body anyway: dropped, nothing held, its bytes given back to the connection's window
    client.send(*_body_frames(1, _message(20 << 20, declared=100)))
    assert client.connection.buffered == 0 and not client.connection.streams
    assert _granted(client.frames()) >= (20 << 20) - h2.CONNECTION_WINDOW // 2 and not client.connection.closed
    client.send(client.headers(3, method="Nope"))
    assert client.status(3) == (grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!")
    client.send(client.headers(5), _data(5, _message(3), end=True))  # runs (its task never ends here)
    client.send(client.headers(7))
    assert client.status(7) == (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "Concurrent RPC limit exceeded!")
    assert list(client.connection.streams) == [5]


@pytest.mark.parametrize("split", [False, True], ids=["whole", "prefix across frames"])
def test_a_message_over_the_limit_is_refused_from_its_length_prefix(serve, split):
    server, loop = serve(max_message_bytes=1 << 20)
    client = Client(server, loop)
    prefix = _message(0, declared=(1 << 20) + 1)
    client.send(client.headers(1), *([_data(1, prefix[:3]), _data(1, prefix[3:])] if split else [_data(1, prefix)]))
    answer = client.frames()
    closing = [fields for kind, flags, _, fields in answer if kind == f.HEADERS and flags & f.END_STREAM]
    assert [(fields["grpc-status"], fields["grpc-message"]) for fields in closing] == [
        ("8", f"Received message larger than max ({(1 << 20) + 1} vs. {1 << 20})")
    ]
    assert (f.RST_STREAM, 1) in [(kind, stream) for kind, _, stream, _ in answer]
    assert client.connection.buffered == 0


def test_the_bodies_one_connection_holds_are_capped_and_it_stays_usable(serve):
    limit = 2 * ((1 << 20) + 5)
    server, loop = serve(max_message_bytes=1 << 20, max_buffered_bytes=limit)
    client = Client(server, loop)
    window, most, answers = h2.CONNECTION_WINDOW, 0, []
    for stream_id in range(1, 39, 2):  # 19 bodies of 900 KiB (16.7 MB), none complete, sent as the window allows
        client.send(client.headers(stream_id))
        for chunk in _body_frames(stream_id, _message(900 << 10, declared=1 << 20)):
            got = client.frames()
            answers += got
            window += _granted(got)
            assert window >= len(chunk) - 9, "the client ran out of window: the connection is stuck"
            client.send(chunk)
            window -= len(chunk) - 9
            most = max(most, client.connection.buffered)
    assert most <= limit + h2.CONNECTION_WINDOW
    held = [stream.id for stream in client.connection.streams.values()]
    assert held == [1, 3] and client.connection.buffered <= limit  # the newest were refused
    closing = [
        (stream, fields["grpc-status"])
        for kind, flags, stream, fields in answers + client.frames()
        if kind == f.HEADERS and flags & f.END_STREAM
    ]
    assert closing == [(stream_id, "8") for stream_id in range(37, 3, -2)]
    client.send(*_body_frames(1, b"m" * ((1 << 20) - (900 << 10)), end=True))  # a held body completes: it runs
    assert list(client.connection.streams) == [1, 3] and client.connection.streams[1].task is not None
    assert client.connection.buffered == (900 << 10) + 5


def test_a_connection_without_a_call_within_the_read_timeout_is_closed(serve):
    server, loop = serve()
    client = Client(server, loop)
    loop.advance(READ_S - 0.1)
    assert not client.closed()
    loop.advance(0.1)
    assert client.closed()
    (goaway,) = [payload for kind, _, _, payload in client.frames() if kind == f.GOAWAY]
    assert f.u32(goaway[4:8]) == f.NO_ERROR and b"--read_timeout" in goaway[8:]


def test_a_stalled_body_closes_its_connection_a_running_call_does_not(serve):
    server, loop = serve()
    client = Client(server, loop)
    client.send(client.headers(1), _data(1, _message(3), end=True))  # running: waits on the server, not stalled
    client.send(client.headers(3), _data(3, _message(0, declared=100)))
    loop.advance(READ_S - 0.5)
    client.send(_data(3, b"m" * 10))  # progress: its stall starts again
    loop.advance(READ_S - 0.5)
    client.send(f.frame(f.PING, 0, 0, b"12345678"))
    assert not client.closed() and (f.PING, f.ACK, 0, b"12345678") in client.frames()
    loop.advance(0.5)
    assert client.closed()
    (goaway,) = [payload for kind, _, _, payload in client.frames() if kind == f.GOAWAY]
    assert b"stalled" in goaway


def test_a_long_call_keeps_its_connection_and_an_idle_one_is_closed(serve):
    server, loop = serve()
    client = Client(server, loop)
    client.send(client.headers(1), _data(1, _message(3), end=True))
    for _ in range(5):  # a long call, the client pinging: kept far beyond both timeouts
        loop.advance(IDLE_S)
        client.send(f.frame(f.PING, 0, 0, b"keep--it"))
    assert not client.closed()
    client.connection._reply(client.connection.streams[1], b"done", h2.ServicerContext((), None, "peer"))
    assert not client.connection.streams
    loop.advance(IDLE_S - 0.1)
    assert not client.closed()
    loop.advance(0.1)
    assert client.closed()
    assert [f.u32(payload[4:8]) for kind, _, _, payload in client.frames() if kind == f.GOAWAY] == [f.NO_ERROR]


def test_a_connection_beyond_the_limit_answers_health_checks_and_refuses_other_calls(serve):
    server, loop = serve(max_connections=1)
    first = Client(server, loop)
    beyond = Client(server, loop)
    beyond.send(beyond.headers(1, path="/grpc.health.v1.Health/Check"), _data(1, _message(0), end=True))
    assert beyond.connection.streams[1].task is not None  # a full server is live: its health is answered
    beyond.send(beyond.headers(3), _data(3, _message(3), end=True))
    assert beyond.status(3) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
        "the server has reached its limit of 1 open connections (--max_connections)",
    )
    beyond.connection._reply(beyond.connection.streams[1], b"", h2.ServicerContext((), None, "peer"))
    assert beyond.closed()  # its answers given, it is closed
    first.send(first.headers(1), _data(1, _message(3), end=True))
    assert first.connection.streams[1].task is not None
    beyond.connection.connection_lost(None)
    first.connection.connection_lost(None)
    assert not Client(server, loop).connection.over_limit
