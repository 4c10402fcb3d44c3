"""OpenAI routes of the LLM front end against a fake backend: /v1/models, /v1/completions,
/v1/chat/completions, streamed and not, usage, logprobs, and OpenAI's error shape and statuses."""

import dataclasses
import json

import pytest
from llm_http_app import backend_fixture, client_fixture  # noqa: F401  (the fixtures)

from mindspore_serving.common import errors
from mindspore_serving.frontends.llm.testing import parse_sse
from mindspore_serving.master.llm_types import ChatMessage, Overloaded

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
        (MODEL, "model", "mindspore-serving", 128)
    ]
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
        "object": "text_completion",
        "model": MODEL,
        "choices": [{"index": 0, "text": "Hello, world!", "logprobs": None, "finish_reason": "stop"}],
        "usage": USAGE,
    }
    assert backend.requests[-1].prompt == "Hi there"
    assert backend.requests[-1].params == {"max_new_tokens": 16}
    assert reply.headers["x-generated-tokens"] == "5"


def test_completion_parameters(client, backend):
    reply = client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": ["Hi there"],
            "max_tokens": 2,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 7,
            "stop": "!",
            "top_k": 3,
            "repetition_penalty": 1.1,
            "ignore_eos": True,
            "user": "me",
            "presence_penalty": 0,
            "frequency_penalty": 0,
            "n": 1,
            "best_of": 1,
            "logit_bias": {},
        },
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    assert backend.requests[-1].params == {
        "max_new_tokens": 2,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 3,
        "repetition_penalty": 1.1,
        "seed": 7,
        "stop": ["!"],
        "ignore_eos": True,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "n": 1,
        "best_of": 1,
    }


def test_completion_stop_and_logprobs(client, backend):
    payload = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hi ", "stop": [" world"], "logprobs": 0}
    ).json()
    choice = payload["choices"][0]
    assert choice["text"] == "Hello,"
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] == {
        "tokens": ["Hello", ",", ""],
        "token_logprobs": [-0.25, -0.5, -0.75],
        "top_logprobs": [{"Hello": -0.25}, {",": -0.5}, {"": -0.75}],
        "text_offset": [0, 5, 6],
    }
    assert "top_logprobs" not in backend.requests[-1].params


def test_completion_top_logprobs_hold_the_chosen_token_and_the_k_likeliest(client, backend):
    choice = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hi", "logprobs": 2, "max_tokens": 2}
    ).json()["choices"][0]
    assert choice["logprobs"]["top_logprobs"] == [{"Hello": -0.25, " alt0": -1.25}, {",": -0.5, " alt0": -1.5}]
    assert backend.requests[-1].params == {"max_new_tokens": 2, "top_logprobs": 2}


def test_completion_echo_with_logprobs_scores_the_prompt_first(client, backend):
    choice = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hi you ", "echo": True, "logprobs": 1, "max_tokens": 1}
    ).json()["choices"][0]
    assert choice["text"] == "Hi you Hello"
    assert choice["logprobs"] == {
        "tokens": ["Hi", " you ", "Hello"],
        "token_logprobs": [None, -1.0, -0.25],
        "top_logprobs": [None, {" alt0": -0.5, " you ": -1.0}, {"Hello": -0.25}],
        "text_offset": [0, 2, 7],
    }
    assert backend.requests[-1].params == {"max_new_tokens": 1, "top_logprobs": 1, "prompt_logprobs": 1}
    assert "prompt_logprobs" not in choice


def test_completion_echo_without_logprobs_scores_nothing(client, backend):
    choice = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hi ", "echo": True, "stop": [" world"]}
    ).json()["choices"][0]
    assert (choice["text"], choice["logprobs"], choice["finish_reason"]) == ("Hi Hello,", None, "stop")
    assert backend.requests[-1].params == {"max_new_tokens": 16, "stop": [" world"]}


@pytest.mark.parametrize("prompt", [[5, 7], [[5, 7]]])
def test_completion_of_token_ids(client, backend, prompt):
    """lm-evaluation-harness sends token ids ([[ids]]) by default; echo gives them back decoded."""
    choice = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 1}
    ).json()["choices"][0]
    assert (backend.requests[-1].prompt, backend.requests[-1].prompt_token_ids) == (None, [5, 7])
    assert choice["text"] == "t5 t7Hello"
    assert choice["logprobs"]["tokens"] == ["t5", " t7", "Hello"]
    assert choice["logprobs"]["text_offset"] == [0, 2, 5]


def test_completion_of_a_batch_of_prompts(client, backend):
    payload = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": [[3], [5, 7, 9]], "n": 2, "max_tokens": 1, "echo": True}
    ).json()
    assert [(c["index"], c["text"]) for c in payload["choices"]] == [
        (0, "t3Hello"),
        (1, "t3Hello1"),
        (2, "t5 t7 t9Hello"),
        (3, "t5 t7 t9Hello1"),
    ]
    assert payload["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    first, second = backend.requests[-2:]
    assert (first.prompt_token_ids, second.prompt_token_ids) == ([3], [5, 7, 9])
    assert second.request_id == f"{first.request_id}-1"
    events = parse_sse(
        client.post(
            "/v1/completions", json={"model": MODEL, "prompt": ["Hi", "you"], "max_tokens": 1, "stream": True}
        ).text
    )
    assert [(c["index"], c["text"], c["finish_reason"]) for e in events[:-1] for c in e["choices"]] == [
        (0, "Hello", None),
        (0, "", "length"),
        (1, "Hello", None),
        (1, "", "length"),
    ]


def test_a_failing_prompt_fails_its_batch(client, backend):
    backend.fail_after = (1, errors.Failed("the model step failed"))
    reply = client.post("/v1/completions", json={"model": MODEL, "prompt": ["Hi", "you"]})
    assert reply.status_code == 500
    assert sorted(backend.outcomes.values()) == ["failed", "failed"]


def test_lm_eval_scoring_request_returns_the_scored_prompt_only(client, backend):
    """lm-evaluation-harness `local-completions` loglikelihood: echo, logprobs, max_tokens 0, temperature 0."""
    payload = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "The cat sat", "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0},
    ).json()
    assert backend.requests[-1].params == {
        "max_new_tokens": 0,
        "temperature": 0,
        "top_logprobs": 1,
        "prompt_logprobs": 1,
    }
    assert payload["choices"] == [
        {
            "index": 0,
            "text": "The cat sat",
            "finish_reason": "length",
            "logprobs": {
                "tokens": ["The", " cat", " sat"],
                "token_logprobs": [None, -1.0, -1.0],
                "top_logprobs": [None, {" alt0": -0.5, " cat": -1.0}, {" alt0": -0.5, " sat": -1.0}],
                "text_offset": [0, 3, 7],
            },
        }
    ]
    assert payload["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}


def test_completion_stream(client):
    reply = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi there", "stream": True, "max_tokens": 2})
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(reply.text)
    assert events[-1] == "[DONE]"
    chunks = [_without_ids(e) for e in events[:-1]]
    assert chunks == [
        {
            "object": "text_completion",
            "model": MODEL,
            "choices": [{"index": 0, "text": "Hello", "logprobs": None, "finish_reason": None}],
        },
        {
            "object": "text_completion",
            "model": MODEL,
            "choices": [{"index": 0, "text": ",", "logprobs": None, "finish_reason": None}],
        },
        {
            "object": "text_completion",
            "model": MODEL,
            "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
        },
    ]
    assert len({e["id"] for e in events[:-1]}) == 1


def test_completion_stream_with_usage_echo_and_logprobs(client):
    events = parse_sse(
        client.post(
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": "Hi ",
                "stream": True,
                "max_tokens": 1,
                "echo": True,
                "logprobs": 0,
                "stream_options": {"include_usage": True},
            },
        ).text
    )
    assert [e["choices"] for e in events[:-2]] == [
        [
            {
                "index": 0,
                "text": "Hi ",
                "finish_reason": None,
                "logprobs": {"tokens": ["Hi "], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]},
            }
        ],
        [
            {
                "index": 0,
                "text": "Hello",
                "finish_reason": None,
                "logprobs": {
                    "tokens": ["Hello"],
                    "token_logprobs": [-0.25],
                    "top_logprobs": [{"Hello": -0.25}],
                    "text_offset": [3],
                },
            }
        ],
        [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
    ]
    assert all(e["usage"] is None for e in events[:-2])
    assert events[-2]["choices"] == []
    assert events[-2]["usage"] == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert events[-1] == "[DONE]"


def test_chat_completion(client, backend):
    reply = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "max_tokens": 3,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "you"}]},
            ],
        },
    )
    assert reply.status_code == 200, reply.text
    payload = reply.json()
    assert payload["id"].startswith("chatcmpl-")
    assert _without_ids(payload) == {
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello, world"},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }
    request = backend.requests[-1]
    assert request.prompt is None
    assert request.messages == [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi you")]
    assert request.params == {"max_new_tokens": 3}


def test_chat_completion_logprobs_and_max_completion_tokens(client, backend):
    payload = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "logprobs": True,
            "max_completion_tokens": 1,
        },
    ).json()
    assert payload["choices"][0]["logprobs"] == {
        "content": [{"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello"), "top_logprobs": []}]
    }
    assert backend.requests[-1].params == {"max_new_tokens": 1}


def test_chat_completion_stream(client):
    events = parse_sse(
        client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ).text
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
        {"content": ","},
        {"content": " world"},
        {"content": "!"},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * 5 + ["stop"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert all(c["usage"] is None for c in chunks[:-1])


def test_chat_completion_stream_logprobs(client):
    events = parse_sse(
        client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "stream": True,
                "logprobs": True,
                "max_tokens": 1,
            },
        ).text
    )
    assert "usage" not in events[0]
    assert events[1]["choices"][0]["logprobs"] == {
        "content": [{"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello"), "top_logprobs": []}]
    }


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    "body, params",
    [
        ({"presence_penalty": 0.5, "frequency_penalty": -1.5}, {"presence_penalty": 0.5, "frequency_penalty": -1.5}),
        ({"logit_bias": {"5": 2.5, "7": -100}}, {"logit_bias": {"5": 2.5, "7": -100}}),
        ({"logit_bias": {}}, {}),
        (
            {"min_p": 0.1, "min_tokens": 2, "bad_words": ["bad", "worse"], "allowed_token_ids": [3, 4]},
            {"min_p": 0.1, "min_tokens": 2, "bad_words": ["bad", "worse"], "allowed_token_ids": [3, 4]},
        ),
        ({"logprobs_mode": "processed", "prompt_logprobs": 3}, {"logprobs_mode": "processed", "prompt_logprobs": 3}),
        ({"n": 2}, {"n": 2}),
        ({"response_format": {"type": "text"}}, {}),
        ({"response_format": {"type": "json_object"}}, {"structured_output": {"type": "json_object"}}),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": SCHEMA, "strict": True, "description": "d"},
                }
            },
            {"structured_output": {"type": "json", "value": SCHEMA}},
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
            {"structured_output": {"type": "json_object"}},
        ),
        (
            {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
            {"structured_output": {"type": "json", "value": SCHEMA}},
        ),
        ({"structured_outputs": {"regex": "[ab]+"}}, {"structured_output": {"type": "regex", "value": "[ab]+"}}),
        (
            {"structured_outputs": {"choice": ["yes", "no"]}},
            {"structured_output": {"type": "choice", "value": ["yes", "no"]}},
        ),
        (
            {"structured_outputs": {"grammar": 'start: "a"'}},
            {"structured_output": {"type": "grammar", "value": 'start: "a"'}},
        ),
        ({"structured_outputs": {"json_object": True}}, {"structured_output": {"type": "json_object"}}),
        (
            {"guided_json": SCHEMA, "guided_decoding_backend": "xgrammar", "guided_whitespace_pattern": " "},
            {"structured_output": {"type": "json", "value": SCHEMA}},
        ),
        ({"guided_json": '{"type": "object"}'}, {"structured_output": {"type": "json", "value": '{"type": "object"}'}}),
        ({"guided_regex": "a+"}, {"structured_output": {"type": "regex", "value": "a+"}}),
        ({"guided_choice": ["a", "b"]}, {"structured_output": {"type": "choice", "value": ["a", "b"]}}),
        ({"guided_grammar": 'start: "a"'}, {"structured_output": {"type": "grammar", "value": 'start: "a"'}}),
    ],
)
def test_sampling_fields_map_to_engine_params(client, backend, body, params):
    for route, extra, default in (
        ("/v1/completions", {"prompt": "x"}, {"max_new_tokens": 16}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, {}),
    ):
        reply = client.post(route, json={"model": MODEL, **extra, **body})
        assert reply.status_code == 200, reply.text
        assert backend.requests[-1].params == {**default, **params}


def test_chat_template_kwargs_and_tool_messages_reach_the_template(client, backend):
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    reply = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "chat_template_kwargs": {"enable_thinking": False},
            "messages": [
                {"role": "user", "content": "add", "name": "ann"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [call],
                    "refusal": None,
                    "audio": None,
                    "function_call": None,
                    "annotations": None,
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "1"},
                {"role": "user", "content": "thanks"},
            ],
        },
    )
    assert reply.status_code == 200, reply.text
    request = backend.requests[-1]
    assert request.chat_template_kwargs == {"enable_thinking": False}
    assert request.messages == [
        {"role": "user", "content": "add", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "1", "tool_call_id": "call_1"},
        ChatMessage("user", "thanks"),
    ]


def test_completion_n_choices(client, backend):
    payload = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "n": 3, "logprobs": 0}).json()
    assert [(c["index"], c["text"], c["finish_reason"]) for c in payload["choices"]] == [
        (0, "Hello, world!", "stop"),
        (1, "Hello1, world!", "stop"),
        (2, "Hello2, world!", "stop"),
    ]
    assert payload["choices"][2]["logprobs"]["tokens"] == ["Hello2", ",", " world", "!", ""]
    assert payload["usage"] == {"prompt_tokens": 1, "completion_tokens": 15, "total_tokens": 16}
    assert backend.requests[-1].params == {"max_new_tokens": 16, "n": 3}


def test_best_of_returns_the_n_likeliest_choices_and_counts_all(client, backend):
    backend.choice_bias = {0: -1.0, 2: 0.1}
    payload = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "n": 2, "best_of": 3}).json()
    assert [(c["index"], c["text"]) for c in payload["choices"]] == [(0, "Hello2, world!"), (1, "Hello1, world!")]
    assert payload["usage"]["completion_tokens"] == 15
    assert backend.requests[-1].params == {"max_new_tokens": 16, "n": 2, "best_of": 3}


def test_completion_stream_interleaves_choices(client):
    events = parse_sse(
        client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "Hi ", "n": 2, "max_tokens": 2, "stream": True, "echo": True},
        ).text
    )
    assert events[-1] == "[DONE]"
    choices = [c for e in events[:-1] for c in e["choices"]]
    assert all(len(e["choices"]) == 1 for e in events[:-1])
    assert [(c["index"], c["text"], c["finish_reason"]) for c in choices] == [
        (0, "Hi ", None),
        (1, "Hi ", None),
        (0, "Hello", None),
        (1, "Hello1", None),
        (0, ",", None),
        (1, ",", None),
        (0, "", "length"),
        (1, "", "length"),
    ]


def test_completion_prompt_logprobs_as_vllm_returns_them(client, backend):
    choice = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hi you", "max_tokens": 1, "prompt_logprobs": 2}
    ).json()["choices"][0]
    assert choice["prompt_logprobs"] == [
        None,
        {
            str(13): {"logprob": -1.0, "rank": 2, "decoded_token": " you"},
            str(90): {"logprob": -0.5, "rank": 1, "decoded_token": " alt0"},
        },
    ]
    assert backend.requests[-1].params == {"max_new_tokens": 1, "prompt_logprobs": 2}
    choice = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "Hi you", "max_tokens": 1, "echo": True, "prompt_logprobs": 0, "logprobs": 1},
    ).json()["choices"][0]
    assert choice["prompt_logprobs"] == [None, {str(13): {"logprob": -1.0, "rank": None, "decoded_token": " you"}}]
    assert backend.requests[-1].params["prompt_logprobs"] == 1


def test_grammar_finish_is_a_stop(client, backend):
    backend.finish_reason = "grammar"
    reply = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "guided_regex": "Hel+o"})
    assert reply.json()["choices"][0]["finish_reason"] == "stop"


def test_chat_n_choices_with_top_logprobs(client, backend):
    payload = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "n": 2,
            "logprobs": True,
            "top_logprobs": 2,
            "max_tokens": 1,
            "prompt_logprobs": 0,
        },
    ).json()
    assert backend.requests[-1].params == {"max_new_tokens": 1, "n": 2, "top_logprobs": 2, "prompt_logprobs": 0}
    assert [(c["index"], c["message"]["content"]) for c in payload["choices"]] == [(0, "Hello"), (1, "Hello1")]
    assert payload["choices"][1]["logprobs"] == {
        "content": [
            {
                "token": "Hello1",
                "logprob": -0.25,
                "bytes": list(b"Hello1"),
                "top_logprobs": [
                    {"token": "Hello1", "logprob": -0.25, "bytes": list(b"Hello1")},
                    {"token": " alt0", "logprob": -1.25, "bytes": list(b" alt0")},
                ],
            }
        ]
    }
    assert payload["prompt_logprobs"][0] is None and len(payload["prompt_logprobs"]) == 3
    assert payload["usage"]["completion_tokens"] == 2


def test_chat_stream_gives_each_choice_its_role_and_finish(client):
    events = parse_sse(
        client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "n": 2,
                "stream": True,
                "max_tokens": 1,
            },
        ).text
    )
    choices = [e["choices"][0] for e in events[:-1]]
    assert [(c["index"], c["delta"], c["finish_reason"]) for c in choices] == [
        (0, {"role": "assistant", "content": ""}, None),
        (1, {"role": "assistant", "content": ""}, None),
        (0, {"content": "Hello"}, None),
        (1, {"content": "Hello1"}, None),
        (0, {}, "length"),
        (1, {}, "length"),
    ]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
HERMES_REPLY = (
    "Let me look.",
    "<tool_call>",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "</tool_call>",
)
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


def _hermes_model(backend):
    backend.served = [dataclasses.replace(backend.served[0], tool_call_parser="hermes")]
    backend.reply = list(HERMES_REPLY)


def _without_call_ids(calls):
    assert all(c["id"].startswith("call_") for c in calls)
    return [{k: v for k, v in c.items() if k != "id"} for c in calls]


def test_chat_tool_calls_of_the_models_format(client, backend):
    _hermes_model(backend)
    payload = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    ).json()
    [choice] = payload["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    assert _without_call_ids(choice["message"]["tool_calls"]) == [CALL]
    request = backend.requests[-1]
    assert request.tools == TOOLS
    assert "structured_output" not in request.params


def test_chat_tool_calls_streamed(client, backend):
    _hermes_model(backend)
    events = parse_sse(
        client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": TOOLS,
                "stream": True,
            },
        ).text
    )
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"content": "Let me look."}
    head, arguments = deltas[2]["tool_calls"][0], deltas[3]["tool_calls"][0]
    assert head["id"].startswith("call_")
    assert {k: v for k, v in head.items() if k != "id"} == {
        "index": 0,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert arguments == {"index": 0, "function": {"arguments": '{"city":"Paris"}'}}
    assert deltas[4:] == [{}]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_forced_tool_choice_constrains_the_output(client, backend):
    backend.reply = ['[{"name": "get_weather", ', '"parameters": {"city": "Paris"}}]']
    payload = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
    ).json()
    assert payload["choices"][0]["finish_reason"] == "tool_calls"
    assert payload["choices"][0]["message"]["content"] is None
    assert _without_call_ids(payload["choices"][0]["message"]["tool_calls"]) == [CALL]
    constraint = backend.requests[-1].params["structured_output"]
    assert constraint["type"] == "json" and json.loads(constraint["value"])["maxItems"] == 1
    backend.reply = ['{"city": ', '"Paris"}']
    payload = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    ).json()
    assert payload["choices"][0]["finish_reason"] == "stop"  # a named call is forced, not chosen (as OpenAI)
    assert _without_call_ids(payload["choices"][0]["message"]["tool_calls"]) == [CALL]
    assert json.loads(backend.requests[-1].params["structured_output"]["value"]) == TOOLS[0]["function"]["parameters"]


def test_chat_tools_without_reading_calls(client, backend):
    _hermes_model(backend)
    payload = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": "none"},
    ).json()
    assert payload["choices"][0]["message"] == {"role": "assistant", "content": "".join(HERMES_REPLY)}
    assert backend.requests[-1].tools == TOOLS  # the template still sees them, as vLLM
    for unknown in (None, "a_format_of_a_newer_worker"):  # no format, or one this front end cannot read
        backend.served = [dataclasses.replace(backend.served[0], tool_call_parser=unknown)]
        payload = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": TOOLS},
        ).json()
        assert payload["choices"][0]["finish_reason"] == "stop"
        assert payload["choices"][0]["message"] == {"role": "assistant", "content": "".join(HERMES_REPLY)}


@pytest.mark.parametrize(
    "route, body, param, message",
    [
        (
            "/v1/completions",
            {"prompt": "x", "suffix": "y"},
            "suffix",
            "'suffix' is not supported: this model has no fill-in-the-middle template",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "stream": True, "n": 2, "best_of": 3},
            "best_of",
            "'best_of' greater than 'n' cannot be streamed (best_of=3, n=2)",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "stream": True, "prompt_logprobs": 0},
            "prompt_logprobs",
            "'prompt_logprobs' is not available when 'stream' is enabled",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "logprobs": 6},
            "logprobs",
            "`logprobs`: Input should be less than or equal to 5",
        ),
        ("/v1/completions", {"prompt": "x", "n": 0}, "n", "`n`: Input should be greater than or equal to 1"),
        ("/v1/completions", {"prompt": "x", "n": 17}, None, "n must be an int in [1, 16], got 17"),
        ("/v1/completions", {"prompt": "x", "n": 3, "best_of": 2}, None, "best_of must be an int in [n, 16]"),
        ("/v1/completions", {"prompt": "x", "logit_bias": {"a": 5}}, None, "logit_bias keys must be token ids"),
        (
            "/v1/completions",
            {"prompt": "x", "logit_bias": {"1": 101}},
            None,
            "logit_bias values must be in [-100, 100]",
        ),
        ("/v1/completions", {"prompt": "x", "min_p": 2}, None, "min_p must be in [0, 1], got 2"),
        (
            "/v1/completions",
            {"prompt": "x", "max_tokens": 2, "min_tokens": 3},
            None,
            "min_tokens (3) must not exceed max_new_tokens (2)",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "logprobs_mode": "sampled"},
            "logprobs_mode",
            "`logprobs_mode`: Input should be",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "prompt_logprobs": 21},
            "prompt_logprobs",
            "`prompt_logprobs`: Input should be less than or equal to 20",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "guided_json": {"type": "object"}, "guided_regex": "a+"},
            "guided_regex",
            "'guided_json' and 'guided_regex' cannot be used together",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "response_format": {"type": "json_object"}, "structured_outputs": {"choice": ["a"]}},
            "structured_outputs.choice",
            "'response_format' and 'structured_outputs.choice' cannot be used together",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "structured_outputs": {"regex": "a", "grammar": "b"}},
            "structured_outputs.grammar",
            "'structured_outputs.regex' and 'structured_outputs.grammar' cannot be used",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "structured_outputs": {}},
            "structured_outputs",
            "'structured_outputs' needs one of json, regex, choice, grammar or json_object",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "structured_outputs": {"structural_tag": "{}"}},
            "structured_outputs.structural_tag",
            "Unrecognized request argument supplied: structured_outputs.structural_tag",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "guided_json": "not json"},
            None,
            "the json of a structured output is not valid",
        ),
        ("/v1/completions", {"prompt": "x", "guided_choice": []}, None, "a choice structured output needs a non-empty"),
        ("/v1/completions", {"prompt": [[1, 2], []]}, "prompt.1", "'prompt.1' must not be empty"),
        ("/v1/completions", {"prompt": ["a", ""]}, "prompt.1", "'prompt.1' must not be empty"),
        ("/v1/completions", {"prompt": [[]]}, "prompt", "'prompt' must not be empty"),
        ("/v1/completions", {"prompt": [3, -1]}, "prompt", "'prompt' token ids must be >= 0"),
        ("/v1/completions", {"prompt": [3, 100], "echo": True}, None, "token id 100 is not in this model's vocabulary"),
        ("/v1/completions", {"prompt": ""}, "prompt", "'prompt' must not be empty"),
        (
            "/v1/completions",
            {"prompt": "x", "stream_options": {"include_usage": True}},
            "stream_options",
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]},
            "stop",
            "`stop` supports up to 4 stop sequences",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "temperature": 3},
            "temperature",
            "`temperature`: Input should be less than or equal to 2",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "colour": "red"},
            "colour",
            "Unrecognized request argument supplied: colour",
        ),
        ("/v1/completions", {"prompt": "x", "seed": -1}, None, "seed must be an int in [0, 2**64 - 1]"),
        ("/v1/completions", {}, "prompt", "`prompt` is required"),
        ("/v1/chat/completions", {"messages": []}, "messages", "`messages`: List should have at least 1 item"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
            "'top_logprobs' requires 'logprobs' to be true",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
            "`top_logprobs`: Input should be less than or equal to 20",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
            "tool_choice",
            "Invalid 'tool_choice': tool_choice 'required' needs 'tools'",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools[0].function",
            "Invalid 'tools[0].function': expected an object",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": TOOLS,
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "tool_choice",
            "'response_format' and 'tool_choice' cannot be used together",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "best_of": 2},
            "best_of",
            "Unrecognized request argument supplied: best_of",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content",
            "'messages.0.content' parts of type 'image_url' are not supported",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            "messages.0.role",
            "`messages.0.role`: Input should be",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "'response_format.json_schema' is required when 'response_format.type' is 'json_schema'",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "structural_tag"}},
            "response_format.type",
            "`response_format.type`: Input should be",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "guided_grammar": "g",
                "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
            },
            "guided_grammar",
            "'response_format' and 'guided_grammar' cannot be used together",
        ),
    ],
)
def test_validation_errors(client, backend, route, body, param, message):
    reply = client.post(route, json={"model": MODEL, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["message"].startswith(message), error["message"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, None)
    assert not backend.requests


def test_unknown_model_is_a_404(client, backend):
    for route, body in (
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ):
        reply = client.post(route, json={"model": "gpt-4", **body})
        assert reply.status_code == 404
        assert reply.json() == {
            "error": {
                "message": "The model `gpt-4` does not exist; served language models: llama_tiny",
                "type": "invalid_request_error",
                "param": None,
                "code": "model_not_found",
            }
        }
    assert not backend.requests


@pytest.mark.parametrize(
    "error, status, error_type, code",
    [
        (errors.InvalidInputs("prompt too long"), 400, "invalid_request_error", None),
        (Overloaded("queue is full"), 429, "requests", "rate_limit_exceeded"),
        (
            errors.ServableUnavailable("Model llama_tiny is not a language model"),
            404,
            "invalid_request_error",
            "model_not_found",
        ),
        (errors.WorkerUnavailable("the worker stopped"), 503, "server_error", "service_unavailable"),
        (errors.Failed("the model step failed"), 500, "server_error", None),
        (RuntimeError("boom"), 500, "server_error", None),
    ],
)
def test_backend_errors(client, backend, error, status, error_type, code):
    backend.fail_before = error
    message = error.message if isinstance(error, errors.ServingError) else "internal error: see the server log"
    for stream in (False, True):
        reply = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": "x"}]},
        )
        assert reply.status_code == status
        assert reply.json() == {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def test_error_in_the_middle_of_a_stream(client, backend):
    backend.fail_after = (1, errors.Failed("the model step failed"))
    for route, body in (
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ):
        reply = client.post(route, json={"model": MODEL, "stream": True, **body})
        assert reply.status_code == 200
        events = parse_sse(reply.text)
        assert events[-2:] == [
            {"error": {"message": "the model step failed", "type": "server_error", "param": None, "code": None}},
            "[DONE]",
        ]
        assert "finish_reason" not in str(events[-3]) or events[-3]["choices"][0]["finish_reason"] is None


def test_incomplete_stream(client, backend):
    backend.omit_final = True
    reply = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert reply.status_code == 500
    assert reply.json()["error"]["code"] == "incomplete_generation"
