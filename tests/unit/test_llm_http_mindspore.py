"""MindSpore's LLM protocols against a fake backend: LLM-serving's /models/{model}[/generate|/generate_stream]
and the classic `/model/{model}:generate_stream` reply built by mindspore_generate_stream; the engine's sampling
fields on both, top tokens and the scored prompt in their replies, and the refusal of several choices."""

import pytest
from fastapi import FastAPI, Request
from llm_http_app import backend_fixture  # noqa: F401  (the fixture)
from starlette.testclient import TestClient

from mindspore_serving.common import errors
from mindspore_serving.frontends.llm import build_llm_router, mindspore_generate_stream
from mindspore_serving.frontends.llm.testing import ScriptedLlmBackend, parse_sse
from mindspore_serving.master.llm_types import FinalEvent, Overloaded, PromptEvent, PromptToken, TokenEvent, TopLogprob

TOKENS = [
    {"id": 10, "logprob": -0.25, "special": False, "text": "Hello"},
    {"id": 11, "logprob": -0.5, "special": False, "text": ","},
    {"id": 12, "logprob": -0.75, "special": False, "text": " world"},
    {"id": 13, "logprob": -1.0, "special": False, "text": "!"},
    {"id": 2, "logprob": -1.25, "special": True, "text": ""},
]


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
    assert reply.json() == {
        "generated_text": "Hi Hello, world!",
        "finish_reason": "eos",
        "generated_tokens": 5,
        "prefill": TOKENS[:1],
        "seed": 0,
        "tokens": TOKENS,
        "top_tokens": [TOKENS[:1]],
        "details": None,
    }
    assert reply.headers["x-generated-tokens"] == "5"
    assert backend.requests[-1].params == {
        "max_new_tokens": 300,
        "temperature": 1.0,
        "top_k": 3,
        "top_p": 1.0,
        "repetition_penalty": 1.0,
        "do_sample": False,
    }


def test_parameters_the_reference_ignored_take_effect(client, backend):
    reply = client.post(
        "/models/llama_tiny/generate",
        json={
            "inputs": "Hi ",
            "parameters": {
                "do_sample": True,
                "temperature": 0.7,
                "top_k": 5,
                "top_p": 0.9,
                "repetition_penalty": 1.3,
                "max_new_tokens": 8,
                "seed": 11,
                "stop": " world",
                "return_full_text": False,
                "details": True,
                "watermark": False,
                "typical_p": None,
            },
        },
    )
    assert reply.json()["generated_text"] == "Hello,"
    assert reply.json()["finish_reason"] == "stop"
    assert reply.json()["seed"] == 11
    assert backend.requests[-1].params == {
        "max_new_tokens": 8,
        "temperature": 0.7,
        "top_k": 5,
        "top_p": 0.9,
        "repetition_penalty": 1.3,
        "do_sample": True,
        "seed": 11,
        "stop": [" world"],
    }


def test_generate_stream_is_well_formed_sse(client):
    reply = client.post(
        "/models/llama_tiny/generate_stream", json={"inputs": "Hi ", "parameters": {"max_new_tokens": 2}}
    )
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.text.startswith("retry: 30000\n\n")
    assert parse_sse(reply.text) == [
        {"details": None, "generated_text": "Hello", "tokens": TOKENS[0], "top_tokens": [TOKENS[0]]},
        {"details": None, "generated_text": ",", "tokens": TOKENS[1], "top_tokens": [TOKENS[1]]},
        {
            "details": None,
            "generated_text": "Hi Hello,",
            "finish_reason": "length",
            "generated_tokens": 2,
            "tokens": TOKENS[:2],
        },
    ]


def test_stream_field_chooses_and_raw_protocol(client):
    full = client.post("/models/llama_tiny", json={"inputs": "Hi", "parameters": {"max_new_tokens": 1}})
    assert full.json()["generated_text"] == "HiHello"
    raw = client.post(
        "/models/llama_tiny",
        json={
            "inputs": "Hi",
            "stream": True,
            "parameters": {"max_new_tokens": 1, "return_protocol": "raw", "return_full_text": False},
        },
    )
    assert raw.headers["content-type"].startswith("text/plain")
    lines = raw.text.split("\n")
    assert lines[-1] == "" and all(line.startswith("data:{") for line in lines[:-1])
    assert len(lines) == 3
    assert '"finish_reason":"length"' in lines[1]


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"temperature": -1}, "temperature must be a finite number >= 0"),
        ({"do_sample": True, "temperature": 0}, "do_sample=True needs temperature > 0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"repetition_penalty": 0}, "repetition_penalty must be a finite number > 0"),
        ({"return_protocol": "xml"}, "`parameters.return_protocol`: Input should be 'sse' or 'raw'"),
        ({"truncate": 5, "watermark": True}, "`truncate`, `watermark` not supported by this server"),
        ({"mystery": 1}, "unknown field `parameters.mystery`"),
    ],
)
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
    raw = client.post(
        "/models/llama_tiny/generate_stream", json={"inputs": "x", "parameters": {"return_protocol": "raw"}}
    )
    assert raw.text.endswith(
        'data:{"error":"Request failed during generation: device lost","error_type":"generation"}\n'
    )


def test_classic_generate_stream(client, backend):
    reply = client.post(
        "/model/llama_tiny:generate_stream",
        json={"instances": [{"prompt": "Hi there", "max_new_tokens": 2, "temperature": 0}]},
    )
    assert reply.status_code == 200
    events = parse_sse(reply.text)
    assert events[:2] == [
        {"index": 0, "token": {"id": 10, "text": "Hello", "logprob": -0.25, "special": False}},
        {"index": 1, "token": {"id": 11, "text": ",", "logprob": -0.5, "special": False}},
    ]
    assert events[2] == {
        "generated_text": "Hello,",
        "finish_reason": "length",
        "token_ids": [10, 11],
        "details": {
            "prompt_tokens": 2,
            "completion_tokens": 2,
            "queue_time": 0.001,
            "time_to_first_token": 0.002,
            "inter_token_latency": 0.0005,
            "e2e_latency": 0.004,
        },
    }
    assert backend.requests[-1].params == {"max_new_tokens": 2, "temperature": 0}
    reply = client.post("/model/llama_tiny:generate_stream", json={"instances": [{"inputs": "Hi"}]})
    assert parse_sse(reply.text)[-1]["finish_reason"] == "eos"


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"instances": []},
            'the body must be {"instances": [{"prompt": str, <sampling parameters>}]} with exactly one instance',
        ),
        ({"instances": [{"max_new_tokens": 3}]}, "the instance needs exactly one of 'prompt' or 'inputs'"),
        ({"instances": [{"prompt": "", "max_new_tokens": 3}]}, "'prompt' must be a non-empty string"),
        ({"instances": [{"prompt": "x", "beam_width": 3}]}, "unknown sampling parameters ['beam_width']"),
        ({"instances": [{"prompt": "x", "top_p": 0}]}, "top_p must be in (0, 1], got 0"),
    ],
)
def test_classic_errors_are_error_msg_with_status_200(client, body, message):
    reply = client.post("/model/llama_tiny:generate_stream", json=body)
    assert reply.status_code == 200
    assert reply.json()["error_msg"].startswith(message)


def test_classic_backend_and_mid_stream_errors(client, backend):
    reply = client.post("/model/nope:generate_stream", json={"instances": [{"prompt": "x"}]})
    assert reply.json()["error_msg"].startswith("The model `nope` does not exist")
    backend.fail_before = Overloaded("queue is full")
    assert client.post("/model/llama_tiny:generate_stream", json={"instances": [{"prompt": "x"}]}).json() == {
        "error_msg": "queue is full"
    }
    backend.fail_before = None
    backend.fail_after = (1, errors.Failed("device lost"))
    events = parse_sse(client.post("/model/llama_tiny:generate_stream", json={"instances": [{"prompt": "x"}]}).text)
    assert len(events) == 2
    assert events[-1] == {"error_msg": "device lost"}


def test_classic_takes_a_parsed_body(backend):
    app = FastAPI()

    @app.post("/stream")
    async def _stream():
        return await mindspore_generate_stream(
            backend, "llama_tiny", {"instances": [{"prompt": "x", "max_new_tokens": 1}]}
        )

    events = parse_sse(TestClient(app).post("/stream").text)
    assert events[-1]["generated_text"] == "Hello"


# the engine's sampling fields, top tokens and the scored prompt


_SCORED = [
    TokenEvent(10, "Hello", -0.25, False, 0, [TopLogprob(10, "Hello", -0.25), TopLogprob(20, "Hi", -1.5)]),
    TokenEvent(2, "", -0.5, True, 1, [TopLogprob(2, "</s>", -0.5), TopLogprob(13, "!", -1.0)]),
]
_PROMPT = PromptEvent([PromptToken(1, "<s>", None), PromptToken(30, "Hi", -2.0, [TopLogprob(31, "Ho", -1.0)])])
_FINAL = FinalEvent(text="Hello", token_ids=[10, 2], finish_reason="eos", prompt_tokens=2, completion_tokens=2)
_TOP_TOKENS = [
    [
        {"id": 10, "logprob": -0.25, "special": False, "text": "Hello"},
        {"id": 20, "logprob": -1.5, "special": False, "text": "Hi"},
    ],
    [
        {"id": 2, "logprob": -0.5, "special": True, "text": "</s>"},
        {"id": 13, "logprob": -1.0, "special": False, "text": "!"},
    ],
]
_PREFILL = [{"id": 1, "logprob": None, "text": "<s>"}, {"id": 30, "logprob": -2.0, "text": "Hi"}]


def _scripted_client(events) -> TestClient:
    backend = ScriptedLlmBackend(events)
    app = FastAPI()
    app.include_router(build_llm_router(backend))

    @app.post("/model/{model}:generate_stream")
    async def _classic(model: str, request: Request):
        return await mindspore_generate_stream(backend, model, await request.body())

    return TestClient(app)


_ENGINE_FIELDS = {
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "min_p": 0.1,
    "min_tokens": 1,
    "allowed_token_ids": [10, 11, 2],
    "logit_bias": {"11": -100.0},
    "structured_output": {"type": "regex", "value": "Hello.*"},
}


def test_llm_serving_takes_the_engines_sampling_fields(client, backend):
    reply = client.post(
        "/models/llama_tiny/generate",
        json={"inputs": "Hi", "parameters": {**_ENGINE_FIELDS, "bad_words": "world", "n": 1}},
    )
    assert reply.status_code == 200
    assert backend.requests[-1].params == {
        "max_new_tokens": 300,
        "temperature": 1.0,
        "top_k": 3,
        "top_p": 1.0,
        "repetition_penalty": 1.0,
        "do_sample": False,
        **_ENGINE_FIELDS,
        "bad_words": "world",
    }
    client.post(
        "/models/llama_tiny/generate",
        json={"inputs": "Hi", "parameters": {"top_n_tokens": 2, "decoder_input_details": True}},
    )
    assert backend.requests[-1].params["top_logprobs"] == 2 and backend.requests[-1].params["prompt_logprobs"] == 0
    client.post("/models/llama_tiny/generate_stream", json={"inputs": "Hi", "parameters": {"top_logprobs": 3}})
    assert backend.requests[-1].params["top_logprobs"] == 3


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"n": 2}, "`n` must be 1: the reply carries one generated text, got 2"),
        ({"top_n_tokens": 2, "top_logprobs": 3}, "`top_n_tokens` and `top_logprobs` name the same thing"),
        ({"min_p": 2}, "min_p must be in [0, 1], got 2.0"),
        ({"logit_bias": {"5": 200}}, "logit_bias values must be in [-100, 100], got 200.0 for token 5"),
        ({"structured_output": {"type": "cfg", "value": "x"}}, "structured output type must be one of"),
        ({"top_logprobs": 21}, "top_logprobs must be an int in [0, 20], got 21"),
    ],
)
def test_llm_serving_refusals_of_the_new_fields(client, backend, parameters, message):
    reply = client.post("/models/llama_tiny/generate", json={"inputs": "x", "parameters": parameters})
    assert reply.status_code == 422
    assert reply.json()["error"].startswith("Input validation error: " + message), reply.json()
    assert not backend.requests


def test_llm_serving_top_tokens_and_prefill_hold_what_they_name():
    client = _scripted_client([_PROMPT, *_SCORED, _FINAL])
    reply = client.post(
        "/models/llama_tiny/generate",
        json={
            "inputs": "Hi",
            "parameters": {"top_n_tokens": 2, "decoder_input_details": True, "return_full_text": False},
        },
    ).json()
    assert reply["top_tokens"] == _TOP_TOKENS
    assert reply["prefill"] == _PREFILL
    events = parse_sse(
        client.post(
            "/models/llama_tiny/generate_stream",
            json={"inputs": "Hi", "parameters": {"top_logprobs": 2, "decoder_input_details": True}},
        ).text
    )
    assert [e["top_tokens"] for e in events[:2]] == _TOP_TOKENS
    assert events[2]["prefill"] == _PREFILL


def test_classic_stream_takes_the_engines_fields_and_reports_scores():
    client = _scripted_client([_PROMPT, *_SCORED, _FINAL])
    reply = client.post(
        "/model/llama_tiny:generate_stream",
        json={
            "instances": [
                {"prompt": "Hi", **_ENGINE_FIELDS, "bad_words": ["world"], "top_logprobs": 2, "prompt_logprobs": 1}
            ]
        },
    )
    events = parse_sse(reply.text)
    assert events[0] == {
        "index": 0,
        "token": {
            "id": 10,
            "text": "Hello",
            "logprob": -0.25,
            "special": False,
            "top_logprobs": [{"id": 10, "text": "Hello", "logprob": -0.25}, {"id": 20, "text": "Hi", "logprob": -1.5}],
        },
    }
    assert events[2]["prompt_logprobs"] == [
        {"id": 1, "logprob": None, "text": "<s>", "top_logprobs": []},
        {"id": 30, "logprob": -2.0, "text": "Hi", "top_logprobs": [{"id": 31, "logprob": -1.0, "text": "Ho"}]},
    ]
    events = parse_sse(
        client.post(
            "/model/llama_tiny:generate_stream", json={"instances": [{"prompt": "Hi", "prompt_logprobs": 0}]}
        ).text
    )
    assert "top_logprobs" not in events[0]["token"]
    assert events[2]["prompt_logprobs"] == _PREFILL


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"n": 2}, "n must be 1: the reply carries one generated text, got 2"),
        ({"best_of": 3}, "best_of must be 1: the reply carries one generated text, got 3"),
    ],
)
def test_classic_stream_refuses_several_choices(client, backend, fields, message):
    reply = client.post("/model/llama_tiny:generate_stream", json={"instances": [{"prompt": "x", **fields}]})
    assert reply.json() == {"error_msg": message}
    assert not backend.requests
