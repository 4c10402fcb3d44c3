"""OpenAI routes of the LLM front end against a fake backend: /v1/models, /v1/completions,
/v1/chat/completions, streamed and not, usage, logprobs, and OpenAI's error shape and statuses."""
import pytest

from mindspore_serving.common import errors
from mindspore_serving.master.llm_types import ChatMessage, Overloaded
from mindspore_serving.frontends.llm.testing import parse_sse
from llm_http_app import backend_fixture, client_fixture  # noqa: F401  (the fixtures)

MODEL = "llama_tiny"
USAGE = {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}


def _without_ids(payload: dict) -> dict:
    payload = dict(payload)
    assert isinstance(payload.pop("created"), int)
    payload.pop("id")
    return payload


def test_models(client, backend):
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"], m["max_model_len"]) for m in models["data"]] == [
        (MODEL, "model", "mindspore-serving", 128)]
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    reply = client.get("/v1/models/gpt-4")
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found"
    backend.served = []
    assert client.get("/v1/models").json() == {"object": "list", "data": []}


def test_completion(client, backend):
    reply = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi there"})
    assert reply.status_code == 200
    payload = reply.json()
    assert payload["id"].startswith("cmpl-")
    assert _without_ids(payload) == {
        "object": "text_completion", "model": MODEL,
        "choices": [{"index": 0, "text": "Hello, world!", "logprobs": None, "finish_reason": "stop"}],
        "usage": USAGE}
    assert backend.requests[-1].prompt == "Hi there"
    assert backend.requests[-1].params == {"max_new_tokens": 16}
    assert reply.headers["x-generated-tokens"] == "5"


def test_completion_parameters(client, backend):
    reply = client.post("/v1/completions", json={
        "model": MODEL, "prompt": ["Hi there"], "max_tokens": 2, "temperature": 0, "top_p": 0.5, "seed": 7,
        "stop": "!", "top_k": 3, "repetition_penalty": 1.1, "ignore_eos": True, "user": "me",
        "presence_penalty": 0, "frequency_penalty": 0, "n": 1, "best_of": 1, "logit_bias": {}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    assert backend.requests[-1].params == {"max_new_tokens": 2, "temperature": 0, "top_p": 0.5, "top_k": 3,
                                           "repetition_penalty": 1.1, "seed": 7, "stop": ["!"], "ignore_eos": True}


def test_completion_echo_stop_and_logprobs(client):
    payload = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi ", "echo": True,
                                                   "stop": [" world"], "logprobs": 0}).json()
    choice = payload["choices"][0]
    assert choice["text"] == "Hi Hello,"
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] == {"tokens": ["Hello", ",", ""], "token_logprobs": [-0.25, -0.5, -0.75],
                                  "top_logprobs": None, "text_offset": [3, 8, 9]}


def test_completion_stream(client):
    reply = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi there", "stream": True,
                                                 "max_tokens": 2})
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(reply.text)
    assert events[-1] == "[DONE]"
    chunks = [_without_ids(e) for e in events[:-1]]
    assert chunks == [
        {"object": "text_completion", "model": MODEL,
         "choices": [{"index": 0, "text": "Hello", "logprobs": None, "finish_reason": None}]},
        {"object": "text_completion", "model": MODEL,
         "choices": [{"index": 0, "text": ",", "logprobs": None, "finish_reason": None}]},
        {"object": "text_completion", "model": MODEL,
         "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}]
    assert len({e["id"] for e in events[:-1]}) == 1


def test_completion_stream_with_usage_echo_and_logprobs(client):
    events = parse_sse(client.post("/v1/completions", json={
        "model": MODEL, "prompt": "Hi ", "stream": True, "max_tokens": 1, "echo": True, "logprobs": 0,
        "stream_options": {"include_usage": True}}).text)
    assert [e["choices"] for e in events[:-2]] == [
        [{"index": 0, "text": "Hi ", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "Hello", "finish_reason": None,
          "logprobs": {"tokens": ["Hello"], "token_logprobs": [-0.25], "top_logprobs": None, "text_offset": [3]}}],
        [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]]
    assert all(e["usage"] is None for e in events[:-2])
    assert events[-2]["choices"] == []
    assert events[-2]["usage"] == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert events[-1] == "[DONE]"


def test_chat_completion(client, backend):
    reply = client.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 3,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "you"}]}]})
    assert reply.status_code == 200, reply.text
    payload = reply.json()
    assert payload["id"].startswith("chatcmpl-")
    assert _without_ids(payload) == {
        "object": "chat.completion", "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello, world"}, "logprobs": None,
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}
    request = backend.requests[-1]
    assert request.prompt is None
    assert request.messages == [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi you")]
    assert request.params == {"max_new_tokens": 3}


def test_chat_completion_logprobs_and_max_completion_tokens(client, backend):
    payload = client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "logprobs": True,
        "max_completion_tokens": 1}).json()
    assert payload["choices"][0]["logprobs"] == {
        "content": [{"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello"), "top_logprobs": []}]}
    assert backend.requests[-1].params == {"max_new_tokens": 1}


def test_chat_completion_stream(client):
    events = parse_sse(client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True,
        "stream_options": {"include_usage": True}}).text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": ""}, {"content": "Hello"}, {"content": ","}, {"content": " world"},
        {"content": "!"}, {}]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * 5 + ["stop"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert all(c["usage"] is None for c in chunks[:-1])


def test_chat_completion_stream_logprobs(client):
    events = parse_sse(client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True, "logprobs": True,
        "max_tokens": 1}).text)
    assert "usage" not in events[0]
    assert events[1]["choices"][0]["logprobs"] == {
        "content": [{"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello"), "top_logprobs": []}]}


@pytest.mark.parametrize("route, body, param, message", [
    ("/v1/completions", {"prompt": "x", "n": 2}, "n", "'n' must be 1"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, "best_of", "'best_of' must be 1"),
    ("/v1/completions", {"prompt": "x", "logprobs": 2}, "logprobs", "'logprobs' above 0 is not supported"),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix", "'suffix' is not supported"),
    ("/v1/completions", {"prompt": ["x", "y"]}, "prompt", "'prompt' must hold one prompt"),
    ("/v1/completions", {"prompt": [1, 2, 3]}, "prompt", "'prompt' must be text"),
    ("/v1/completions", {"prompt": ""}, "prompt", "'prompt' must not be empty"),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 1}, "frequency_penalty",
     "'frequency_penalty' other than 0 is not supported"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"1": 5}}, "logit_bias", "'logit_bias' is not supported"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options",
     "The 'stream_options' parameter is only allowed when 'stream' is enabled."),
    ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop",
     "`stop` supports up to 4 stop sequences"),
    ("/v1/completions", {"prompt": "x", "temperature": 3}, "temperature",
     "`temperature`: Input should be less than or equal to 2"),
    ("/v1/completions", {"prompt": "x", "colour": "red"}, "colour",
     "Unrecognized request argument supplied: colour"),
    ("/v1/completions", {"prompt": "x", "seed": -1}, None, "seed must be an int in [0, 2**64 - 1]"),
    ("/v1/completions", {}, "prompt", "`prompt` is required"),
    ("/v1/chat/completions", {"messages": []}, "messages", "`messages`: List should have at least 1 item"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools", "'tools' is not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     "top_logprobs", "'top_logprobs' above 0 is not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content", "'messages.0.content' parts of type 'image_url' are not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role",
     "`messages.0.role`: Input should be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_object"}}, "response_format",
     "'response_format' other than"),
])
def test_validation_errors(client, backend, route, body, param, message):
    reply = client.post(route, json={"model": MODEL, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["message"].startswith(message), error["message"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, None)
    assert not backend.requests


def test_unknown_model_is_a_404(client, backend):
    for route, body in (("/v1/completions", {"prompt": "x"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        reply = client.post(route, json={"model": "gpt-4", **body})
        assert reply.status_code == 404
        assert reply.json() == {"error": {
            "message": "The model `gpt-4` does not exist; served language models: llama_tiny",
            "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
    assert not backend.requests


@pytest.mark.parametrize("error, status, error_type, code", [
    (errors.InvalidInputs("prompt too long"), 400, "invalid_request_error", None),
    (Overloaded("queue is full"), 429, "requests", "rate_limit_exceeded"),
    (errors.ServableUnavailable("Model llama_tiny is not a language model"), 404, "invalid_request_error",
     "model_not_found"),
    (errors.WorkerUnavailable("the worker stopped"), 503, "server_error", "service_unavailable"),
    (errors.Failed("the model step failed"), 500, "server_error", None),
    (RuntimeError("boom"), 500, "server_error", None),
])
def test_backend_errors(client, backend, error, status, error_type, code):
    backend.fail_before = error
    message = error.message if isinstance(error, errors.ServingError) else "internal error: see the server log"
    for stream in (False, True):
        reply = client.post("/v1/chat/completions", json={"model": MODEL, "stream": stream,
                                                          "messages": [{"role": "user", "content": "x"}]})
        assert reply.status_code == status
        assert reply.json() == {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def test_error_in_the_middle_of_a_stream(client, backend):
    backend.fail_after = (1, errors.Failed("the model step failed"))
    for route, body in (("/v1/completions", {"prompt": "x"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        reply = client.post(route, json={"model": MODEL, "stream": True, **body})
        assert reply.status_code == 200
        events = parse_sse(reply.text)
        assert events[-2:] == [{"error": {"message": "the model step failed", "type": "server_error",
                                          "param": None, "code": None}}, "[DONE]"]
        assert "finish_reason" not in str(events[-3]) or events[-3]["choices"][0]["finish_reason"] is None


def test_incomplete_stream(client, backend):
    backend.omit_final = True
    reply = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert reply.status_code == 500
    assert reply.json()["error"]["code"] == "incomplete_generation"
