"""Every LLM API against a real server: greedy output equals the engine's offline output; streaming,
cancellation, queue overflow and bad input."""

import json
import threading

import numpy as np
import pytest
import requests
from llm_setup import offline_greedy, write_config, write_servable
from serving_process import start_server

from mindspore_serving.client import Client
from mindspore_serving.models.llama.tokenizer import TextTokenizer
from mindspore_serving.spec.llm_config import load_serving_config

PROMPT = "And the king of"
N = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llm_apis")
    config = write_config(directory, start_port=0, max_num_seqs=2, max_queue_size=1)
    servables = write_servable(directory, config)
    proc, grpc_addr, rest_addr = start_server(
        directory, servables=("llama_tiny",), extra_args=["--servable_directory", servables]
    )
    try:
        yield grpc_addr, f"http://{rest_addr}", config
    finally:
        proc.close()


@pytest.fixture(scope="module")
def expected(server):
    return offline_greedy(server[2], PROMPT, N)


def sse_events(response):
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data:"):
            payload = line[len("data:") :].strip()
            if payload != "[DONE]":
                yield json.loads(payload)


def test_classic_generate_and_stream(server, expected):
    grpc_addr, url, _ = server
    reply = requests.post(
        f"{url}/model/llama_tiny:generate",
        timeout=60,
        json={"instances": [{"prompt": PROMPT, "max_new_tokens": N, "temperature": 0.0}]},
    ).json()
    assert reply["instances"][0]["token_ids"] == expected.token_ids
    with requests.post(
        f"{url}/model/llama_tiny:generate_stream",
        timeout=60,
        stream=True,
        json={"instances": [{"inputs": PROMPT, "max_new_tokens": N, "temperature": 0.0}]},
    ) as response:
        events = list(sse_events(response))
    tokens = [e["token"]["id"] for e in events if e.get("token")]
    assert tokens == expected.token_ids
    streamed = list(
        Client(grpc_addr, "llama_tiny", "generate").infer_stream(
            {"prompt": PROMPT, "max_new_tokens": np.int32(N), "temperature": np.float32(0)}
        )
    )
    assert [int(e["token_id"]) for e in streamed if "token_id" in e] == expected.token_ids
    assert streamed[-1]["finished"] and streamed[-1]["text"] == expected.text


def test_tgi_routes(server, expected):
    _, url, _ = server
    reply = requests.post(
        f"{url}/generate", timeout=60, json={"inputs": PROMPT, "parameters": {"max_new_tokens": N, "details": True}}
    )
    assert reply.status_code == 200
    body = reply.json()
    assert body["generated_text"] == expected.text
    assert [t["id"] for t in body["details"]["tokens"]] == expected.token_ids
    assert int(reply.headers["x-generated-tokens"]) == N
    with requests.post(
        f"{url}/generate_stream", timeout=60, stream=True, json={"inputs": PROMPT, "parameters": {"max_new_tokens": N}}
    ) as response:
        events = list(sse_events(response))
    assert events[-1]["generated_text"] == expected.text
    assert requests.get(f"{url}/info").status_code == 200
    bad = requests.post(f"{url}/generate", json={"inputs": PROMPT, "parameters": {"top_p": 1.5}})
    assert bad.status_code == 422 and bad.json()["error_type"] == "validation"
    assert requests.post(f"{url}/generate", json={"parameters": {}}).status_code == 422


def test_mindspore_llm_serving_routes(server, expected):
    _, url, _ = server
    reply = requests.post(
        f"{url}/models/llama_tiny/generate",
        timeout=60,
        json={"inputs": PROMPT, "parameters": {"max_new_tokens": N, "do_sample": False}},
    )
    assert reply.status_code == 200
    assert expected.text in json.dumps(reply.json())


def test_openai_client(server, expected):
    openai = pytest.importorskip("openai")
    _, url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["llama_tiny"]
    completion = client.completions.create(model="llama_tiny", prompt=PROMPT, max_tokens=N, temperature=0)
    assert completion.choices[0].text == expected.text
    assert completion.usage.completion_tokens == N
    chunks = client.completions.create(model="llama_tiny", prompt=PROMPT, max_tokens=N, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    chat = client.chat.completions.create(
        model="llama_tiny", max_tokens=4, messages=[{"role": "user", "content": "Who was king?"}]
    )
    assert chat.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="llama_tiny", prompt=PROMPT, max_tokens=2, top_p=2.0)


def test_tokenize_and_detokenize_show_what_the_model_gets(server):
    """/tokenize of chat messages gives the ids a chat completion's prompt has (the bundled template's), and
    /detokenize turns them back into the template's text."""
    _, url, config = server
    serving = load_serving_config(config)
    tokenizer = TextTokenizer.from_file(serving.model.tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who was king?"}]
    chat = requests.post(f"{url}/tokenize", timeout=60, json={"model": "llama_tiny", "messages": messages}).json()
    text = "<s><|system|>\nBe brief.\n<|user|>\nWho was king?\n<|assistant|>\n"
    assert chat["tokens"] == tokenizer.encode(text, add_special_tokens=False) and chat["tokens"][0] == 1
    assert (chat["count"], chat["max_model_len"]) == (len(chat["tokens"]), serving.engine.max_model_len)
    completion = requests.post(
        f"{url}/v1/chat/completions", timeout=60, json={"model": "llama_tiny", "messages": messages, "max_tokens": 1}
    ).json()
    assert completion["usage"]["prompt_tokens"] == chat["count"]
    prompt = requests.post(f"{url}/tokenize", timeout=60, json={"prompt": PROMPT}).json()
    assert prompt["tokens"] == tokenizer.encode(PROMPT)
    back = requests.post(f"{url}/detokenize", timeout=60, json={"model": "llama_tiny", "tokens": chat["tokens"]})
    assert back.json() == {"prompt": tokenizer.decode(chat["tokens"], skip_special_tokens=False)}
    assert back.json()["prompt"].startswith("<s>")
    bad = requests.post(f"{url}/detokenize", timeout=60, json={"tokens": [10**6]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]


LONG = {"prompt": PROMPT, "max_tokens": 220, "temperature": 0, "model": "llama_tiny", "ignore_eos": True}


def test_disconnect_frees_the_slots(server):
    """Both slots taken by long streams whose clients go away: a new request is served at once."""
    _, url, _ = server
    streams = []
    try:
        for _ in range(2):
            response = requests.post(f"{url}/v1/completions", json={**LONG, "stream": True}, stream=True, timeout=120)
            assert response.status_code == 200
            next(line for line in response.iter_lines(decode_unicode=True) if line and line.startswith("data:"))
            streams.append(response)
    finally:
        for response in streams:
            response.close()  # the clients go away mid-stream
    reply = requests.post(f"{url}/generate", timeout=120, json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}})
    assert reply.status_code == 200
    # the aborted generations would otherwise hold both slots for seconds (220 tokens each)
    assert float(reply.headers["x-queue-time"]) < 1500


def test_queue_overflow_is_refused_with_429(server):
    """Two slots and one queue place: of four concurrent long requests exactly one is refused."""
    _, url, _ = server
    statuses = []

    def call():
        reply = requests.post(f"{url}/v1/completions", json=LONG, timeout=300)
        statuses.append((reply.status_code, reply.json()))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    codes = sorted(code for code, _ in statuses)
    assert codes == [200, 200, 200, 429]
    refused = next(body for code, body in statuses if code == 429)
    assert refused["error"]["code"] == "rate_limit_exceeded" or "overloaded" in json.dumps(refused).lower()
