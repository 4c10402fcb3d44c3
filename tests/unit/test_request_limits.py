"""Request limits (common/limits.py) on a real RESTful front end with a fake dispatcher, and in the pieces that
enforce them: bodies beyond a route's limit get 413 (the classic route: MindSpore Serving's 200 and text) before
they are read, stalled request heads and bodies are closed, connections beyond the limit refused in the route's
shape (probes answered), health Watch streams capped and sharing one readiness reader, the dispatcher's queue
bounded by bytes, stop strings and prompts capped."""

import asyncio
import json
import socket
import threading
import time

import grpc
import pytest
from raw_http import closed_within, read_reply
from serving_process import wait_until
from test_restful_server import EchoDispatcher, free_port

from mindspore_serving.common import errors
from mindspore_serving.common.change_signal import ChangeSignal
from mindspore_serving.common.limits import Limits
from mindspore_serving.frontends.errors import Protocol, grpc_error, http_error
from mindspore_serving.frontends.health import HealthServicer
from mindspore_serving.frontends.restful_server import BodyTooLarge, RestfulFrontend, read_body, replay
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.sampling_params import MAX_STOP_LENGTH, MAX_STOP_STRINGS, SamplingParams
from mindspore_serving.master.readiness import SERVING, Readiness

LLM_LIMIT = 1000
READ_TIMEOUT = 0.5
CLOSE_WITHIN = 10.0  # generous: the machine is shared; the point is that the connection is closed at all


def _serve(limits: Limits):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = RestfulFrontend(f"127.0.0.1:{free_port()}", 1, None, EchoDispatcher(), limits=limits)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)

    def close():
        asyncio.run_coroutine_threadsafe(server.stop(1), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    return server, close


@pytest.fixture(scope="module")
def frontend():
    server, close = _serve(Limits(llm_payload_bytes=LLM_LIMIT, read_timeout=READ_TIMEOUT))
    try:
        yield server
    finally:
        close()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=CLOSE_WITHIN)
    return sock


@pytest.mark.parametrize(
    "path, declared, status, check",
    [
        (
            "/v1/completions",
            10 << 20,
            413,
            lambda body: (
                body["error"]["code"] == "payload_too_large" and "--llm_payload_limit" in body["error"]["message"]
            ),
        ),
        (
            "/tokenize",
            10 << 20,
            413,
            lambda body: (
                body["error"]["code"] == "payload_too_large" and "--llm_payload_limit" in body["error"]["message"]
            ),
        ),
        (
            "/generate",
            10 << 20,
            413,
            lambda body: body["error_type"] == "payload_too_large" and f"limit of {LLM_LIMIT} bytes" in body["error"],
        ),
        ("/v2/models/add/infer", 200 << 20, 413, lambda body: "max_msg_mb_size" in body["error"]),
        (
            "/model/add:add_common",
            200 << 20,
            200,
            lambda body: body == {"error_msg": "http message is bigger than 1048576"},
        ),
    ],
)
def test_a_declared_body_beyond_the_limit_is_refused_before_it_is_sent(frontend, path, declared, status, check):
    with _connect(frontend.port) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\n\r\n{{".encode()
        )
        got, body = read_reply(sock)  # answered while nearly all of the body is still to come
    assert got == status and check(body), body


def test_a_chunked_body_is_refused_once_it_passes_the_limit(frontend):
    with _connect(frontend.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 600
        for _ in range(2):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        got, body = read_reply(sock)
    assert got == 413 and body["error"]["type"] == "invalid_request_error", body


def test_a_body_within_the_limit_reaches_the_route(frontend):
    with _connect(frontend.port) as sock:
        payload = json.dumps({"model": "m", "prompt": "p"}).encode()
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        got, _ = read_reply(sock)
    assert got == 404  # no LLM routes on this front end: the FastAPI app answered, with the body read


def test_a_slow_request_head_is_closed_while_other_clients_are_served(frontend):
    idle = _connect(frontend.port)  # sends nothing at all
    slow = _connect(frontend.port)
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never ends its head
    try:
        with _connect(frontend.port) as other:
            other.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_reply(other) == (200, {"status": "ok"})
        assert closed_within(slow, CLOSE_WITHIN) and closed_within(idle, CLOSE_WITHIN)
    finally:
        idle.close()
        slow.close()


def test_a_stalled_body_is_closed(frontend):
    with _connect(frontend.port) as sock:
        sock.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"a":')
        assert closed_within(sock, CLOSE_WITHIN)


def test_a_keep_alive_connection_is_not_cut_by_the_read_timeout(frontend):
    with _connect(frontend.port) as sock:
        for _ in range(2):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_reply(sock) == (200, {"status": "ok"})
            time.sleep(READ_TIMEOUT * 2)  # ok-sleep: the idle time between requests is what the test is about


def test_connections_beyond_the_limit_are_refused_in_the_route_s_shape_but_probes_answer():
    server, close = _serve(Limits(read_timeout=60, max_connections=2))
    held = [_connect(server.port) for _ in range(2)]
    try:
        wait_until(lambda: len(server.server.server_state.connections) >= 2, 10, "both connections accepted")
        with _connect(server.port) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            status, body = read_reply(sock)
            assert status == 429 and "--max_connections" in body["error"]["message"], body
            assert closed_within(sock, CLOSE_WITHIN)
        with _connect(server.port) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_reply(sock) == (200, {"status": "ok"})
    finally:
        for sock in held:
            sock.close()
        close()


def test_read_body_checks_the_declared_length_first_and_counts_what_arrives():
    async def scenario():
        async def never():
            raise AssertionError("read although the declared length is over the limit")

        with pytest.raises(BodyTooLarge) as caught:
            await read_body({"headers": [(b"content-length", b"11")]}, never, 10)
        assert caught.value.size == 11

        messages = [{"type": "http.request", "body": b"x" * 6, "more_body": True}] * 2

        async def chunks():
            return messages.pop()

        with pytest.raises(BodyTooLarge) as caught:
            await read_body({"headers": []}, chunks, 10)
        assert caught.value.size is None

        async def gone():
            return {"type": "http.disconnect"}

        assert await read_body({"headers": []}, gone, 10) is None
        again = replay(b"abc", gone)
        assert await again() == {"type": "http.request", "body": b"abc", "more_body": False}
        assert await again() == {"type": "http.disconnect"}

    asyncio.run(scenario())


def test_too_large_is_413_in_every_http_protocol_and_resource_exhausted_on_grpc():
    error = errors.PayloadTooLarge("too big")
    assert http_error(Protocol.OPENAI, error)[0] == 413
    assert http_error(Protocol.TGI, error) == (413, {"error": "too big", "error_type": "payload_too_large"})
    assert http_error(Protocol.KSERVE, error) == (413, {"error": "too big"})
    assert http_error(Protocol.MINDSPORE, error) == (200, {"error_msg": "too big"})
    assert grpc_error(error)[0] is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_limits_are_checked_and_travel_to_front_end_processes():
    limits = Limits(
        llm_payload_bytes=5,
        read_timeout=2.5,
        max_connections=3,
        max_concurrent_rpcs=4,
        max_streams_per_conn=6,
        max_watch_streams=0,
        idle_timeout=7.5,
    )
    assert Limits.from_proto(limits.to_proto()) == limits
    for bad in (
        {"read_timeout": 0},
        {"read_timeout": True},
        {"max_connections": 0},
        {"llm_payload_bytes": -1},
        {"idle_timeout": 0},
        {"idle_timeout": 7200},
    ):
        with pytest.raises(RuntimeError):
            Limits(**bad)


class _Context:
    def __init__(self):
        self.aborted = None

    async def abort(self, code, message):
        self.aborted = (code, message)
        raise grpc.RpcError(message)


def test_health_watch_streams_are_capped_and_share_one_readiness_reader(monkeypatch):
    monkeypatch.setattr("mindspore_serving.frontends.health.WATCH_INTERVAL", 0.01)
    calls = []
    state = {"ready": True}

    def readiness():
        calls.append(1)
        return Readiness(state["ready"], SERVING)

    async def scenario():
        servicer = HealthServicer(readiness, max_watch_streams=50)
        request = type("Request", (), {"service": ""})()
        streams = [servicer.Watch(request, _Context()) for _ in range(50)]
        firsts = await asyncio.gather(*(stream.__anext__() for stream in streams))
        assert {first.status for first in firsts} == {1}  # SERVING
        refused = _Context()
        with pytest.raises(grpc.RpcError):
            await servicer.Watch(request, refused).__anext__()
        assert refused.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED and "--max_watch_streams" in refused.aborted[1]
        calls.clear()
        await asyncio.sleep(0.2)
        assert len(calls) < 40  # one reader for 50 streams: ~20 reads, not 1000
        state["ready"] = False
        seconds = await asyncio.wait_for(asyncio.gather(*(stream.__anext__() for stream in streams)), 5)
        assert {second.status for second in seconds} == {2}  # NOT_SERVING, each stream told of the change
        servicer.close()
        for stream in streams:
            await stream.aclose()
        assert servicer._watchers == 0  # pylint: disable=protected-access

    asyncio.run(scenario())


def test_health_watch_reads_the_readiness_only_when_a_change_is_signalled():
    calls = []
    state = {"ready": True}
    changes = ChangeSignal()

    def readiness():
        calls.append(1)
        return Readiness(state["ready"], SERVING)

    async def scenario():
        servicer = HealthServicer(readiness, max_watch_streams=10, changes=changes)
        request = type("Request", (), {"service": ""})()
        streams = [servicer.Watch(request, _Context()) for _ in range(10)]
        assert {first.status for first in await asyncio.gather(*(s.__anext__() for s in streams))} == {1}
        await asyncio.sleep(0.05)  # the reader's first read, as it starts
        calls.clear()
        await asyncio.sleep(0.3)  # a quiet spell is the point: without a signal nothing is read
        assert not calls
        state["ready"] = False
        threading.Thread(target=changes.notify).start()  # the master signals from its own threads
        seconds = await asyncio.wait_for(asyncio.gather(*(s.__anext__() for s in streams)), 2)
        assert {second.status for second in seconds} == {2} and len(calls) == 1
        servicer.close()
        for stream in streams:
            await stream.aclose()

    asyncio.run(scenario())


def test_a_change_signal_wakes_waiters_of_any_loop_and_times_out_without_one():
    changes = ChangeSignal()

    async def waits(seen, timeout):
        return await changes.wait(seen, timeout)

    assert asyncio.run(waits(changes.version, 0.01)) == 0  # no change: back after the timeout
    assert not changes._waiters  # pylint: disable=protected-access
    changes.notify()
    assert asyncio.run(waits(0, 5)) == 1  # a change since `seen`: at once
    woken = []
    thread = threading.Thread(target=lambda: woken.append(asyncio.run(waits(1, 5))))
    thread.start()
    wait_until(lambda: changes._waiters, 5, "a waiter")  # pylint: disable=protected-access
    changes.notify()
    thread.join(5)
    assert woken == [2]


def test_stop_strings_are_capped_in_count_and_length():
    SamplingParams(stop=["x" * MAX_STOP_LENGTH] * MAX_STOP_STRINGS)
    with pytest.raises(InvalidRequestError, match="at most 16 stop strings"):
        SamplingParams(stop=["x"] * (MAX_STOP_STRINGS + 1))
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_STOP_LENGTH} characters"):
        SamplingParams(stop=["x" * (MAX_STOP_LENGTH + 1)])
