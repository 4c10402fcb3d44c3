"""The OpenAI features end to end against serving_server.py and the bundled tiny LLM (agents, graphs, engine, grammar
engine), with the real `openai` client: structured output under concurrent sampled load, n choices, top logprobs,
lm-evaluation-harness's `local-completions` scoring request checked against the engine's own prompt logprobs, forced
tool calls; and with huggingface_hub's InferenceClient: TGI's grammar, top tokens and prefill."""

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import numpy as np
import pydantic
import pytest
from llm_setup import offline_engine

openai = pytest.importorskip("openai")

MODEL = "llama_tiny"
PROMPT = "And God said"
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
}
CONCURRENT_REQUESTS = 200


@pytest.fixture(scope="module", name="client")
def _client(llm_server):
    return openai.OpenAI(base_url=f"http://{llm_server[2]}/v1", api_key="unused", max_retries=0, timeout=120)


def _constrained(client, prompt: str, seed=None, temperature=0.9):
    return client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=96,
        temperature=temperature,
        seed=seed,
        extra_body={"structured_outputs": {"json": SCHEMA}},
    ).choices[0]


def test_structured_output_follows_its_schema_in_every_sampled_concurrent_request(client):
    with ThreadPoolExecutor(32) as pool:
        choices = list(pool.map(lambda i: _constrained(client, f"{PROMPT} {i}", seed=i), range(CONCURRENT_REQUESTS)))
    for choice in choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.text), SCHEMA)


def test_greedy_structured_output_under_load_equals_the_request_alone(client):
    alone = _constrained(client, PROMPT, temperature=0).text
    with ThreadPoolExecutor(16) as pool:
        others = [pool.submit(_constrained, client, f"{PROMPT} {i}", i) for i in range(24)]
        loaded = [pool.submit(_constrained, client, PROMPT, None, 0) for _ in range(4)]
        texts = [f.result().text for f in loaded]
        for future in others:
            future.result()
    assert texts == [alone] * 4
    jsonschema.validate(json.loads(alone), SCHEMA)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    age: int = pydantic.Field(ge=0, le=120)
    tags: list[str] = pydantic.Field(max_length=3)


def test_chat_completions_parse_reads_a_pydantic_model_back(client):
    """The openai client's own structured output helper: it sends the model's strict JSON schema as response_format
    and parses the reply into the model."""
    reply = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Who was king?"}],
        response_format=Person,
        max_tokens=96,
        temperature=0.8,
        seed=3,
    )
    person = reply.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120


def test_a_bad_schema_is_refused_before_generating(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, extra_body={"structured_outputs": {"regex": "[a-"}}
        )
    assert "regex" in str(info.value)


def test_n_choices_with_top_logprobs(client):
    reply = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, n=3, temperature=1.0, seed=7, logprobs=3
    )
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert reply.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in reply.choices)
    for choice in reply.choices:
        assert len(choice.logprobs.top_logprobs) == len(choice.logprobs.tokens)
        for _token, logprob, top in zip(
            choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs
        ):
            assert 1 <= len(top) <= 4 and max(top.values()) >= logprob - 1e-4  # the 3 likeliest and the chosen
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, n=3, temperature=1.0, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in reply.choices]


def test_lm_eval_local_completions_scores_equal_the_engines_log_softmax(client, llm_server):
    """lm-evaluation-harness `local-completions` loglikelihood requests: token-id prompts in a batch, echo, logprobs,
    max_tokens 0 (older versions) and 1 (newer ones, which drop the last position)."""
    engine = offline_engine(llm_server[3])
    texts = [f"{PROMPT} let there be light", "In the beginning God created the heaven"]
    batch = [engine.tokenizer.encode(t) for t in texts]
    batch = [list(getattr(ids, "ids", ids)) for ids in batch]
    for max_tokens in (0, 1):
        reply = client.completions.create(
            model=MODEL, prompt=batch, echo=True, logprobs=1, max_tokens=max_tokens, temperature=0, seed=1234
        )
        assert len(reply.choices) == len(batch)
        for choice in sorted(reply.choices, key=lambda c: c.index):
            ids = batch[choice.index]
            scored = choice.logprobs.token_logprobs[: len(ids)]
            assert scored[0] is None
            expected = _prompt_logprobs(engine, ids)
            np.testing.assert_allclose(scored[1:], expected, atol=2e-4)
            assert len(choice.logprobs.token_logprobs) == len(ids) + max_tokens


def _prompt_logprobs(engine, ids):
    """log P(ids[i] | ids[:i]) for i >= 1, from the model's own logits (the engine's forward over the prompt)."""
    (output,) = engine.generate([ids], {"max_new_tokens": 0, "prompt_logprobs": 0})
    return [v for v in output.prompt_logprobs[1:]]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "days"],
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def _chat(client, tool_choice, **kwargs):
    # NOTE: one call at most: the tiny model, forced to call, would call on until max_tokens cuts the JSON
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Ur?"}],
        tools=[WEATHER, TIME],
        tool_choice=tool_choice,
        max_tokens=64,
        temperature=0,
        parallel_tool_calls=False,
        **kwargs,
    )


def test_forced_tool_calls_come_back_as_tool_calls_streamed_or_not(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (named, "required"):
        message = _chat(client, choice).choices[0].message
        assert message.tool_calls, message
        for call in message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            arguments = json.loads(call.function.arguments)
            if call.function.name == "get_weather":
                jsonschema.validate(arguments, WEATHER["function"]["parameters"])
            else:
                assert call.function.name == "get_time"
        calls = {}
        for chunk in _chat(client, choice, stream=True):
            for delta in chunk.choices[0].delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
        assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
            (calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)
        ]
    # the call and its result go back through the chat template for the next turn
    follow = client.chat.completions.create(
        model=MODEL,
        max_tokens=4,
        temperature=0,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Ur?"},
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"},
        ],
    )
    assert follow.choices[0].finish_reason in ("stop", "length")


def test_tgi_grammar_top_tokens_and_prefill_with_huggingface_hub(llm_server):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    tgi = huggingface_hub.InferenceClient(f"http://{llm_server[2]}")
    reply = tgi.text_generation(
        PROMPT,
        max_new_tokens=24,
        details=True,
        top_n_tokens=3,
        decoder_input_details=True,
        grammar={"type": "regex", "value": "(yes|no), [0-9]{1,3}"},
        seed=5,
        do_sample=True,
        temperature=1.0,
        return_full_text=False,
    )
    assert reply.details.finish_reason == "eos_token"
    assert reply.generated_text.split(", ")[0] in ("yes", "no") and reply.generated_text.split(", ")[1].isdigit()
    assert len(reply.details.top_tokens) == len(reply.details.tokens)
    assert reply.details.prefill[0].logprob is None and all(t.logprob < 0 for t in reply.details.prefill[1:])
