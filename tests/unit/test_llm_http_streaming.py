"""What every LLM protocol shares: a client that goes away cancels the backend's stream (streamed and not),
keep-alive comments, the per-request timing log line, and the one error -> HTTP mapping table."""

import asyncio

import grpc
import orjson
import pytest
from fastapi import FastAPI, Request
from starlette.testclient import TestClient

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.errors import GenerationFailed, IncompleteGeneration, InvalidParam
from mindspore_serving.frontends.errors import RETRY_AFTER_S, Protocol, grpc_error, http_error, http_error_headers
from mindspore_serving.frontends.llm import build_llm_router, mindspore_generate_stream
from mindspore_serving.frontends.llm.testing import FakeLlmBackend, call_asgi, parse_sse
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.master.llm_types import Overloaded

DEADLINE_S = 30
"""A broken disconnect path fails the test instead of hanging it."""
CHAT = {"model": "llama_tiny", "messages": [{"role": "user", "content": "Hi"}]}
STREAMS = [  # route, body, number of data events sent before the first token
    ("/generate_stream", {"inputs": "Hi"}, 0),
    ("/", {"inputs": "Hi", "stream": True}, 0),
    ("/v1/completions", {"model": "llama_tiny", "prompt": "Hi", "stream": True}, 0),
    ("/v1/chat/completions", {**CHAT, "stream": True}, 1),
    ("/models/llama_tiny/generate_stream", {"inputs": "Hi"}, 0),
    ("/model/llama_tiny:generate_stream", {"instances": [{"prompt": "Hi"}]}, 0),
]
FULL = [
    ("/generate", {"inputs": "Hi"}),
    ("/", {"inputs": "Hi"}),
    ("/v1/completions", {"model": "llama_tiny", "prompt": "Hi"}),
    ("/v1/chat/completions", CHAT),
    ("/models/llama_tiny/generate", {"inputs": "Hi"}),
    ("/models/llama_tiny", {"inputs": "Hi"}),
]


def build_app(backend: FakeLlmBackend, **options) -> FastAPI:
    app = FastAPI()
    app.include_router(build_llm_router(backend, **options))

    @app.post("/model/{model}:generate_stream")
    async def _classic(model: str, request: Request):
        return await mindspore_generate_stream(backend, model, await request.body(), **options)

    return app


@pytest.mark.parametrize("route, body, head", STREAMS)
def test_client_closing_a_stream_cancels_the_backend_stream(route, body, head):
    backend = FakeLlmBackend()
    backend.stall_after = 2
    with TestClient(build_app(backend)) as client:
        with client.stream("POST", route, json=body) as reply:
            assert reply.status_code == 200
            data = []
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    data.append(line)
                if len(data) == head + 2:
                    break
        assert backend.stalled.is_set()
    assert list(backend.outcomes.values()) == ["cancelled"]


@pytest.mark.parametrize("route, body, head", STREAMS)
def test_disconnect_message_mid_stream_cancels_the_backend_stream(route, body, head):
    backend = FakeLlmBackend()
    backend.stall_after = 2

    async def scenario():
        disconnect = asyncio.Event()
        backend.on_stall = disconnect.set
        return await asyncio.wait_for(
            call_asgi(build_app(backend), route, orjson.dumps(body), disconnect=disconnect), DEADLINE_S
        )

    status, chunks = asyncio.run(scenario())
    assert status == 200
    events = parse_sse(b"".join(chunks).decode())
    assert len(events) == head + 2  # the two tokens before the stall, and no end: the client is gone
    assert list(backend.outcomes.values()) == ["cancelled"]


@pytest.mark.parametrize("route, body", FULL)
def test_disconnect_while_generating_a_full_reply_cancels_it(route, body):
    backend = FakeLlmBackend()
    backend.stall_after = 1

    async def scenario():
        disconnect = asyncio.Event()
        backend.on_stall = disconnect.set
        return await asyncio.wait_for(
            call_asgi(build_app(backend), route, orjson.dumps(body), disconnect=disconnect), DEADLINE_S
        )

    status, chunks = asyncio.run(scenario())
    assert (status, chunks) == (None, [])  # nothing was sent: nobody is listening
    assert list(backend.outcomes.values()) == ["cancelled"]


def test_keep_alive_comments_while_the_stream_is_idle():
    backend = FakeLlmBackend()
    backend.stall_after = 1
    with TestClient(build_app(backend, keep_alive_s=0.01)) as client:
        with client.stream("POST", "/generate_stream", json={"inputs": "Hi"}) as reply:
            lines = []
            for line in reply.iter_lines():
                lines.append(line)
                if line == ": keep-alive":
                    break
    assert lines[0].startswith("data: {")
    assert list(backend.outcomes.values()) == ["cancelled"]


@pytest.mark.parametrize("route, body, head", STREAMS)
def test_every_stream_is_well_formed_sse(route, body, head):
    with TestClient(build_app(FakeLlmBackend())) as client:
        reply = client.post(route, json=body)
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["cache-control"] == "no-cache"
    events = parse_sse(reply.text)
    assert len(events) >= head + 5


def test_timing_is_logged_per_request(monkeypatch):
    lines = []
    monkeypatch.setattr(log, "info", lambda message, *args, **kwargs: lines.append(message))
    backend = FakeLlmBackend()
    with TestClient(build_app(backend)) as client:
        client.post("/generate_stream", json={"inputs": "Hi there"})
        backend.stall_after = 1
        with client.stream(
            "POST", "/v1/completions", json={"model": "llama_tiny", "prompt": "x", "stream": True}
        ) as reply:
            next(reply.iter_lines())
        backend.stall_after = None
        backend.fail_before = Overloaded("queue is full")
        client.post("/generate", json={"inputs": "Hi"})
    generation_lines = [line for line in lines if line.startswith("LLM request")]
    assert len(generation_lines) == 3
    done, cancelled, failed = generation_lines
    assert "(tgi, model llama_tiny) finished (eos): prompt_tokens=2 completion_tokens=5 queue=1.0ms ttft=" in done
    for name in ("itl=", "e2e=", "(engine: ttft=2.0ms itl=0.5ms e2e=4.0ms)"):
        assert name in done
    assert "(openai, model llama_tiny) cancelled after 1 tokens (client went away)" in cancelled
    assert "failed (queue is full)" in failed


OK, EXHAUSTED, UNAVAILABLE = grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    "error, tgi, openai, mindspore, grpc_status",
    [
        (InvalidParam("bad", "top_k"), (422, "validation"), (400, "invalid_request_error", None), 200, OK),
        (InvalidRequestError("bad"), (422, "validation"), (400, "invalid_request_error", None), 200, OK),
        (Overloaded("full"), (429, "overloaded"), (429, "requests", "rate_limit_exceeded"), 200, EXHAUSTED),
        (
            errors.ServableUnavailable("gone"),
            (404, "not_found"),
            (404, "invalid_request_error", "model_not_found"),
            200,
            OK,
        ),
        (
            errors.WorkerUnavailable("down"),
            (503, "unavailable"),
            (503, "server_error", "service_unavailable"),
            503,
            UNAVAILABLE,
        ),
        (errors.Failed("oops"), (424, "generation"), (500, "server_error", None), 200, OK),
        (errors.SystemError_("oops"), (424, "generation"), (500, "server_error", None), 200, OK),
        (GenerationFailed("oops"), (424, "generation"), (500, "server_error", None), 200, OK),
        (
            IncompleteGeneration("cut"),
            (500, "incomplete_generation"),
            (500, "server_error", "incomplete_generation"),
            200,
            OK,
        ),
        (KeyError("bug"), (500, "internal"), (500, "server_error", None), 200, OK),
    ],
)
def test_error_mapping_table(error, tgi, openai, mindspore, grpc_status):
    status, body = http_error(Protocol.TGI, error)
    assert (status, body["error_type"]) == tgi
    status, body = http_error(Protocol.OPENAI, error)
    assert (status, body["error"]["type"], body["error"]["code"]) == openai
    assert body["error"]["param"] == getattr(error, "param", None)
    status, body = http_error(Protocol.MINDSPORE, error)
    assert status == mindspore and list(body) == ["error_msg"]
    assert grpc_error(error)[0] is grpc_status
    # "retry later" is one answer: Retry-After goes with every 503, and only with it
    retry = {"retry-after": str(RETRY_AFTER_S)} if tgi[0] == 503 else {}
    assert http_error_headers(error) == retry
