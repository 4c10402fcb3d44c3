"""Speculative decoding on the real exported graphs (config/llama_tiny_spec.yaml: the tiny model's step graphs,
which verify 1 + 4 tokens per row as any step): greedy output with n-gram speculation equals the output of each
request alone without it, token for token and logprob for logprob, under continuous batching, prefix caching,
preemption, multi-step rounds and async scheduling; stop strings, stop tokens and max_tokens cut where they would
without it.
"""

import json
import os

import numpy as np
import pytest
from llm_setup import ROOT, SPEC_CONFIG

from mindspore_serving.agent.testing import Ahead
from mindspore_serving.llm import LLMEngine, SamplingParams, SchedulerConfig
from mindspore_serving.llm.sampling_params import StructuredOutput
from mindspore_serving.spec.llm_config import load_serving_config

NUM_REQUESTS = 12
SPEC = dict(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=4)


@pytest.fixture(scope="module")
def serving_config():
    return load_serving_config(SPEC_CONFIG)


@pytest.fixture(scope="module")
def tokenizer(serving_config):
    from mindspore_serving.models.llama.tokenizer import TextTokenizer

    return TextTokenizer.from_file(serving_config.model.tokenizer)


def workload(tokenizer):
    """Prompts of the model's own training text (verses of data/kjv_narrative.txt, 1 to 5 of them, some sharing
    their start: prefix caching), with 8 to 60 new tokens each."""
    with open(os.path.join(ROOT, "data", "kjv_narrative.txt"), encoding="utf-8") as stream:
        lines = stream.read().splitlines()
    rng = np.random.default_rng(3)
    requests = []
    for i in range(NUM_REQUESTS):
        start = 40 * (i // 3) if i % 3 else int(rng.integers(0, len(lines) - 5))
        text = " ".join(lines[start : start + int(rng.integers(1, 6))])
        requests.append((tokenizer.encode(text)[:120], int(rng.integers(8, 61))))
    return requests


def config_for(runner, **overrides):
    base = dict(max_num_seqs=8, max_num_batched_tokens=128)
    base.update(overrides)
    return SchedulerConfig.for_runner(runner, **base)


def greedy(max_new_tokens, **more):
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True, top_logprobs=1, **more)


def run_staggered(runner, config, requests, params_for=greedy):
    """Adds two requests every step, so they join a running batch at different steps; returns each one's final
    output and the engine's speculation counts (drafts, proposed tokens, accepted tokens)."""
    engine = LLMEngine(runner, scheduler_config=config)
    counts = np.zeros(3, np.int64)
    engine.add_step_listener(lambda s: counts.__iadd__([s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens]))
    ids, final, pending = [], {}, list(requests)
    while pending or engine.has_unfinished():
        for prompt, n in pending[:2]:
            ids.append(engine.add_request(prompt_token_ids=prompt, params=params_for(n)))
        pending = pending[2:]
        for output in engine.step():
            if output.finished:
                final[output.request_id] = output
    return [final[i] for i in ids], counts, engine


@pytest.fixture(scope="module")
def alone(runner, tokenizer):
    requests = workload(tokenizer)
    engine = LLMEngine(runner, scheduler_config=config_for(runner))
    return requests, [engine.generate([prompt], greedy(n))[0] for prompt, n in requests]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(enable_prefix_caching=True, num_scheduler_steps=4),
        dict(num_blocks=17),  # one max-length sequence fits, eight concurrent ones do not: preemption
        dict(async_scheduling=True, num_scheduler_steps=4, enable_prefix_caching=True),
    ],
    ids=["prefix-caching-rounds", "tiny-block-pool", "async"],
)
def test_greedy_output_with_speculation_equals_each_request_alone_without(runner, alone, overrides):
    requests, expected = alone
    calls = runner.calls
    model = Ahead(runner, mixed_steps=True) if overrides.get("async_scheduling") else runner
    got, (drafts, proposed, accepted), engine = run_staggered(
        model, config_for(runner, speculative=SPEC, **overrides), requests
    )
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    np.testing.assert_allclose(
        np.concatenate([o.logprobs for o in got]), np.concatenate([o.logprobs for o in expected]), rtol=0, atol=1e-4
    )
    assert drafts > 0 and 0 < accepted <= proposed
    assert runner.calls > calls
    if "num_blocks" in overrides:
        assert engine.core.scheduler.num_preemptions > 0


def test_stop_strings_stop_tokens_and_max_tokens_cut_where_they_would_without_speculation(runner, tokenizer, alone):
    requests, expected = alone
    # stop on text and on a token the plain outputs reach in their middle
    texts = [tokenizer.decode(o.token_ids) for o in expected]
    stop_text = next(text[len(text) // 2 : len(text) // 2 + 6] for text in texts if len(text) > 20)
    stop_id = expected[0].token_ids[len(expected[0].token_ids) // 2]

    def params(n):
        return SamplingParams(temperature=0.0, max_new_tokens=n, stop=[stop_text], stop_token_ids=[stop_id])

    def run(speculative):
        engine = LLMEngine(runner, tokenizer, config_for(runner, speculative=speculative))
        outputs = engine.generate([prompt for prompt, _ in requests], [params(n) for _, n in requests])
        return [(o.token_ids, o.text, o.finish_reason) for o in outputs]

    plain = run(None)
    assert sum(1 for _, _, reason in plain if reason.value == "stop") >= 2
    assert run(SPEC) == plain


def test_structured_output_masks_apply_per_accepted_token(runner, tokenizer, alone):
    """Greedy JSON under a schema: with speculation each position is masked as if the tokens before it were
    generated, so the output equals the one without, and stays valid."""
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"names": {"type": "array", "items": {"type": "string"}}},
            "required": ["names"],
        }
    )
    requests, _ = alone
    params = SamplingParams(temperature=0.0, max_new_tokens=60, structured_output=StructuredOutput("json", schema))

    def run(speculative):
        engine = LLMEngine(runner, tokenizer, config_for(runner, speculative=speculative))
        counts = np.zeros(2, np.int64)
        engine.add_step_listener(lambda s: counts.__iadd__([s.num_drafts, s.num_accepted_tokens]))
        outputs = engine.generate([prompt for prompt, _ in requests[:6]], params)
        return [(o.token_ids, o.finish_reason) for o in outputs], counts

    plain, _ = run(None)
    speculated, (drafts, accepted) = run(SPEC)
    assert speculated == plain
    assert drafts > 0 and accepted > 0
