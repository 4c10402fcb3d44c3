"""MindSpore's LLM protocols against a fake backend: LLM-serving's /models/{model}[/generate|/generate_stream]
and the classic `/model/{model}:generate_stream` reply built by mindspore_generate_stream."""
import pytest
from fastapi import FastAPI, Request
from starlette.testclient import TestClient

from mindspore_serving.common import errors
from mindspore_serving.frontends.llm import build_llm_router, mindspore_generate_stream
from mindspore_serving.master.llm_types import Overloaded
from mindspore_serving.frontends.llm.testing import parse_sse
from llm_http_app import backend_fixture  # noqa: F401  (the fixture)

TOKENS = [{"id": 10, "logprob": -0.25, "special": False, "text": "Hello"},
          {"id": 11, "logprob": -0.5, "special": False, "text": ","},
          {"id": 12, "logprob": -0.75, "special": False, "text": " world"},
          {"id": 13, "logprob": -1.0, "special": False, "text": "!"},
          {"id": 2, "logprob": -1.25, "special": True, "text": ""}]


@pytest.fixture(name="client")
def _client(backend):
    app = FastAPI()
    app.include_router(build_llm_router(backend))

    @app.post("/model/{model}:generate_stream")
    async def _classic(model: str, request: Request):
        return await mindspore_generate_stream(backend, model, await request.body())

    with TestClient(app) as client:
        yield client


def test_generate_full_reply(client, backend):
    reply = client.post("/models/llama_tiny/generate", json={"inputs": "Hi "})
    assert reply.status_code == 200
    assert reply.json() == {"generated_text": "Hi Hello, world!", "finish_reason": "eos", "generated_tokens": 5,
                            "prefill": TOKENS[:1], "seed": 0, "tokens": TOKENS, "top_tokens": [TOKENS[:1]],
                            "details": None}
    assert reply.headers["x-generated-tokens"] == "5"
    assert backend.requests[-1].params == {"max_new_tokens": 300, "temperature": 1.0, "top_k": 3, "top_p": 1.0,
                                           "repetition_penalty": 1.0, "do_sample": False}


def test_parameters_the_reference_ignored_take_effect(client, backend):
    reply = client.post("/models/llama_tiny/generate", json={"inputs": "Hi ", "parameters": {
        "do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3,
        "max_new_tokens": 8, "seed": 11, "stop": " world", "return_full_text": False,
        "details": True, "watermark": False, "typical_p": None}})
    assert reply.json()["generated_text"] == "Hello,"
    assert reply.json()["finish_reason"] == "stop"
    assert reply.json()["seed"] == 11
    assert backend.requests[-1].params == {"max_new_tokens": 8, "temperature": 0.7, "top_k": 5, "top_p": 0.9,
                                           "repetition_penalty": 1.3, "do_sample": True, "seed": 11,
                                           "stop": [" world"]}


def test_generate_stream_is_well_formed_sse(client):
    reply = client.post("/models/llama_tiny/generate_stream", json={"inputs": "Hi ",
                                                                     "parameters": {"max_new_tokens": 2}})
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.text.startswith("retry: 30000\n\n")
    assert parse_sse(reply.text) == [
        {"details": None, "generated_text": "Hello", "tokens": TOKENS[0], "top_tokens": [TOKENS[0]]},
        {"details": None, "generated_text": ",", "tokens": TOKENS[1], "top_tokens": [TOKENS[1]]},
        {"details": None, "generated_text": "Hi Hello,", "finish_reason": "length", "generated_tokens": 2,
         "tokens": TOKENS[:2]}]


def test_stream_field_chooses_and_raw_protocol(client):
    full = client.post("/models/llama_tiny", json={"inputs": "Hi", "parameters": {"max_new_tokens": 1}})
    assert full.json()["generated_text"] == "HiHello"
    raw = client.post("/models/llama_tiny", json={"inputs": "Hi", "stream": True, "parameters": {
        "max_new_tokens": 1, "return_protocol": "raw", "return_full_text": False}})
    assert raw.headers["content-type"].startswith("text/plain")
    lines = raw.text.split("\n")
    assert lines[-1] == "" and all(line.startswith("data:{") for line in lines[:-1])
    assert len(lines) == 3
    assert '"finish_reason":"length"' in lines[1]


@pytest.mark.parametrize("parameters, message", [
    ({"temperature": -1}, "temperature must be a finite number >= 0"),
    ({"do_sample": True, "temperature": 0}, "do_sample=True needs temperature > 0"),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a finite number > 0"),
    ({"return_protocol": "xml"}, "`parameters.return_protocol`: Input should be 'sse' or 'raw'"),
    ({"truncate": 5, "watermark": True}, "`truncate`, `watermark` not supported by this server"),
    ({"mystery": 1}, "unknown field `parameters.mystery`"),
])
def test_validation_errors(client, backend, parameters, message):
    for route in ("/models/llama_tiny/generate", "/models/llama_tiny/generate_stream"):
        reply = client.post(route, json={"inputs": "x", "parameters": parameters})
        assert reply.status_code == 422
        assert reply.json()["error_type"] == "validation"
        assert reply.json()["error"].startswith("Input validation error: " + message), reply.json()
    assert not backend.requests


def test_unknown_model_and_overload(client, backend):
    reply = client.post("/models/gpt/generate", json={"inputs": "x"})
    assert reply.status_code == 404
    assert reply.json()["error_type"] == "not_found"
    backend.fail_before = Overloaded("queue is full")
    reply = client.post("/models/llama_tiny/generate_stream", json={"inputs": "x"})
    assert reply.status_code == 429
    assert reply.json() == {"error": "Model is overloaded: queue is full", "error_type": "overloaded"}


def test_mid_stream_error_raw_and_sse(client, backend):
    backend.fail_after = (1, errors.Failed("device lost"))
    events = parse_sse(client.post("/models/llama_tiny/generate_stream", json={"inputs": "x"}).text)
    assert events[-1] == {"error": "Request failed during generation: device lost", "error_type": "generation"}
    raw = client.post("/models/llama_tiny/generate_stream", json={"inputs": "x",
                                                                   "parameters": {"return_protocol": "raw"}})
    assert raw.text.endswith('data:{"error":"Request failed during generation: device lost",'
                             '"error_type":"generation"}\n')


def test_classic_generate_stream(client, backend):
    reply = client.post("/model/llama_tiny:generate_stream", json={"instances": [
        {"prompt": "Hi there", "max_new_tokens": 2, "temperature": 0}]})
    assert reply.status_code == 200
    events = parse_sse(reply.text)
    assert events[:2] == [{"index": 0, "token": {"id": 10, "text": "Hello", "logprob": -0.25, "special": False}},
                          {"index": 1, "token": {"id": 11, "text": ",", "logprob": -0.5, "special": False}}]
    assert events[2] == {"generated_text": "Hello,", "finish_reason": "length", "token_ids": [10, 11],
                         "details": {"prompt_tokens": 2, "completion_tokens": 2, "queue_time": 0.001,
                                     "time_to_first_token": 0.002, "inter_token_latency": 0.0005,
                                     "e2e_latency": 0.004}}
    assert backend.requests[-1].params == {"max_new_tokens": 2, "temperature": 0}
    reply = client.post("/model/llama_tiny:generate_stream", json={"instances": [{"inputs": "Hi"}]})
    assert parse_sse(reply.text)[-1]["finish_reason"] == "eos"


@pytest.mark.parametrize("body, message", [
    ({"instances": []}, 'the body must be {"instances": [{"prompt": str, <sampling parameters>}]} with exactly '
                        'one instance'),
    ({"instances": [{"max_new_tokens": 3}]}, "the instance needs exactly one of 'prompt' or 'inputs'"),
    ({"instances": [{"prompt": "", "max_new_tokens": 3}]}, "'prompt' must be a non-empty string"),
    ({"instances": [{"prompt": "x", "beam_width": 3}]}, "unknown sampling parameters ['beam_width']"),
    ({"instances": [{"prompt": "x", "top_p": 0}]}, "top_p must be in (0, 1], got 0"),
])
def test_classic_errors_are_error_msg_with_status_200(client, body, message):
    reply = client.post("/model/llama_tiny:generate_stream", json=body)
    assert reply.status_code == 200
    assert reply.json()["error_msg"].startswith(message)


def test_classic_backend_and_mid_stream_errors(client, backend):
    reply = client.post("/model/nope:generate_stream", json={"instances": [{"prompt": "x"}]})
    assert reply.json()["error_msg"].startswith("The model `nope` does not exist")
    backend.fail_before = Overloaded("queue is full")
    assert client.post("/model/llama_tiny:generate_stream",
                       json={"instances": [{"prompt": "x"}]}).json() == {"error_msg": "queue is full"}
    backend.fail_before = None
    backend.fail_after = (1, errors.Failed("device lost"))
    events = parse_sse(client.post("/model/llama_tiny:generate_stream", json={"instances": [{"prompt": "x"}]}).text)
    assert len(events) == 2
    assert events[-1] == {"error_msg": "device lost"}


def test_classic_takes_a_parsed_body(backend):
    app = FastAPI()

    @app.post("/stream")
    async def _stream():
        return await mindspore_generate_stream(backend, "llama_tiny", {"instances": [{"prompt": "x",
                                                                                      "max_new_tokens": 1}]})

    events = parse_sse(TestClient(app).post("/stream").text)
    assert events[-1]["generated_text"] == "Hello"
