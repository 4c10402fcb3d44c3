"""TGI routes of the LLM front end against a fake backend: /generate, /generate_stream, / (compat), /info,
/health; request validation, reply shapes, timing headers and TGI's error shapes and statuses; grammar,
top_n_tokens, decoder_input_details, best_of and frequency_penalty as the engine's parameters and in the replies."""

import pytest
from fastapi import FastAPI
from llm_http_app import backend_fixture, client_fixture  # noqa: F401  (the fixtures)
from starlette.testclient import TestClient

from mindspore_serving.common import errors
from mindspore_serving.frontends.llm import build_llm_router
from mindspore_serving.frontends.llm.testing import DEFAULT_MODEL, FakeLlmBackend, ScriptedLlmBackend, parse_sse
from mindspore_serving.master.llm_types import (
    FinalEvent,
    ModelInfo,
    Overloaded,
    PromptEvent,
    PromptToken,
    TokenEvent,
    TopLogprob,
)

TOKENS = [
    {"id": 10, "text": "Hello", "logprob": -0.25, "special": False},
    {"id": 11, "text": ",", "logprob": -0.5, "special": False},
    {"id": 12, "text": " world", "logprob": -0.75, "special": False},
    {"id": 13, "text": "!", "logprob": -1.0, "special": False},
    {"id": 2, "text": "", "logprob": -1.25, "special": True},
]


def test_generate_with_details(client, backend):
    reply = client.post("/generate", json={"inputs": "Hi there", "parameters": {"details": True}})
    assert reply.status_code == 200
    assert reply.json() == {
        "generated_text": "Hello, world!",
        "details": {"finish_reason": "eos_token", "generated_tokens": 5, "seed": None, "prefill": [], "tokens": TOKENS},
    }
    assert backend.requests[0].prompt == "Hi there"
    assert backend.outcomes[backend.requests[0].request_id] == "finished"


def test_generate_without_details_and_full_text(client):
    reply = client.post("/generate", json={"inputs": "Hi ", "parameters": {"return_full_text": True}})
    assert reply.json() == {"generated_text": "Hi Hello, world!"}


def test_generate_timing_headers(client):
    reply = client.post("/generate", json={"inputs": "Hi there"})
    headers = reply.headers
    for name in ("x-total-time", "x-validation-time", "x-queue-time", "x-inference-time", "x-time-per-token"):
        assert headers[name].isdigit(), name
    assert float(headers["x-compute-time"]) >= 0
    assert headers["x-compute-type"] == "cpu"
    assert headers["x-compute-characters"] == "8"
    assert headers["x-prompt-tokens"] == "2"
    assert headers["x-generated-tokens"] == "5"


def test_generate_maps_parameters_to_the_engine(client, backend):
    client.post("/generate", json={"inputs": "x"})
    assert backend.requests[-1].params == {"max_new_tokens": 100, "do_sample": False}
    client.post(
        "/generate",
        json={
            "inputs": "x",
            "parameters": {
                "temperature": 0.5,
                "top_k": 5,
                "top_p": 0.9,
                "repetition_penalty": 1.2,
                "max_new_tokens": 7,
                "seed": 42,
                "stop": ["!"],
            },
        },
    )
    assert backend.requests[-1].params == {
        "max_new_tokens": 7,
        "temperature": 0.5,
        "top_k": 5,
        "top_p": 0.9,
        "repetition_penalty": 1.2,
        "do_sample": True,
        "seed": 42,
        "stop": ["!"],
    }


def test_generate_stop_sequence_and_length(client):
    reply = client.post("/generate", json={"inputs": "x", "parameters": {"stop": [" world"], "details": True}})
    assert reply.json()["generated_text"] == "Hello,"
    assert reply.json()["details"]["finish_reason"] == "stop_sequence"
    reply = client.post(
        "/generate",
        json={"inputs": "x", "parameters": {"max_new_tokens": 2, "details": True, "seed": 3, "do_sample": True}},
    )
    assert reply.json()["generated_text"] == "Hello,"
    assert reply.json()["details"]["finish_reason"] == "length"
    assert reply.json()["details"]["seed"] == 3


def test_generate_stream_holds_back_the_last_token_at_max_new_tokens(client):
    reply = client.post(
        "/generate_stream", json={"inputs": "Hi there", "parameters": {"max_new_tokens": 3, "details": True}}
    )
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["x-compute-type"] == "cpu"
    assert parse_sse(reply.text) == [
        {"index": 1, "token": TOKENS[0], "generated_text": None, "details": None},
        {"index": 2, "token": TOKENS[1], "generated_text": None, "details": None},
        {
            "index": 3,
            "token": TOKENS[2],
            "generated_text": "Hello, world",
            "details": {"finish_reason": "length", "generated_tokens": 3, "seed": None, "input_length": 2},
        },
    ]


def test_generate_stream_ending_on_eos(client):
    events = parse_sse(client.post("/generate_stream", json={"inputs": "Hi"}).text)
    assert [e["token"] for e in events[:5]] == TOKENS
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:5])
    assert events[5] == {
        "index": 6,
        "token": {"id": 2, "text": "", "logprob": 0.0, "special": True},
        "generated_text": "Hello, world!",
        "details": None,
    }


def test_compat_route(client):
    reply = client.post("/", json={"inputs": "Hi ", "parameters": {"max_new_tokens": 1}})
    assert reply.json() == [{"generated_text": "Hi Hello"}]  # a list, full text by default, as TGI's "/"
    reply = client.post(
        "/", json={"inputs": "Hi ", "stream": True, "parameters": {"max_new_tokens": 1, "return_full_text": False}}
    )
    assert parse_sse(reply.text) == [{"index": 1, "token": TOKENS[0], "generated_text": "Hello", "details": None}]


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
        ({"temperature": 0}, "`temperature` must be strictly positive"),
        ({"top_k": 0}, "`top_k` must be strictly positive"),
        ({"repetition_penalty": 0}, "`repetition_penalty` must be strictly positive"),
        ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
        ({"best_of": 3, "do_sample": True}, "`best_of` must be > 0 and <= 2. Given: 3"),
        ({"best_of": 0}, "`best_of` must be > 0 and <= 2. Given: 0"),
        ({"best_of": 2}, "you must use sampling when `best_of` is > 1"),
        ({"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1"),
        ({"typical_p": 0.5}, "`typical_p` is not supported by this server"),
        ({"truncate": 10}, "`truncate` is not supported by this server"),
        ({"watermark": True}, "`watermark` is not supported by this server"),
        ({"adapter_id": "lora"}, "`adapter_id` is not supported by this server"),
        ({"top_n_tokens": 6}, "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
        ({"top_n_tokens": -1}, "`top_n_tokens` must be >= 0 and <= 5. Given: -1"),
        ({"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
        (
            {"grammar": {"type": "cfg", "value": "x"}},
            "`parameters.grammar.type`: Input should be 'json', 'json_object', 'regex' or 'json_schema'",
        ),
        ({"grammar": {"type": "json", "value": 5}}, "grammar is not valid: a json grammar's value is a JSON schema"),
        (
            {"grammar": {"type": "json", "value": "{not json"}},
            "grammar is not valid: the json of a structured output is not valid JSON",
        ),
        ({"grammar": {"type": "json", "value": "[1]"}}, "grammar is not valid: a JSON schema must be an object"),
        ({"grammar": {"type": "regex", "value": ""}}, "grammar is not valid: a regex structured output needs"),
        ({"grammar": {"type": "regex", "value": ["a"]}}, "grammar is not valid: a regex grammar's value is"),
        ({"grammar": {"type": "json_schema", "value": {"name": "x"}}}, "grammar is not valid: a json_schema grammar"),
        ({"grammar": {"type": "regex", "value": "a", "strict": True}}, "unknown field `parameters.grammar.strict`"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
        ({"colour": "red"}, "unknown field `parameters.colour`"),
        ({"top_k": "many"}, "`parameters.top_k`: Input should be a valid integer"),
    ],
)
def test_validation_errors(client, backend, parameters, message):
    reply = client.post("/generate", json={"inputs": "x", "parameters": parameters})
    assert reply.status_code == 422
    assert reply.json()["error_type"] == "validation"
    assert reply.json()["error"].startswith("Input validation error: " + message)
    assert not backend.requests


def test_validation_errors_of_the_body(client):
    assert client.post("/generate", json={"inputs": ""}).json() == {
        "error": "Input validation error: `inputs` cannot be empty",
        "error_type": "validation",
    }
    reply = client.post("/generate", content=b"{not json")
    assert reply.status_code == 422
    assert "not valid JSON" in reply.json()["error"]
    assert (
        client.post("/generate", json={"parameters": {}}).json()["error"]
        == "Input validation error: `inputs` is required"
    )
    reply = client.post("/generate_stream", json={"inputs": "x", "parameters": {"decoder_input_details": True}})
    assert reply.status_code == 422
    assert reply.json()["error"] == (
        "Input validation error: `decoder_input_details` == true is not supported when streaming tokens"
    )
    reply = client.post("/", json={"inputs": "x", "stream": True, "parameters": {"best_of": 2, "do_sample": True}})
    assert reply.status_code == 422
    assert reply.json()["error"] == "Input validation error: `best_of` != 1 is not supported when streaming tokens"


def test_engine_validation_is_a_422(client, backend):
    backend.fail_before = errors.InvalidInputs("prompt has 200 tokens, but max_model_len is 128")
    for route in ("/generate", "/generate_stream"):
        reply = client.post(route, json={"inputs": "x"})
        assert reply.status_code == 422
        assert reply.json() == {
            "error": "Input validation error: prompt has 200 tokens, but max_model_len is 128",
            "error_type": "validation",
        }


@pytest.mark.parametrize(
    "error, status, error_type, message",
    [
        (Overloaded("queue is full"), 429, "overloaded", "Model is overloaded: queue is full"),
        (errors.WorkerUnavailable("the worker stopped"), 503, "unavailable", "the worker stopped"),
        (errors.ServableUnavailable("no such model"), 404, "not_found", "no such model"),
        (
            errors.Failed("the model step failed"),
            424,
            "generation",
            "Request failed during generation: the model step failed",
        ),
        (RuntimeError("boom"), 500, "internal", "internal error: see the server log"),  # no request id here
    ],
)
def test_backend_errors_before_the_first_token(client, backend, error, status, error_type, message):
    backend.fail_before = error
    for route, body in (
        ("/generate", {"inputs": "x"}),
        ("/generate_stream", {"inputs": "x"}),
        ("/", {"inputs": "x", "stream": True}),
    ):
        reply = client.post(route, json=body)
        assert reply.status_code == status, route
        assert reply.json() == {"error": message, "error_type": error_type}


def test_error_in_the_middle_of_a_stream_is_an_event(client, backend):
    backend.fail_after = (2, errors.Failed("the model step failed"))
    events = parse_sse(client.post("/generate_stream", json={"inputs": "x"}).text)
    assert [e["token"] for e in events[:2]] == TOKENS[:2]
    assert events[2:] == [
        {"error": "Request failed during generation: the model step failed", "error_type": "generation"}
    ]
    reply = client.post("/generate", json={"inputs": "x"})
    assert reply.status_code == 424


def test_held_back_token_is_sent_before_a_late_error(client, backend):
    backend.fail_after = (2, errors.Failed("late"))
    events = parse_sse(client.post("/generate_stream", json={"inputs": "x", "parameters": {"max_new_tokens": 2}}).text)
    assert len(events) == 3  # the second token is the last by max_new_tokens, yet the error came first
    assert [e.get("token") for e in events[:2]] == TOKENS[:2]
    assert events[2]["error_type"] == "generation"


@pytest.mark.parametrize(
    "reason, message",
    [("error", "the model failed while generating request"), ("abort", "was aborted before it finished")],
)
def test_engine_finishing_with_error_or_abort(client, backend, reason, message):
    backend.finish_reason = reason
    reply = client.post("/generate", json={"inputs": "x"})
    assert reply.status_code == 424
    assert message in reply.json()["error"]
    events = parse_sse(client.post("/generate_stream", json={"inputs": "x"}).text)
    assert events[-1]["error_type"] == "generation"


def test_stream_without_final_event_is_incomplete(client, backend):
    backend.omit_final = True
    reply = client.post("/generate", json={"inputs": "x"})
    assert reply.status_code == 500
    assert reply.json() == {
        "error": "Incomplete generation: the generation stream ended before its final event",
        "error_type": "incomplete_generation",
    }
    events = parse_sse(client.post("/generate_stream", json={"inputs": "x"}).text)
    assert events[-1]["error_type"] == "incomplete_generation"


def test_info_and_health(client, backend):
    info = client.get("/info").json()
    assert info["model_id"] == "llama_tiny"
    assert info["max_total_tokens"] == 128
    assert info["max_input_tokens"] == 127
    assert info["max_concurrent_requests"] == 12
    assert info["max_best_of"] == 2
    assert info["max_stop_sequences"] == 4
    assert info["model_device_type"] == "cpu"
    reply = client.get("/health")
    assert (reply.status_code, reply.content) == (200, b"")
    backend.served = []
    reply = client.get("/health")
    assert reply.status_code == 503
    assert reply.json() == {"error": "unhealthy", "error_type": "healthcheck"}
    reply = client.get("/info")
    assert reply.status_code == 503
    assert reply.json()["error_type"] == "unavailable"
    reply = client.post("/generate", json={"inputs": "x"})
    assert reply.status_code == 503
    assert reply.json() == {"error": "no language model is being served at the moment", "error_type": "unavailable"}


def test_several_models_need_a_default():
    backend = FakeLlmBackend(models=[DEFAULT_MODEL, ModelInfo("other", 64, 2, 2, 100)])
    app = FastAPI()
    app.include_router(build_llm_router(backend))
    reply = TestClient(app).post("/generate", json={"inputs": "x"})
    assert reply.status_code == 422
    assert "several language models are served (llama_tiny, other)" in reply.json()["error"]
    app = FastAPI()
    app.include_router(build_llm_router(backend, default_model="other"))
    assert TestClient(app).post("/generate", json={"inputs": "x"}).status_code == 200
    assert backend.requests[-1].model == "other"


def test_health_route_can_be_left_out(backend):
    app = FastAPI()
    app.include_router(build_llm_router(backend, health_route=False))
    assert TestClient(app).get("/health").status_code == 404


def test_failure_before_any_token_gets_an_http_status(client, backend):
    backend.fail_after = (0, errors.Failed("device lost"))
    reply = client.post("/generate_stream", json={"inputs": "x"})
    assert reply.status_code == 424
    assert reply.json() == {"error": "Request failed during generation: device lost", "error_type": "generation"}


def test_engine_finishing_with_error_before_any_token_gets_an_http_status():
    class FailingAtOnce(FakeLlmBackend):
        async def _stream(self, request):
            yield FinalEvent(text="", token_ids=[], finish_reason="error", prompt_tokens=1, completion_tokens=0)

    app = FastAPI()
    app.include_router(build_llm_router(FailingAtOnce()))
    reply = TestClient(app).post("/generate_stream", json={"inputs": "x"})
    assert reply.status_code == 424
    assert reply.json()["error_type"] == "generation"


# grammar, top_n_tokens, decoder_input_details, best_of, frequency_penalty


def _scripted_client(events) -> TestClient:
    app = FastAPI()
    app.include_router(build_llm_router(ScriptedLlmBackend(events)))
    return TestClient(app)


def _final(text, ids, choice=0, reason="eos"):
    return FinalEvent(
        text=text, token_ids=ids, finish_reason=reason, prompt_tokens=2, completion_tokens=len(ids), choice=choice
    )


_TOP = [TopLogprob(10, "Hello", -0.25), TopLogprob(20, "Hi", -1.5)]
_SCORED = [
    TokenEvent(10, "Hello", -0.25, False, 0, _TOP),
    TokenEvent(2, "", -0.5, True, 1, [TopLogprob(2, "</s>", -0.5), TopLogprob(13, "!", -1.0)]),
]
_PROMPT = PromptEvent([PromptToken(1, "<s>", None), PromptToken(30, "Hi", -2.0, [TopLogprob(31, "Ho", -1.0)])])


@pytest.mark.parametrize(
    "grammar, constraint",
    [
        ({"type": "json", "value": {"type": "object"}}, {"type": "json", "value": '{"type": "object"}'}),
        ({"type": "json", "value": '{"properties": {}}'}, {"type": "json", "value": '{"properties": {}}'}),
        ({"type": "json_object", "value": {"type": "object"}}, {"type": "json", "value": '{"type": "object"}'}),
        ({"type": "json_object"}, {"type": "json_object", "value": ""}),
        (
            {"type": "json_schema", "value": {"name": "p", "schema": {"type": "object"}}},
            {"type": "json", "value": '{"type": "object"}'},
        ),
        ({"type": "regex", "value": "[0-9]+"}, {"type": "regex", "value": "[0-9]+"}),
    ],
)
def test_grammar_becomes_the_engines_structured_output(client, backend, grammar, constraint):
    reply = client.post("/generate", json={"inputs": "x", "parameters": {"grammar": grammar}})
    assert reply.status_code == 200
    assert backend.requests[-1].params["structured_output"] == constraint


def test_grammar_finish_reason_is_tgis_eos_token(client, backend):
    backend.finish_reason = "grammar"
    reply = client.post(
        "/generate",
        json={"inputs": "x", "parameters": {"details": True, "grammar": {"type": "regex", "value": "Hello.*"}}},
    )
    assert reply.json()["details"]["finish_reason"] == "eos_token"
    events = parse_sse(client.post("/generate_stream", json={"inputs": "x", "parameters": {"details": True}}).text)
    assert events[-1]["details"]["finish_reason"] == "eos_token"


def test_engine_refusing_a_grammar_is_a_422(client, backend):
    backend.fail_before = errors.InvalidInputs("the regex of a structured output does not compile: unclosed (")
    reply = client.post("/generate", json={"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "(a"}}})
    assert reply.status_code == 422
    assert reply.json() == {
        "error": "Input validation error: the regex of a structured output does not compile: unclosed (",
        "error_type": "validation",
    }


def test_new_parameters_map_to_the_engine(client, backend):
    client.post(
        "/generate",
        json={
            "inputs": "x",
            "parameters": {"frequency_penalty": -0.5, "top_n_tokens": 3, "decoder_input_details": True, "best_of": 1},
        },
    )
    assert backend.requests[-1].params == {
        "max_new_tokens": 100,
        "frequency_penalty": -0.5,
        "do_sample": False,
        "top_logprobs": 3,
        "prompt_logprobs": 0,
    }
    client.post("/generate", json={"inputs": "x", "parameters": {"best_of": 2, "temperature": 0.8, "top_n_tokens": 0}})
    assert backend.requests[-1].params == {"max_new_tokens": 100, "temperature": 0.8, "do_sample": True, "n": 2}


def test_details_with_top_tokens_and_prefill():
    client = _scripted_client([_PROMPT, *_SCORED, _final("Hello", [10, 2])])
    reply = client.post(
        "/generate", json={"inputs": "Hi", "parameters": {"top_n_tokens": 2, "decoder_input_details": True}}
    )
    assert reply.status_code == 200
    assert reply.json() == {
        "generated_text": "Hello",
        "details": {
            "finish_reason": "eos_token",
            "generated_tokens": 2,
            "seed": None,
            "prefill": [{"id": 1, "text": "<s>", "logprob": None}, {"id": 30, "text": "Hi", "logprob": -2.0}],
            "tokens": [
                {"id": 10, "text": "Hello", "logprob": -0.25, "special": False},
                {"id": 2, "text": "", "logprob": -0.5, "special": True},
            ],
            "top_tokens": [
                [
                    {"id": 10, "text": "Hello", "logprob": -0.25, "special": False},
                    {"id": 20, "text": "Hi", "logprob": -1.5, "special": False},
                ],
                [
                    {"id": 2, "text": "</s>", "logprob": -0.5, "special": True},
                    {"id": 13, "text": "!", "logprob": -1.0, "special": False},
                ],
            ],
        },
    }
    # without decoder_input_details the prefill stays empty, as TGI's
    details = client.post("/generate", json={"inputs": "Hi", "parameters": {"details": True}}).json()["details"]
    assert details["prefill"] == [] and "top_tokens" not in details


def test_stream_events_carry_top_tokens():
    client = _scripted_client([*_SCORED, _final("Hello", [10, 2])])
    events = parse_sse(
        client.post("/generate_stream", json={"inputs": "Hi", "parameters": {"top_n_tokens": 2, "details": True}}).text
    )
    assert [list(e) for e in events] == [["index", "token", "top_tokens", "generated_text", "details"]] * 2 + [
        ["index", "token", "generated_text", "details"]
    ]  # the closing event's empty token has no alternatives
    assert events[0]["top_tokens"] == [
        {"id": 10, "text": "Hello", "logprob": -0.25, "special": False},
        {"id": 20, "text": "Hi", "logprob": -1.5, "special": False},
    ]
    assert events[1]["top_tokens"][0] == {"id": 2, "text": "</s>", "logprob": -0.5, "special": True}
    events = parse_sse(
        client.post(
            "/generate_stream", json={"inputs": "Hi", "parameters": {"top_n_tokens": 1, "max_new_tokens": 2}}
        ).text
    )
    assert len(events) == 2 and events[1]["generated_text"] == "Hello"  # the held-back last token keeps its own
    assert events[1]["top_tokens"][0]["id"] == 2


def test_best_of_keeps_the_candidate_of_highest_mean_logprob():
    events = [
        TokenEvent(10, "Hello", -1.0, False, 0, choice=0),
        TokenEvent(40, "Bye", -0.1, False, 0, choice=1),
        TokenEvent(2, "", -0.3, True, 1, choice=1),
        _final("Bye", [40, 2], choice=1),
        TokenEvent(11, ",", -1.0, False, 1, choice=0),
        _final("Hello,", [10, 11], choice=0, reason="length"),
    ]
    client = _scripted_client(events)
    parameters = {"best_of": 2, "do_sample": True, "max_new_tokens": 2}
    reply = client.post("/generate", json={"inputs": "Hi ", "parameters": parameters})
    assert reply.json() == {"generated_text": "Bye"}
    assert reply.headers["x-generated-tokens"] == "2"  # the kept candidate's
    reply = client.post("/", json={"inputs": "Hi ", "parameters": {**parameters, "details": True}})
    assert reply.json() == [
        {
            "generated_text": "Hi Bye",
            "details": {
                "finish_reason": "eos_token",
                "generated_tokens": 2,
                "seed": None,
                "prefill": [],
                "tokens": [
                    {"id": 40, "text": "Bye", "logprob": -0.1, "special": False},
                    {"id": 2, "text": "", "logprob": -0.3, "special": True},
                ],
                "best_of_sequences": [
                    {
                        "generated_text": "Hi Hello,",
                        "finish_reason": "length",
                        "generated_tokens": 2,
                        "seed": None,
                        "prefill": [],
                        "tokens": [
                            {"id": 10, "text": "Hello", "logprob": -1.0, "special": False},
                            {"id": 11, "text": ",", "logprob": -1.0, "special": False},
                        ],
                    }
                ],
            },
        }
    ]
