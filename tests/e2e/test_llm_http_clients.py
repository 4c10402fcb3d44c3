"""The LLM HTTP routes on a real uvicorn server (fake backend), driven by real client libraries: `openai`,
TGI's `text-generation` client and huggingface_hub's `InferenceClient`."""

import dataclasses
import json
import socket
import threading
import time

import pytest
import uvicorn
from client_venv import require_clients, run_check
from fastapi import FastAPI, Request

from mindspore_serving.common import errors
from mindspore_serving.frontends.llm import build_llm_router, mindspore_generate_stream
from mindspore_serving.frontends.llm.testing import DEFAULT_MODEL, FakeLlmBackend
from mindspore_serving.master.llm_types import Overloaded

openai = pytest.importorskip("openai")


MODEL = "llama_tiny"
START_TIMEOUT_S = 30


class _Server:
    """uvicorn serving `app` on a free port in a background thread."""

    def __init__(self, app):
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="llm-http-e2e", daemon=True
        )

    def start(self):
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:  # polled with a deadline; uvicorn has no readiness callback
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.01)  # ok-sleep: polling with a deadline

    def stop(self):
        self.server.should_exit = True
        self.thread.join(START_TIMEOUT_S)
        self.socket.close()
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="module", name="served")
def _served():
    backend = FakeLlmBackend()
    app = FastAPI()
    app.include_router(build_llm_router(backend))

    @app.post("/model/{model}:generate_stream")
    async def _classic(model: str, request: Request):
        return await mindspore_generate_stream(backend, model, await request.body())

    server = _Server(app)
    server.start()
    try:
        yield backend, server.url
    finally:
        server.stop()


@pytest.fixture(name="backend")
def _backend(served):
    backend = served[0]
    backend.fail_before = backend.fail_after = backend.finish_reason = backend.stall_after = None
    backend.choice_bias = {}
    backend.served = [DEFAULT_MODEL]
    backend.reply = list(FakeLlmBackend().reply)
    backend.stalled.clear()
    backend.outcomes.clear()
    return backend


@pytest.fixture(name="url")
def _url(served, backend):  # pylint: disable=unused-argument
    return served[1]


@pytest.fixture(name="oai")
def _oai(url):
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        yield client


# openai


def test_openai_models_and_completions(oai, backend):
    assert [m.id for m in oai.models.list().data] == [MODEL]
    completion = oai.completions.create(model=MODEL, prompt="Hi there", max_tokens=3, temperature=0, seed=1)
    assert completion.object == "text_completion"
    assert completion.choices[0].text == "Hello, world"
    assert completion.choices[0].finish_reason == "length"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        2,
        3,
        5,
    )
    assert backend.requests[-1].params == {"max_new_tokens": 3, "temperature": 0, "seed": 1}


def test_openai_completion_stream(oai):
    chunks = list(
        oai.completions.create(model=MODEL, prompt="Hi there", stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello, world!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


def test_openai_chat(oai, backend):
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == "Hello, world!"
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage.completion_tokens == 5
    assert [(m.role, m.content) for m in backend.requests[-1].messages] == [("system", "Be brief."), ("user", "Hi")]


def test_openai_chat_stream_with_usage_and_logprobs(oai):
    chunks = list(
        oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            max_tokens=2,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello,"
    assert [c.choices[0].logprobs.content[0].logprob for c in chunks[1:3]] == [-0.25, -0.5]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.total_tokens == 5


def test_openai_n_choices(oai, backend):
    completion = oai.completions.create(model=MODEL, prompt="Hi", n=3, max_tokens=2)
    assert [(c.index, c.text) for c in completion.choices] == [(0, "Hello,"), (1, "Hello1,"), (2, "Hello2,")]
    assert completion.usage.completion_tokens == 6
    backend.choice_bias = {1: 0.5}
    completion = oai.completions.create(model=MODEL, prompt="Hi", n=1, best_of=3, max_tokens=2)
    assert [(c.index, c.text) for c in completion.choices] == [(0, "Hello1,")]
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=3, max_tokens=1)
    assert [(c.index, c.message.content) for c in chat.choices] == [(0, "Hello"), (1, "Hello1"), (2, "Hello2")]


def test_openai_n_choices_streamed(oai):
    texts = {}
    for chunk in oai.completions.create(model=MODEL, prompt="Hi", n=3, max_tokens=2, stream=True):
        texts[chunk.choices[0].index] = texts.get(chunk.choices[0].index, "") + chunk.choices[0].text
    assert texts == {0: "Hello,", 1: "Hello1,", 2: "Hello2,"}
    roles, contents, finishes = {}, {}, {}
    for chunk in oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=3, max_tokens=2, stream=True
    ):
        choice = chunk.choices[0]
        roles.setdefault(choice.index, choice.delta.role)
        contents[choice.index] = contents.get(choice.index, "") + (choice.delta.content or "")
        finishes[choice.index] = choice.finish_reason
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert contents == {0: "Hello,", 1: "Hello1,", 2: "Hello2,"}
    assert finishes == {0: "length", 1: "length", 2: "length"}


def test_openai_logprobs_and_top_logprobs(oai, backend):
    completion = oai.completions.create(model=MODEL, prompt="Hi", logprobs=2, max_tokens=2)
    logprobs = completion.choices[0].logprobs
    assert (logprobs.tokens, logprobs.token_logprobs) == (["Hello", ","], [-0.25, -0.5])
    assert logprobs.top_logprobs == [{"Hello": -0.25, " alt0": -1.25}, {",": -0.5, " alt0": -1.5}]
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=2, max_tokens=1
    )
    [item] = chat.choices[0].logprobs.content
    assert (item.token, item.logprob) == ("Hello", -0.25)
    assert [(t.token, t.logprob) for t in item.top_logprobs] == [("Hello", -0.25), (" alt0", -1.25)]
    assert backend.requests[-1].params == {"max_new_tokens": 1, "top_logprobs": 2}


def test_openai_scoring_request_of_lm_eval(oai, backend):
    """lm-evaluation-harness `local-completions`: {"model", "prompt", "echo", "logprobs", "max_tokens": 0,
    "temperature": 0}; it reads token_logprobs of the prompt's continuation and top_logprobs for greediness."""
    completion = oai.completions.create(
        model=MODEL, prompt="The cat sat", echo=True, logprobs=1, max_tokens=0, temperature=0
    )
    choice = completion.choices[0]
    assert (choice.text, choice.finish_reason) == ("The cat sat", "length")
    assert choice.logprobs.tokens == ["The", " cat", " sat"]
    assert choice.logprobs.token_logprobs == [None, -1.0, -1.0]
    assert choice.logprobs.top_logprobs[1:] == [{" alt0": -0.5, " cat": -1.0}, {" alt0": -0.5, " sat": -1.0}]
    assert completion.usage.completion_tokens == 0
    assert backend.requests[-1].params == {
        "max_new_tokens": 0,
        "temperature": 0,
        "top_logprobs": 1,
        "prompt_logprobs": 1,
    }
    # its default sends batches of token-id prompts
    completion = oai.completions.create(
        model=MODEL, prompt=[[5, 7, 9], [3, 4]], echo=True, logprobs=1, max_tokens=0, temperature=0
    )
    assert [r.prompt_token_ids for r in backend.requests[-2:]] == [[5, 7, 9], [3, 4]]
    assert [(c.index, c.logprobs.tokens, c.logprobs.token_logprobs) for c in completion.choices] == [
        (0, ["t5", " t7", " t9"], [None, -1.0, -1.0]),
        (1, ["t3", " t4"], [None, -1.0]),
    ]


def test_openai_response_format_and_vllm_constraints(oai, backend):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Where?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}},
    )
    assert backend.requests[-1].params["structured_output"] == {"type": "json", "value": schema}
    oai.completions.create(
        model=MODEL, prompt="Yes or no?", extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert backend.requests[-1].params["structured_output"] == {"type": "choice", "value": ["yes", "no"]}
    oai.completions.create(
        model=MODEL,
        prompt="x",
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={"7": -100},
        extra_body={"min_p": 0.1, "min_tokens": 1, "bad_words": ["no"], "allowed_token_ids": [7]},
    )
    assert backend.requests[-1].params == {
        "max_new_tokens": 16,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "logit_bias": {"7": -100},
        "min_p": 0.1,
        "min_tokens": 1,
        "bad_words": ["no"],
        "allowed_token_ids": [7],
    }
    with pytest.raises(openai.BadRequestError, match="cannot be used together") as caught:
        oai.completions.create(model=MODEL, prompt="x", extra_body={"guided_regex": "a", "guided_choice": ["a"]})
    assert caught.value.param == "guided_choice"


def test_openai_tools(oai, backend):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    backend.served = [dataclasses.replace(DEFAULT_MODEL, tool_call_parser="hermes")]
    backend.reply = ["<tool_call>", '{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "</tool_call>"]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    chat = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function",
        "get_weather",
        {"city": "Paris"},
    )
    assert backend.requests[-1].tools == tools
    calls, finish = {}, None
    for chunk in oai.chat.completions.create(model=MODEL, messages=messages, tools=tools, stream=True):
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or ():
            calls.setdefault(part.index, {"id": part.id, "name": part.function.name, "arguments": ""})
            calls[part.index]["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Paris"})]
    # the call and its result go back to the model as the next turn's messages
    backend.reply = ["It is sunny."]
    answer = oai.chat.completions.create(
        model=MODEL,
        tools=tools,
        messages=messages + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": "sunny"}],
    )
    assert answer.choices[0].message.content == "It is sunny."
    assert [m["role"] if isinstance(m, dict) else m.role for m in backend.requests[-1].messages] == [
        "user",
        "assistant",
        "tool",
    ]
    assert backend.requests[-1].messages[1]["tool_calls"][0]["id"] == call.id


def test_openai_errors(oai, backend):
    with pytest.raises(openai.NotFoundError) as caught:
        oai.completions.create(model="gpt-4", prompt="Hi")
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], top_logprobs=2)
    assert caught.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model=MODEL, prompt="Hi", suffix="!")
    assert caught.value.param == "suffix"
    backend.fail_before = Overloaded("queue is full")
    with pytest.raises(openai.RateLimitError):
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    backend.fail_before = errors.WorkerUnavailable("the worker stopped")
    with pytest.raises(openai.InternalServerError) as caught:
        oai.completions.create(model=MODEL, prompt="Hi", stream=True)
    assert caught.value.status_code == 503
    backend.fail_before = None
    backend.fail_after = (2, errors.Failed("device lost"))
    stream = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True)
    with pytest.raises(openai.APIError, match="device lost"):
        list(stream)


def test_openai_client_closing_a_stream_aborts_the_generation(oai, backend):
    backend.stall_after = 2
    stream = oai.completions.create(model=MODEL, prompt="Hi", stream=True)
    assert [next(stream).choices[0].text, next(stream).choices[0].text] == ["Hello", ","]
    stream.close()
    _wait_for_outcome(backend)


def _wait_for_outcome(backend):
    """The server sees the disconnect asynchronously: wait (with a deadline) for the backend's record."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not backend.outcomes:
        assert time.monotonic() < deadline, "the backend's stream was never cancelled"
        time.sleep(0.01)  # ok-sleep: polling with a deadline
    assert list(backend.outcomes.values()) == ["cancelled"]


# TGI's text-generation client, from .venv-clients (it pins huggingface-hub < 1)


@pytest.fixture(name="tgi_client")
def _tgi_client():
    require_clients()


@pytest.mark.usefixtures("tgi_client")
def test_text_generation_client(url, backend):
    run_check("tgi_checks.py", url, "generate")
    assert backend.requests[-2].params == {"max_new_tokens": 3, "do_sample": False, "seed": 5}  # then the stream


@pytest.mark.usefixtures("tgi_client")
def test_text_generation_client_errors(url, backend):
    run_check("tgi_checks.py", url, "validation_error")
    backend.fail_before = Overloaded("queue is full")
    run_check("tgi_checks.py", url, "overloaded")
    backend.fail_before = None
    backend.fail_after = (1, errors.Failed("device lost"))
    run_check("tgi_checks.py", url, "generation_error")


# huggingface_hub's InferenceClient (TGI's compat route "/")


def test_inference_client_text_generation(url):
    from huggingface_hub import InferenceClient  # pylint: disable=import-outside-toplevel

    client = InferenceClient(model=url, timeout=30)
    assert client.text_generation("Hi there", max_new_tokens=3, return_full_text=False) == "Hello, world"
    assert client.text_generation("Hi ", max_new_tokens=1) == "Hi Hello"  # "/" defaults to the full text, as TGI
    output = client.text_generation("Hi there", max_new_tokens=3, details=True, return_full_text=False)
    assert output.generated_text == "Hello, world"
    assert output.details.finish_reason == "length"
    assert output.details.generated_tokens == 3
    tokens = list(client.text_generation("Hi there", stream=True, return_full_text=False))
    assert "".join(tokens) == "Hello, world!"
    events = list(client.text_generation("Hi there", stream=True, details=True, return_full_text=False))
    assert events[-1].generated_text == "Hello, world!"
    assert events[-1].details.finish_reason == "eos_token"


def test_inference_client_errors_and_chat(url, backend):
    from huggingface_hub import InferenceClient  # pylint: disable=import-outside-toplevel
    from huggingface_hub.errors import GenerationError, OverloadedError  # pylint: disable=import-outside-toplevel

    client = InferenceClient(model=url, timeout=30)
    backend.fail_before = Overloaded("queue is full")
    with pytest.raises(OverloadedError):
        client.text_generation("Hi")
    backend.fail_before = None
    backend.fail_after = (1, errors.Failed("device lost"))
    with pytest.raises(GenerationError, match="device lost"):
        list(client.text_generation("Hi", stream=True))
    backend.fail_after = None
    chat = InferenceClient(base_url=url, timeout=30).chat_completion(
        [{"role": "user", "content": "Hi"}], model=MODEL, max_tokens=2
    )
    assert chat.choices[0].message.content == "Hello,"


def test_inference_client_grammar_top_tokens_prefill_and_best_of(url, backend):
    from huggingface_hub import InferenceClient  # pylint: disable=import-outside-toplevel
    from huggingface_hub.errors import ValidationError  # pylint: disable=import-outside-toplevel

    client = InferenceClient(model=url, timeout=30)
    output = client.text_generation(
        "Hi there",
        max_new_tokens=2,
        details=True,
        top_n_tokens=2,
        decoder_input_details=True,
        return_full_text=False,
        grammar={"type": "json", "value": {"properties": {"a": {"type": "string"}}}},
    )
    assert backend.requests[-1].params["structured_output"] == {
        "type": "json",
        "value": '{"properties": {"a": {"type": "string"}}}',
    }
    assert output.generated_text == "Hello,"
    assert [t.text for t in output.details.tokens] == ["Hello", ","]
    # huggingface_hub leaves a list of lists as JSON: each top token is a dict
    assert [[t["text"] for t in top] for top in output.details.top_tokens] == [["Hello", " alt0"], [",", " alt0"]]
    assert [(t.text, t.logprob) for t in output.details.prefill] == [("Hi", None), (" there", -1.0)]
    events = list(
        client.text_generation(
            "Hi there",
            stream=True,
            details=True,
            top_n_tokens=1,
            max_new_tokens=2,
            grammar={"type": "regex", "value": "Hel+o,"},
        )
    )
    assert [[t.text for t in e.top_tokens] for e in events] == [["Hello"], [","]]
    assert events[-1].generated_text == "Hi thereHello,"  # "/" returns the full text by default, as TGI
    backend.choice_bias = {1: 0.5}  # the second candidate is the likelier one
    try:
        output = client.text_generation(
            "Hi", best_of=2, do_sample=True, max_new_tokens=2, details=True, return_full_text=False
        )
    finally:
        backend.choice_bias = {}
    assert output.generated_text == "Hello1,"
    assert [s.generated_text for s in output.details.best_of_sequences] == ["Hello,"]
    assert backend.requests[-1].params["n"] == 2
    with pytest.raises(ValidationError, match="`best_of` != 1 is not supported when streaming tokens"):
        list(client.text_generation("Hi", stream=True, best_of=2, do_sample=True))
