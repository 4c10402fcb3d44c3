"""The gRPC port of the secured server (secured_server.py), on both of its front ends, with a raw HTTP/2 client: a
call without the key is refused from its HEADERS, before its body is sent whole, and a connection that sends no
call is closed within the read timeout while other clients are served."""

import socket
import time

import hpack
import numpy as np
from secured_server import KEY, READ_TIMEOUT, TRIES, X

from mindspore_serving.client import Client
from mindspore_serving.frontends.h2grpc import frames as f

PREDICT = "/mindspore.serving.proto.MSService/Predict"


def _connect(grpc_addr: str) -> socket.socket:
    host, port = grpc_addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f.PREFACE + f.settings([]))
    return sock


def _closing_fields(sock: socket.socket, stream_id: int) -> dict:
    """The fields of the header block that ends `stream_id`, read from the connection."""
    decoder, buffer = hpack.Decoder(), b""
    while True:
        chunk = sock.recv(65536)
        assert chunk, "closed before the stream was answered"
        frames, buffer = f.cut(buffer + chunk, 1 << 24)
        for kind, flags, stream, payload in frames:
            if kind == f.HEADERS:
                fields = dict(decoder.decode(payload))
                if stream == stream_id and flags & f.END_STREAM:
                    return fields


def test_grpc_port_refuses_a_keyless_call_at_its_headers_and_closes_a_connection_without_calls(server):
    grpc_addr, _ = server
    silent = [_connect(grpc_addr) for _ in range(2 * TRIES)]  # the preface, and never a call
    try:
        started = time.monotonic()
        headers = hpack.Encoder().encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", PREDICT),
                (":authority", "x"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
        for _ in range(TRIES):  # new connections: both front ends answer some
            with _connect(grpc_addr) as sock:  # 16 KiB of a 50 MiB message: the rest is never sent
                sock.sendall(
                    f.frame(f.HEADERS, f.END_HEADERS, 1, headers)
                    + f.frame(f.DATA, 0, 1, b"\x00" + (50 << 20).to_bytes(4, "big") + b"\x00" * 16379)
                )
                fields = _closing_fields(sock, 1)
            assert fields["grpc-status"] == "16", fields  # UNAUTHENTICATED
        client = Client(grpc_addr, "add", "add_common", api_key=KEY)
        for _ in range(TRIES):
            assert np.array_equal(client.infer({"x1": X, "x2": X})[0]["y"], X * 2)
        for sock in silent:
            sock.settimeout(max(0.5, started + READ_TIMEOUT + 5 - time.monotonic()))
            while sock.recv(65536):  # its SETTINGS, then a GOAWAY, then closed (a timeout here raises)
                pass
        assert time.monotonic() - started < READ_TIMEOUT + 5
    finally:
        for sock in silent:
            sock.close()
