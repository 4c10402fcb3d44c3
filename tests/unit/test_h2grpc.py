"""The gRPC server of frontends/h2grpc under grpcio's own client: unary and server-streaming calls, statuses and
metadata both ways, deadlines, messages beyond the windows and the limit, unknown methods, authorization, the
concurrent-call limit, TLS with client certificates, unix sockets and a graceful stop."""

import asyncio
import socket
import threading

import grpc
import pytest
from certificates import make_certs
from serving_process import wait_until

from mindspore_serving.frontends import h2grpc

SERVICE = "test.Echo"


async def _echo(request, context):
    for key, value in context.invocation_metadata():
        if key == "x-fail":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"asked to fail: {value} ünïcode %")
        if key == "x-sleep":
            await asyncio.sleep(float(value))
    context.set_trailing_metadata((("x-trailer", "t"), ("x-raw-bin", b"\x00\xff")))
    return request


async def _count(request, context):
    for index in range(int(request or b"3")):
        yield b"%d" % index
    if request == b"2":
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, "stopped after two")


async def _broken(request, context):
    raise ValueError("a bug with a secret path /srv/x")


async def _big(request, context):
    return b"r" * int(request)


class Served:
    """An h2grpc.Server on its own event loop thread."""

    def __init__(self, address="127.0.0.1:0", context=None, **options):
        self.loop = asyncio.new_event_loop()
        self.server = h2grpc.Server(options.pop("max_message_bytes", 4 << 20), **options)
        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Count": grpc.unary_stream_rpc_method_handler(_count),
            "Broken": grpc.unary_unary_rpc_method_handler(_broken),
            "Big": grpc.unary_unary_rpc_method_handler(_big),
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        port = self.server.add_secure_port(address, context) if context else self.server.add_insecure_port(address)
        self.address = address if address.startswith("unix:") else f"127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self.server.start())

    def run(self, coroutine, timeout=30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self):
        self.run(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def served():
    made = []

    def serve(*args, **kwargs):
        made.append(Served(*args, **kwargs))
        return made[-1]

    yield serve
    for server in made:
        server.close()


def _call(channel, method, request=b"", **kwargs):
    return channel.unary_unary(f"/{SERVICE}/{method}")(request, timeout=kwargs.pop("timeout", 10), **kwargs)


def test_unary_calls_with_metadata_both_ways(served):
    server = served()
    with grpc.insecure_channel(server.address) as channel:
        reply, call = channel.unary_unary(f"/{SERVICE}/Echo").with_call(
            b"hello", timeout=10, metadata=(("x-any", "v"),)
        )
        assert reply == b"hello"
        assert ("x-trailer", "t") in call.trailing_metadata() and ("x-raw-bin", b"\x00\xff") in call.trailing_metadata()
        assert [_call(channel, "Echo", b"%d" % i) for i in range(50)] == [b"%d" % i for i in range(50)]


def test_statuses_of_aborts_failures_and_unknown_methods(served):
    server = served()
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as aborted:
            _call(channel, "Echo", metadata=(("x-fail", "yes"),))
        assert aborted.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert aborted.value.details() == "asked to fail: yes ünïcode %"
        with pytest.raises(grpc.RpcError) as broken:
            _call(channel, "Broken")
        assert broken.value.code() is grpc.StatusCode.UNKNOWN and "/srv/x" not in broken.value.details()
        with pytest.raises(grpc.RpcError) as unknown:
            _call(channel, "Nope")
        assert unknown.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_server_streaming_and_an_abort_after_messages(served):
    server = served()
    with grpc.insecure_channel(server.address) as channel:
        count = channel.unary_stream(f"/{SERVICE}/Count")
        assert list(count(b"5", timeout=10)) == [b"0", b"1", b"2", b"3", b"4"]
        stream = count(b"2", timeout=10)
        assert [next(stream), next(stream)] == [b"0", b"1"]
        with pytest.raises(grpc.RpcError) as aborted:
            next(stream)
        assert aborted.value.code() is grpc.StatusCode.OUT_OF_RANGE


def test_the_deadline_ends_a_call(served):
    server = served()
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as late:
            _call(channel, "Echo", metadata=(("x-sleep", "5"),), timeout=0.3)
        assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert _call(channel, "Echo", b"after") == b"after"
    wait_until(lambda: server.server.active_calls == 0, 5, "the late call's task ended too")


def test_messages_beyond_the_windows_and_over_the_limit(served):
    server = served(max_message_bytes=4 << 20)
    with grpc.insecure_channel(server.address, options=[("grpc.max_receive_message_length", 8 << 20)]) as channel:
        body = bytes(range(256)) * (3 << 12)  # 3 MiB: beyond every default window and frame size
        assert _call(channel, "Echo", body) == body
        assert _call(channel, "Big", b"3000000") == b"r" * 3_000_000
        with pytest.raises(grpc.RpcError) as too_large:
            _call(channel, "Echo", b"x" * (5 << 20))
        assert too_large.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in too_large.value.details()
        assert _call(channel, "Echo", b"still served") == b"still served"


def test_authorization_and_the_concurrent_call_limit(served):
    refuse = lambda method, metadata: None if ("authorization", "Bearer k") in metadata else "no key"  # noqa: E731
    server = served(authorize=refuse, max_concurrent_rpcs=2)
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            _call(channel, "Echo")
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED and refused.value.details() == "no key"
        key = (("authorization", "Bearer k"),)
        slow = [
            channel.unary_unary(f"/{SERVICE}/Echo").future(b"", timeout=10, metadata=key + (("x-sleep", "1"),))
            for _ in range(2)
        ]
        with pytest.raises(grpc.RpcError) as busy:
            _call(channel, "Echo", metadata=key)
        assert busy.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [future.result() for future in slow] == [b"", b""]


def test_calls_outlast_the_read_timeout_and_an_idle_connection_is_closed_then_reopened(served):
    server = served(read_timeout=0.3, idle_timeout=0.5)
    options = [("grpc.keepalive_time_ms", 100), ("grpc.keepalive_permit_without_calls", 1)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        body = b"b" * (3 << 20)  # several windows' worth
        assert _call(channel, "Echo", body, metadata=(("x-sleep", "0.8"),)) == body  # running: not stalled
        assert list(channel.unary_stream(f"/{SERVICE}/Count")(b"3", timeout=10)) == [b"0", b"1", b"2"]
        wait_until(lambda: not server.server.connections, 5, "the idle connection closed, pings or not")
        assert _call(channel, "Echo", b"again") == b"again"  # the channel opens a new one


def test_tls_with_client_certificates(served, tmp_path):
    certs = make_certs(str(tmp_path))
    context = h2grpc.ssl_context(certs["server.crt"], certs["server.key"], certs["ca.crt"], verify_client=True)
    server = served("127.0.0.1:0", context=context)
    read = lambda name: open(certs[name], "rb").read()  # noqa: E731
    port = server.address.rsplit(":", 1)[1]
    good = grpc.ssl_channel_credentials(read("ca.crt"), read("client.key"), read("client.crt"))
    with grpc.secure_channel(f"localhost:{port}", good) as channel:
        assert _call(channel, "Echo", b"secret") == b"secret"
    with grpc.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials(read("ca.crt"))) as channel:
        with pytest.raises(grpc.RpcError) as refused:  # no client certificate
            _call(channel, "Echo", b"secret")
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


def test_unix_socket_and_graceful_stop(served, tmp_path):
    server = served(f"unix:{tmp_path}/grpc.sock")
    with grpc.insecure_channel(server.address) as channel:
        running = channel.unary_unary(f"/{SERVICE}/Echo").future(
            b"in flight", timeout=10, metadata=(("x-sleep", "0.5"),)
        )
        wait_until(lambda: server.server.active_calls == 1, 10, "the call running")
        stopping = asyncio.run_coroutine_threadsafe(server.server.stop(5), server.loop)
        assert running.result() == b"in flight"  # finished within the grace
        stopping.result(10)
        with pytest.raises(grpc.RpcError):
            _call(channel, "Echo", timeout=2)


def _raw(address):
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def _read_until_closed(sock) -> bytes:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_a_peer_that_breaks_the_protocol_is_closed_and_others_are_served(served):
    import hpack

    from mindspore_serving.frontends.h2grpc import frames

    server = served()
    with _raw(server.address) as sock:  # not HTTP/2 at all
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert frames.GOAWAY in [kind for kind, *_ in frames.cut(_read_until_closed(sock), 1 << 20)[0]]
    with _raw(server.address) as sock:  # a header block that never ends, past the limit
        block = hpack.Encoder().encode([(":method", "POST"), (":path", f"/{SERVICE}/Echo"), ("x-pad", "p" * 100)])
        sock.sendall(frames.PREFACE + frames.settings([]) + frames.frame(frames.HEADERS, 0, 1, block))
        for _ in range(8):
            sock.sendall(frames.frame(frames.CONTINUATION, 0, 1, b"\x00" * 16000))
        replies = frames.cut(_read_until_closed(sock), 1 << 20)[0]
        assert (frames.GOAWAY, frames.ENHANCE_YOUR_CALM) in [
            (kind, frames.u32(payload[4:8])) for kind, _, _, payload in replies if kind == frames.GOAWAY
        ]
    with grpc.insecure_channel(server.address) as channel:
        assert _call(channel, "Echo", b"fine") == b"fine"


def _closing_blocks(sock, count: int):
    """The decoded closing header blocks (END_STREAM) of `count` streams, read from a raw connection."""
    import hpack

    from mindspore_serving.frontends.h2grpc import frames

    decoder, buffer, closing = hpack.Decoder(), b"", {}
    while len(closing) < count:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {sorted(closing)}"
        got, buffer = frames.cut(buffer + chunk, 1 << 20)
        for kind, flags, stream_id, payload in got:
            if kind == frames.HEADERS:
                fields = dict(decoder.decode(payload))
                if flags & frames.END_STREAM:
                    closing[stream_id] = fields
            elif kind == frames.GOAWAY:
                closing["goaway"] = frames.u32(payload[4:8])
    return closing


def test_a_repeated_header_block_is_decoded_once_until_the_table_changes(served):
    import hpack

    from mindspore_serving.frontends.h2grpc import frames

    server = served()
    encoder = hpack.Encoder()
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/{SERVICE}/Echo"),
        (":authority", "x"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("x-fail", "from the table"),
    ]
    first, again = encoder.encode(fields), encoder.encode(fields)
    assert min(again) > 0x80 and len(again) == len(fields)  # one byte per field: what a repeating client sends
    with _raw(server.address) as sock:
        sent = frames.PREFACE + frames.settings([])
        for stream_id, block in ((1, first), (3, again), (5, again)):
            sent += frames.frame(frames.HEADERS, frames.END_HEADERS, stream_id, block)
            sent += frames.frame(frames.DATA, frames.END_STREAM, stream_id, b"\x00\x00\x00\x00\x00")
        sock.sendall(sent)
        closing = _closing_blocks(sock, 3)
        (connection,) = server.server.connections
        assert list(connection.blocks) == [again]  # the first block added to the table: never remembered
        assert [closing[stream_id]["grpc-status"] for stream_id in (1, 3, 5)] == ["9"] * 3
        assert {closing[stream_id]["grpc-message"] for stream_id in (1, 3, 5)} == {
            "asked to fail: from the table %C3%BCn%C3%AFcode %25"
        }
    with _raw(server.address) as sock:  # a block past the header list limit: a compression error
        encoder = hpack.Encoder()
        padded = fields[:-1] + [("x-pad", "p" * 3000)]
        sent = frames.PREFACE + frames.settings([])
        sent += frames.frame(frames.HEADERS, frames.END_HEADERS | frames.END_STREAM, 1, encoder.encode(padded))
        pad_index = bytes((encoder.encode([("x-pad", "p" * 3000)])[0],))
        sent += frames.frame(
            frames.HEADERS, frames.END_HEADERS | frames.END_STREAM, 3, encoder.encode(fields[:-1]) + pad_index * 6
        )
        sock.sendall(sent)
        assert _closing_blocks(sock, 2)["goaway"] == frames.COMPRESSION_ERROR
