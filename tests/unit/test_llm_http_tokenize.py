"""vLLM's /tokenize and /detokenize against a fake backend: both body forms, what reaches the backend, the reply
shapes, and OpenAI's error shape and statuses (a chat template's refusal is a 400 with its message)."""

import pytest
from llm_http_app import backend_fixture, client_fixture  # noqa: F401  (the fixtures)

from mindspore_serving.common import errors
from mindspore_serving.frontends import api_groups
from mindspore_serving.frontends.errors import Protocol
from mindspore_serving.frontends.llm.testing import fake_token_ids
from mindspore_serving.frontends.restful_server import RestfulApp

MODEL = "llama_tiny"


def test_tokenize_a_prompt(client, backend):
    reply = client.post("/tokenize", json={"model": MODEL, "prompt": "Hello big world"})
    assert reply.status_code == 200
    assert reply.json() == {
        "count": 4,
        "max_model_len": 128,
        "tokens": fake_token_ids("Hello big world", True),
        "token_strs": None,
    }
    request = backend.tokenize_requests[-1]
    assert (request.model, request.prompt, request.messages, request.add_special_tokens) == (
        MODEL,
        "Hello big world",
        None,
        True,
    )
    bare = client.post("/tokenize", json={"prompt": "Hi", "add_special_tokens": False, "return_token_strs": True})
    assert bare.json()["tokens"] == fake_token_ids("Hi", False)  # the only model served, when none is named
    assert bare.json()["token_strs"] == [f"t{i}" for i in fake_token_ids("Hi", False)]


def test_tokenize_chat_messages_passes_the_template_inputs_through(client, backend):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            call,
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ],
        "tools": tools,
        "documents": [{"title": "T", "text": "x"}],
        "add_generation_prompt": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    reply = client.post("/tokenize", json=body)
    assert reply.status_code == 200, reply.text
    request = backend.tokenize_requests[-1]
    assert request.messages == [
        {"role": "user", "content": "Hi there"},
        call,
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    assert (request.tools, request.documents, request.chat_template_kwargs) == (
        tools,
        [{"title": "T", "text": "x"}],
        {"enable_thinking": False},
    )
    assert (request.add_generation_prompt, request.add_special_tokens, request.continue_final_message) == (
        False,
        None,
        False,
    )  # unset: as a generation of these messages tokenizes them
    assert reply.json()["tokens"] == fake_token_ids("<|user|>\nHi there\n<|assistant|>\nNone\n<|tool|>\nsunny\n", False)


def test_detokenize(client):
    reply = client.post("/detokenize", json={"model": MODEL, "tokens": [5, 7]})
    assert (reply.status_code, reply.json()) == (200, {"prompt": "t5 t7"})


@pytest.mark.parametrize(
    "route, body, status, code, message",
    [
        ("/tokenize", {"prompt": "x", "foo": 1}, 400, None, "Unrecognized request argument supplied: foo"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ x }}"},
            400,
            None,
            "'chat_template' is not accepted: the model's own chat template is used",
        ),
        ("/tokenize", {"messages": []}, 400, None, "`messages`"),
        ("/tokenize", {"messages": [{"content": "x"}]}, 400, None, "`messages.0.role` is required"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            None,
            "'messages.0.content' parts of type 'image_url' are not supported",
        ),
        ("/tokenize", {"model": "gpt-4", "prompt": "x"}, 404, "model_not_found", "The model `gpt-4` does not exist"),
        ("/detokenize", {"tokens": [-1]}, 400, None, "`tokens.0`"),
        ("/detokenize", {"tokens": [True]}, 400, None, "`tokens.0`"),
        ("/detokenize", {"tokens": [500]}, 400, None, "token id 500 is not in this model's vocabulary [0, 100)"),
        ("/detokenize", {"model": "gpt-4", "tokens": [1]}, 404, "model_not_found", "The model `gpt-4` does not exist"),
    ],
)
def test_errors_are_openais(client, route, body, status, code, message):
    reply = client.post(route, json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert message in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == code


def test_a_templates_refusal_is_a_400_with_its_message(client, backend):
    backend.fail_before = errors.InvalidInputs(
        "After an optional system message, roles must alternate user, assistant, user, ..."
    )
    reply = client.post("/tokenize", json={"messages": [{"role": "assistant", "content": "x"}]})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == backend.fail_before.message
    backend.fail_before = errors.WorkerUnavailable("Model llama_tiny is not available: its worker is restarting")
    assert client.post("/detokenize", json={"tokens": [1]}).status_code == 503


def test_the_routes_are_inference_routes_with_openai_errors():
    for path in ("/tokenize", "/detokenize"):
        assert api_groups.http_group("POST", path) == api_groups.INFERENCE
        assert RestfulApp.protocol_of(RestfulApp.__new__(RestfulApp), {"path": path}) is Protocol.OPENAI
