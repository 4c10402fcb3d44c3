"""The RESTful front end on a real socket with a fake dispatcher: keep-alive replies are not held back by Nagle."""
import asyncio
import http.client
import json
import socket
import statistics
import threading
import time

import numpy as np
import pytest

from mindspore_serving.common.tensor_codec import instance_to_proto, tensor_to_value
from mindspore_serving.frontends.restful_server import RestfulFrontend, _with_tcp_proto


class EchoDispatcher:
    """y = x1 + x2 for every instance, answered at once."""

    async def predict(self, spec, instances):
        return [instance_to_proto({"y": tensor_to_value(i.items["x1"]) + tensor_to_value(i.items["x2"])})
                for i in instances]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def frontend():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    port = free_port()
    server = RestfulFrontend(f"127.0.0.1:{port}", 100, None, EchoDispatcher())
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(5), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_listening_socket_gets_its_tcp_protocol():
    raw = socket.socket(socket.AF_INET)
    assert raw.proto == 0
    fixed = _with_tcp_proto(raw)
    try:
        assert fixed.proto == socket.IPPROTO_TCP and fixed.family == socket.AF_INET
    finally:
        fixed.close()


@pytest.mark.timeout(60)
def test_keep_alive_requests_are_answered_without_the_delayed_ack_wait(frontend):
    body = json.dumps({"instances": [{"x1": [[1.0, 2.0]], "x2": [[3.0, 4.0]]}]})
    conn = http.client.HTTPConnection("127.0.0.1", frontend, timeout=10)
    times = []
    try:
        for _ in range(12):
            started = time.perf_counter()
            conn.request("POST", "/model/add:add_common", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = json.loads(reply.read())
            times.append(time.perf_counter() - started)
            assert reply.status == 200
            np.testing.assert_allclose(data["instances"][0]["y"], [[4.0, 6.0]])
    finally:
        conn.close()
    # with Nagle on, each keep-alive reply (headers and body written separately) waited ~40 ms for an ACK
    assert statistics.median(times[2:]) < 0.02
