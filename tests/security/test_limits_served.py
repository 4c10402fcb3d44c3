"""Limits on every route of the secured server (secured_server.py), on both of its front ends: a body beyond its
route's limit is refused from its declared length, before it is sent; a slowloris connection is closed within
the read timeout while other clients are served; a thousand health Watch streams stay open while inference goes
on; the LLM's stop strings and prompts are capped with texts that name the limit."""

import asyncio
import socket
import time

import grpc
import numpy as np
import psutil
import pytest
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc
from raw_http import read_reply
from secured_server import ADD_BODY, ADMIN_KEY, AUTH, KEY, PROMPT, READ_TIMEOUT, TRIES, X

from mindspore_serving.client import Client

CLASSIC = 100 << 20  # max_msg_mb_size's default, in bytes
LLM = 2_000_000  # --llm_payload_limit's default
WATCH_STREAMS = 1000

POST_ROUTES = [  # path, declared length beyond its limit, status, a check of the body
    (
        "/model/add:add_common",
        CLASSIC + 1,
        200,
        lambda body: body == {"error_msg": f"http message is bigger than {CLASSIC}"},
    ),
    ("/model/add/version/1:add_common", CLASSIC + 1, 200, lambda body: "bigger than" in body["error_msg"]),
    ("/v2/models/add.add_common/infer", CLASSIC + 1, 413, lambda body: "max_msg_mb_size" in body["error"]),
    ("/v2/repository/models/add/load", CLASSIC + 1, 413, lambda body: "max_msg_mb_size" in body["error"]),
    ("/v1/completions", LLM + 1, 413, lambda body: body["error"]["code"] == "payload_too_large"),
    ("/v1/chat/completions", LLM + 1, 413, lambda body: "--llm_payload_limit" in body["error"]["message"]),
    ("/generate", LLM + 1, 413, lambda body: body["error_type"] == "payload_too_large"),
    ("/generate_stream", LLM + 1, 413, lambda body: f"limit of {LLM} bytes" in body["error"]),
    ("/", LLM + 1, 413, lambda body: body["error_type"] == "payload_too_large"),
    ("/models/llama_tiny/generate", LLM + 1, 413, lambda body: body["error_type"] == "payload_too_large"),
    ("/models/llama_tiny/generate_stream", LLM + 1, 413, lambda body: body["error_type"] == "payload_too_large"),
    ("/models/llama_tiny", LLM + 1, 413, lambda body: body["error_type"] == "payload_too_large"),
    ("/model/llama_tiny:generate_stream", LLM + 1, 200, lambda body: "--llm_payload_limit" in body["error_msg"]),
    ("/v2/models/add.add_common/versions/1/infer", CLASSIC + 1, 413, lambda body: "max_msg_mb_size" in body["error"]),
    ("/v2/repository/index", CLASSIC + 1, 413, lambda body: "max_msg_mb_size" in body["error"]),
    ("/v2/repository/models/add/unload", CLASSIC + 1, 413, lambda body: "max_msg_mb_size" in body["error"]),
]


def _address(url: str):
    host, port = url[len("http://") :].rsplit(":", 1)
    return host, int(port)


def _head(path: str, length: int, key=None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{"
    ).encode()


@pytest.mark.parametrize("path, length, status, check", POST_ROUTES, ids=[route[0] for route in POST_ROUTES])
def test_an_oversized_body_is_refused_before_it_is_sent(server, path, length, status, check):
    _, url = server
    for _ in range(TRIES // 2):  # new connections: both front ends answer some
        with socket.create_connection(_address(url), timeout=30) as sock:
            key = ADMIN_KEY if path.startswith("/v2/repository/") else KEY  # the group's key (secured_server.py)
            sock.sendall(_head(path, length, key))  # one byte of the body, the rest never comes
            got, body = read_reply(sock)
        assert got == status and check(body), body
        with socket.create_connection(_address(url), timeout=30) as sock:
            sock.sendall(_head(path, length))  # without the key: refused before anything else
            assert read_reply(sock)[0] == 401


def test_a_slowloris_connection_is_closed_within_the_read_timeout_while_others_are_served(server):
    _, url = server
    slow = []
    try:
        for _ in range(2 * TRIES):
            sock = socket.create_connection(_address(url), timeout=30)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest of its head
            slow.append(sock)
        started = time.monotonic()
        for _ in range(TRIES):
            reply = requests.post(url + "/model/add:add_common", json=ADD_BODY, headers=AUTH, timeout=30)
            assert reply.json() == {"instances": [{"y": (X * 2).tolist()}]}
        for sock in slow:
            sock.settimeout(max(1.0, started + READ_TIMEOUT + 20 - time.monotonic()))
            assert sock.recv(1) == b""  # closed by the server (a timeout here raises)
    finally:
        for sock in slow:
            sock.close()


def _front_end_cpu(master: psutil.Process) -> float:
    """CPU seconds spent so far by the master and its front-end processes."""
    front_ends = [master] + [child for child in master.children() if "frontend" in " ".join(child.cmdline())]
    return sum(sum(process.cpu_times()[:2]) for process in front_ends)


def test_a_thousand_health_watch_streams_while_inference_goes_on(server, server_process):
    grpc_addr, _ = server
    master = psutil.Process(server_process.proc.pid)

    async def scenario():
        # four connections (channels of their own subchannel pool), each within max_streams_per_conn (512)
        channels = [
            grpc.aio.insecure_channel(grpc_addr, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(4)
        ]
        calls = [
            health_pb2_grpc.HealthStub(channels[i % 4]).Watch(health_pb2.HealthCheckRequest())
            for i in range(WATCH_STREAMS)
        ]
        try:
            firsts = await asyncio.wait_for(asyncio.gather(*(call.read() for call in calls)), 120)
            assert {first.status for first in firsts} == {health_pb2.HealthCheckResponse.SERVING}
            # open and idle, the streams cost the front ends nothing: no reader runs until the readiness changes
            spent = _front_end_cpu(master)
            await asyncio.sleep(1.0)  # the quiet second measured
            assert _front_end_cpu(master) - spent < 0.3
            client = Client(grpc_addr, "add", "add_common", api_key=KEY)
            loop = asyncio.get_running_loop()
            for _ in range(TRIES):
                result = await loop.run_in_executor(None, client.infer, {"x1": X, "x2": X})
                np.testing.assert_array_equal(result[0]["y"], X * 2)
        finally:
            for call in calls:
                call.cancel()
            for channel in channels:
                await channel.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "body, text",
    [
        ({"stop": ["x"] * 5}, "stop"),
        ({"stop": ["x" * 257]}, "at most 256 characters"),
        ({"prompt": "a" * 200_000}, "engine.max_prompt_chars"),
    ],
)
def test_llm_requests_beyond_the_engine_s_caps_are_refused(server, body, text):
    _, url = server
    request = {"model": "llama_tiny", "prompt": PROMPT, "max_tokens": 2, **body}
    reply = requests.post(url + "/v1/completions", json=request, headers=AUTH, timeout=30)
    assert reply.status_code == 400 and text in reply.json()["error"]["message"], reply.text
