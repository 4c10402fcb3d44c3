"""Hugging Face model directories served by one command: `serving_server.py --model DIR` for the five fixtures of
tests/fixtures/hf at tensor parallelism 1, and `register.declare_llm(model_dir=..., tensor_parallel=2)` for llama3
and qwen2, all in one server (each export and each start of an LLM costs seconds; one server keeps the suite's
time). Each export is the three dynamic-shape step graphs (any batch and prompt length); the --model servers' engines
run at most 2 sequences and 32 tokens a step (--max_num_seqs, --max_num_batched_tokens: longer prompts in chunks),
the declare_llm ones hf_serving's defaults.

Every served model must give transformers' answers: the prompt ids (/tokenize), the 16 greedy tokens
(/model/<name>:generate with ignore_eos, and repetition_penalty 1 over generation_config.json's: transformers'
greedy tokens were computed without logits processors), the first token's log-probability (/v1/completions,
logprobs=0) within LOGPROB_ATOL of the log-softmax of transformers' logits, and the chat templates' ids (/tokenize
with messages, apply_chat_template's). The full first-step logits of each exported rank-0 graph directory (TP=1)
are compared in-process within LOGIT_RTOL of their scale. llama3 is served with n-gram speculative decoding
(--speculative_config, given once per --model: the same export verifies its proposals): its greedy tokens must
stay transformers', and a longer run must verify drafts (/metrics) and equal llama3_tp2's, served without
speculation. Then the model cache: a second start with the same export settings uses the graphs exported at the
first (whatever its engine settings and speculation), a changed max_model_len exports again, a removed bucket flag
is refused with what replaced it, and a tensor parallelism that does not divide the heads is refused before any
export.
"""

import collections
import glob
import json
import os

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from serving_process import ROOT, ServingProcess, free_port

# the server's start exports 5 models, then 2 tensor-parallel ones in their workers, and starts 9 agents: 90-150 s on
# two shared cores, ~45 s once exported
pytestmark = pytest.mark.timeout(480)

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")
TP1 = ["llama3", "llama2_linear", "mistral", "qwen2", "qwen3"]
TP2 = {"llama3_tp2": "llama3", "qwen2_tp2": "qwen2"}  # servable -> fixture
LOGPROB_ATOL = 1e-4  # measured differences are ~2e-6
LOGIT_RTOL = 1e-5  # of the logits' largest magnitude, as tests/unit/test_hf_models.py
SMALL = {"max_num_seqs": 2, "max_num_batched_tokens": 32}
"""The engine's bounds of a step for the --model servers (engine settings: not in the graphs' cache key)."""
MAX_MODEL_LEN = 128
SPECULATIVE = {"llama3": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}}
"""The --model fixtures served with speculative decoding (the others: null)."""


def flags(cache):
    return ["--model_cache", cache, "--max_model_len", str(MAX_MODEL_LEN)] + [
        arg for field, value in SMALL.items() for arg in (f"--{field}", str(value))
    ]


def expected(fixture):
    with open(os.path.join(FIXTURES, fixture, "expected.json"), encoding="utf-8") as stream:
        return json.load(stream), np.load(os.path.join(FIXTURES, fixture, "logits.npy"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf_serving")
    cache = str(directory / "model_cache")
    for servable, fixture in TP2.items():
        os.makedirs(directory / "servables" / servable)
        with open(directory / "servables" / servable / "servable_config.py", "w", encoding="utf-8") as stream:
            stream.write(
                "from mindspore_serving.server import register\n"
                f"register.declare_llm(model_dir={os.path.join(FIXTURES, fixture)!r}, tensor_parallel=2, "
                f"max_model_len={MAX_MODEL_LEN}, model_cache={cache!r})\n"
            )
    rest = f"127.0.0.1:{free_port()}"
    args = [
        os.path.join(ROOT, "serving_server.py"),
        "--grpc",
        f"127.0.0.1:{free_port()}",
        "--rest",
        rest,
        "--servable_directory",
        str(directory / "servables"),
        "--servables",
        ",".join(TP2),
    ]
    args += [arg for fixture in TP1 for arg in ("--model", os.path.join(FIXTURES, fixture))] + flags(cache)
    args += [arg for fixture in TP1 for arg in ("--speculative_config", json.dumps(SPECULATIVE.get(fixture)))]
    proc = ServingProcess(args, str(directory))
    try:
        proc.wait_for("RESTful server start success", timeout=420)
        yield f"http://{rest}", cache, proc
    finally:
        proc.close()


def post(url, path, body, status=200):
    response = requests.post(url + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


def test_every_model_is_listed(server):
    url, _, proc = server
    models = requests.get(f"{url}/v1/models", timeout=10).json()["data"]
    assert sorted(m["id"] for m in models) == sorted(TP1 + list(TP2))
    assert all(m["max_model_len"] == MAX_MODEL_LEN for m in models)
    for fixture in TP1:  # the same three step graphs with speculation or without
        assert f"{fixture}: exporting the step graphs into" in proc.output()


@pytest.mark.parametrize("name", TP1 + list(TP2))
def test_greedy_tokens_and_logprobs_equal_transformers(server, name):
    url = server[0]
    exp, logits = expected(TP2.get(name, name))
    prompts = exp["prompts"]
    for prompt in prompts:  # the server's tokenizer gives transformers' prompt ids (bos where the family adds one)
        assert post(url, "/tokenize", {"model": name, "prompt": prompt["text"]})["tokens"] == prompt["input_ids"]
    reply = post(
        url,
        f"/model/{name}:generate",
        {
            "instances": [
                {
                    "prompt": p["text"],
                    "max_new_tokens": 16,
                    "temperature": 0,
                    "ignore_eos": True,
                    "repetition_penalty": 1.0,
                }
                for p in prompts
            ]
        },
    )
    assert [i["token_ids"] for i in reply["instances"]] == [p["greedy_ids"] for p in prompts]
    if name in SPECULATIVE:
        _check_speculation(url, name, prompts[-1])
    for row, prompt in zip(logits.astype(np.float64), prompts):
        choice = post(
            url,
            "/v1/completions",
            {
                "model": name,
                "prompt": prompt["text"],
                "max_tokens": 16,
                "temperature": 0,
                "ignore_eos": True,
                "repetition_penalty": 1.0,
                "logprobs": 0,
            },
        )["choices"][0]
        log_softmax = row - row.max() - np.log(np.exp(row - row.max()).sum())
        assert abs(choice["logprobs"]["token_logprobs"][0] - log_softmax[prompt["greedy_ids"][0]]) < LOGPROB_ATOL


def _check_speculation(url, name, prompt):
    """Speculation happened and kept the greedy tokens: 48 tokens of `prompt`, whose output repeats itself, verify
    proposed tokens (/metrics counts drafts; the fixture's 16 tokens rarely do: greedy rounds planned ahead look
    for proposals every few rounds), the first 16 are transformers' and all are those of the same weights served
    without speculation (the TP=2 servable)."""
    before = _spec_metrics(url, name)
    body = {
        "instances": [
            {
                "prompt": prompt["text"],
                "max_new_tokens": 48,
                "temperature": 0,
                "ignore_eos": True,
                "repetition_penalty": 1.0,
            }
        ]
    }
    tokens = post(url, f"/model/{name}:generate", body)["instances"][0]["token_ids"]
    assert (_spec_metrics(url, name) - before)["drafts"] > 0
    assert tokens[:16] == prompt["greedy_ids"]
    plain = next(servable for servable, fixture in TP2.items() if fixture == name)
    assert tokens == post(url, f"/model/{plain}:generate", body)["instances"][0]["token_ids"]


def _spec_metrics(url, name) -> collections.Counter:
    """The speculative decoding counters of the served model `name` (drafts, accepted_tokens), from /metrics."""
    reply = requests.get(f"{url}/metrics", timeout=10)
    assert reply.status_code == 200
    found = collections.Counter()
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            for counter in ("drafts", "accepted_tokens"):
                if (
                    sample.name == f"mindspore_serving:spec_decode_num_{counter}_total"
                    and sample.labels.get("model_name") == name
                ):
                    found[counter] += sample.value
    return found


@pytest.mark.parametrize("name", TP1)
def test_chat_templates_give_apply_chat_template_ids(server, name):
    url = server[0]
    exp, _ = expected(name)
    for case in exp["chat"]["cases"]:
        body = {"model": name, "messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"]}
        if "tools" in case:
            body["tools"] = case["tools"]
        if "enable_thinking" in case:
            body["chat_template_kwargs"] = {"enable_thinking": case["enable_thinking"]}
        if "error" in case:
            assert case["error"] in post(url, "/tokenize", body, status=400)["error"]["message"]
        else:
            assert post(url, "/tokenize", body)["tokens"] == case["ids"], case["name"]


def test_chat_completion_and_tgi_style_route(server):
    url = server[0]
    reply = post(
        url,
        "/v1/chat/completions",
        {"model": "qwen2_tp2", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "Hello"}]},
    )
    assert reply["model"] == "qwen2_tp2" and reply["usage"]["completion_tokens"] <= 4
    reply = post(url, "/models/mistral/generate", {"inputs": "Hello", "parameters": {"max_new_tokens": 3}})
    assert reply["generated_text"] is not None


def test_exported_graphs_give_transformers_logits(server):
    """The whole first-step logits, from each TP=1 export's graphs run in this process."""
    ms = pytest.importorskip("mindspore")  # noqa: F841
    from mindspore_serving.agent.graph_runner import GraphRunner
    from mindspore_serving.llm.model_io import SeqStep

    cache = server[1]
    for fixture in TP1:
        (graphs,) = glob.glob(os.path.join(cache, f"{fixture}-*", "graphs", "rank_0"))
        runner = GraphRunner(graphs, num_blocks=16, warmup=False)
        exp, want = expected(fixture)
        for prompt, row in zip(exp["prompts"], want):
            ids = prompt["input_ids"]
            got = runner.run([SeqStep(ids, 0, list(range(1, 1 + -(-len(ids) // 16))))])[0]
            np.testing.assert_allclose(got, row, rtol=0, atol=LOGIT_RTOL * float(np.abs(row).max()))


def run_cli(directory, *args, wait_for=None):
    """serving_server.py --prepare_only with `args`; its output, once it exits (or once `wait_for` is printed)."""
    proc = ServingProcess([os.path.join(ROOT, "serving_server.py"), "--prepare_only", *args], str(directory))
    try:
        if wait_for:
            return proc.wait_for(wait_for, timeout=60), None
        code = proc.wait_exit(60)
        return proc.output(), code
    finally:
        proc.close()


def test_the_cache_is_used_until_a_setting_changes(server, tmp_path):
    _, cache, _ = server
    qwen2 = os.path.join(FIXTURES, "qwen2")
    # the engine's settings and speculation are llm.yaml's, not the export's (this rewrites the served qwen2's
    # llm.yaml, which the next start writes back)
    engine = ["--max_num_seqs", "4", "--max_num_batched_tokens", "64", "--speculative_config", '{"method": "ngram"}']
    out, code = run_cli(tmp_path, "--model", qwen2, *flags(cache), *engine)
    assert code == 0 and "qwen2: using the graphs exported at" in out and "exporting" not in out, out
    out, code = run_cli(tmp_path, "--model", qwen2, *flags(cache))
    assert code == 0 and "qwen2: using the graphs exported at" in out and "exporting" not in out, out
    out, code = run_cli(tmp_path, "--model", qwen2, *flags(cache), "--prefill_len_buckets", "16,32")
    assert code == 2 and "exporting" not in out, out
    assert (
        "--prefill_len_buckets was removed: the model's graphs take any batch and prompt length (dynamic shapes); "
        "--max_num_seqs and --max_num_batched_tokens bound a step"
    ) in out, out
    # another max_model_len: graphs of another length (the last --max_model_len counts)
    out, _ = run_cli(
        tmp_path,
        "--model",
        qwen2,
        *flags(cache),
        "--max_model_len",
        "64",
        wait_for="qwen2: exporting the step graphs into",
    )
    assert len([d for d in glob.glob(os.path.join(cache, "qwen2-*")) if os.path.isdir(d)]) == 2  # a new one
    out, code = run_cli(tmp_path, "--model", qwen2, *flags(cache), "--tensor_parallel", "3")
    assert code != 0 and "tensor_parallel=3 does not divide the model's num_attention_heads=4" in out, out
