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
from mindspore_serving.frontends.http_protocol import CorkedTransport
from mindspore_serving.frontends.restful_server import RestfulFrontend, _with_tcp_proto, request_target


class EchoDispatcher:
    """y = x1 + x2 for every instance, answered at once."""

    async def predict(self, spec, instances):
        return [
            instance_to_proto({"y": tensor_to_value(i.items["x1"]) + tensor_to_value(i.items["x2"])}) for i in instances
        ]


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
        yield server
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
    conn = http.client.HTTPConnection("127.0.0.1", frontend.port, timeout=10)
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


def test_connections_write_through_a_corked_transport(frontend):
    """Each reply's head and body leave in one send (http_protocol.py)."""
    conn = http.client.HTTPConnection("127.0.0.1", frontend.port, timeout=10)
    try:
        conn.request("POST", "/model/add:add_common", json.dumps({"instances": [{"x1": [1.0], "x2": [2.0]}]}))
        reply = conn.getresponse()
        assert reply.status == 200 and json.loads(reply.read())["instances"][0]["y"] == [3.0]
        connections = list(frontend.server.server_state.connections)
        assert connections and all(isinstance(c.transport, CorkedTransport) for c in connections)
    finally:
        conn.close()


class RecordingTransport:
    def __init__(self):
        self.sent, self.closed = [], False

    def writelines(self, chunks):
        self.sent.append(b"".join(chunks))

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default


def test_corked_transport_sends_one_turn_s_writes_together_and_flushes_before_closing():
    loop = asyncio.new_event_loop()
    try:
        inner = RecordingTransport()
        corked = CorkedTransport(inner, loop)
        corked.write(b"head ")
        corked.write(b"")
        corked.write(b"body")
        assert inner.sent == []  # nothing leaves within the turn
        loop.run_until_complete(asyncio.sleep(0))
        assert inner.sent == [b"head body"]
        corked.write(b"last")
        corked.close()  # what is gathered leaves before the close
        assert inner.sent == [b"head body", b"last"] and inner.closed
        loop.run_until_complete(asyncio.sleep(0))  # the scheduled flush finds nothing more
        assert inner.sent == [b"head body", b"last"]
        assert corked.get_extra_info("peername") == ("127.0.0.1", 1) and corked.is_closing()
    finally:
        loop.close()


# ---------------------------------------------------------------- TLS files, checked in MindSpore Serving's order


def _self_signed(directory, name):
    import subprocess

    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.crt",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        cwd=directory,
        check=True,
        capture_output=True,
    )
    return str(directory / f"{name}.crt"), str(directory / f"{name}.key")


def test_bad_tls_files_fail_with_mindspore_serving_s_texts(tmp_path):
    from mindspore_serving.frontends.restful_server import _check_ssl
    from mindspore_serving.server import SSLConfig

    cert, key = _self_signed(tmp_path, "a")
    _, other_key = _self_signed(tmp_path, "b")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a pem file\n")
    missing = str(tmp_path / "missing.pem")
    _check_ssl(SSLConfig(cert, key))
    _check_ssl(SSLConfig(cert, key, custom_ca=cert, verify_client=True))
    cases = [
        (SSLConfig(cert, str(garbage)), f"Serving Error: load private_key from {garbage} failed"),
        (SSLConfig(cert, missing), f"Serving Error: load private_key from {missing} failed"),
        (SSLConfig(cert, cert), f"Serving Error: load private_key from {cert} failed"),
        (SSLConfig(str(garbage), key), f"Serving Error: load certificate_chain from {garbage} failed"),
        (SSLConfig(key, key), f"Serving Error: load certificate_chain from {key} failed"),
        (SSLConfig(missing, str(garbage)), f"Serving Error: load certificate_chain from {missing} failed"),
        (SSLConfig(cert, other_key), f"Serving Error: load private_key from {other_key} failed"),  # not its key
        (
            SSLConfig(cert, key, custom_ca=str(garbage), verify_client=True),
            f"Serving Error: load root certificate from {garbage} failed",
        ),
    ]
    for ssl_config, text in cases:
        with pytest.raises(RuntimeError) as info:
            _check_ssl(ssl_config)
        assert str(info.value) == text
    # TLS is set up before the address is looked at
    with pytest.raises(RuntimeError, match=f"^Serving Error: load private_key from {garbage} failed$"):
        RestfulFrontend("unix:/tmp/x", 100, SSLConfig(cert, str(garbage)), EchoDispatcher())


def test_server_api_ssl_config_checks(tmp_path):
    from mindspore_serving import server

    cert, _ = _self_signed(tmp_path, "a")
    with pytest.raises(RuntimeError, match="^The type of ssl_config should be class of SSLConfig$"):
        server.start_restful_server(f"127.0.0.1:{free_port()}", ssl_config="x")
    with pytest.raises(RuntimeError, match="^The type of ssl_config should be type of SSLConfig$"):
        server.start_grpc_server(f"127.0.0.1:{free_port()}", ssl_config="x")
    # the gRPC server's files are read first, by open(), whose error comes out as it is
    with pytest.raises(FileNotFoundError, match="missing.pem"):
        server.start_grpc_server(
            f"127.0.0.1:{free_port()}", ssl_config=server.SSLConfig(cert, str(tmp_path / "missing.pem"))
        )


@pytest.mark.parametrize(
    "method, path, body, reply",
    [
        (
            "POST",
            "/mod/add:add_common",
            "{}",
            (200, {"error_msg": "please check url, the keyword:[model] must contain."}),
        ),
        (
            "POST",
            "/model/add",
            '{"instances": []}',
            (200, {"error_msg": "please check url, the keyword:[service method] must contain."}),
        ),
        ("POST", "/mod/add", "", (200, {"error_msg": "http message invalid"})),  # the body is checked first
        ("GET", "/anything", None, (200, {"error_msg": "http message only support POST right now"})),
        ("POST", "/", "{}", (404, {"detail": "Not Found"})),  # TGI's route: no LLM is served here
        ("POST", "/v1/completions", "{}", (404, {"detail": "Not Found"})),
    ],
)
def test_a_path_no_route_serves_gets_mindspore_serving_url_errors(frontend, method, path, body, reply):
    connection = http.client.HTTPConnection("127.0.0.1", frontend.port, timeout=30)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())) == reply
    finally:
        connection.close()


def test_the_url_is_parsed_as_sent_query_included(frontend):
    """As MindSpore Serving: what follows ':' is the method, a query string included, and the path is not decoded."""
    body = json.dumps({"instances": [{"x1": [1.0], "x2": [2.0]}]})
    connection = http.client.HTTPConnection("127.0.0.1", frontend.port, timeout=30)
    try:
        connection.request("POST", "/model/add:add_common", body=body)
        assert "instances" in json.loads(connection.getresponse().read())
        connection.request("POST", "/model/add/version/1abc:add_common", body=body)  # std::stol's numeric prefix
        assert "instances" in json.loads(connection.getresponse().read())
        connection.request("POST", "/model/a%64d:add_common", body=body)
        assert "instances" in json.loads(connection.getresponse().read())  # the echo dispatcher serves any name
    finally:
        connection.close()
    target = {"path": "/model/add:m", "raw_path": b"/model/a%64d:m", "query_string": b"x=1"}
    assert request_target(target) == "/model/a%64d:m?x=1"
    assert request_target({"path": "/model/add:m", "query_string": b""}) == "/model/add:m"
