"""The correctness oracle on the real exported graphs: greedy tokens under load equal those of each request alone.

32 requests with mixed prompt lengths and max_new_tokens join the engine at different steps (their prompts mostly
computed in the graph calls that decode the running ones); each one's tokens must equal the tokens of the same
request run alone.
Also with prefix caching, and with preemption forced by a tiny block pool.
"""

import numpy as np
import pytest

from mindspore_serving.agent.testing import Ahead
from mindspore_serving.llm import LLMEngine, SchedulerConfig

NUM_REQUESTS = 32


def workload(vocab_size):
    rng = np.random.default_rng(7)
    shared = list(rng.integers(3, vocab_size, 40))  # a common prefix for some prompts (prefix caching)
    requests = []
    for i in range(NUM_REQUESTS):
        length = int(rng.integers(1, 120))
        prompt = list(rng.integers(3, vocab_size, length))
        if i % 3 == 0:
            prompt = shared + prompt[:20]
        requests.append(([int(t) for t in prompt], int(rng.integers(1, 24))))
    return requests


def greedy(max_new_tokens):
    return {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}


def run_alone(runner, config, requests):
    engine = LLMEngine(runner, scheduler_config=config)
    return [engine.generate([prompt], greedy(n))[0].token_ids for prompt, n in requests]


def run_staggered(runner, config, requests, listener=None, params_for=lambda i, n: greedy(n)):
    """Adds a few requests every step, so they join a running batch at different steps; request i's sampling
    params are params_for(i, its max_new_tokens)."""
    engine = LLMEngine(runner, scheduler_config=config)
    if listener is not None:
        engine.add_step_listener(listener)
    ids, tokens, pending = [], {}, list(requests)
    while pending or engine.has_unfinished():
        for prompt, n in pending[:3]:
            ids.append(engine.add_request(prompt_token_ids=prompt, params=params_for(len(ids), n)))
        pending = pending[3:]
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = output.token_ids
    return [tokens[i] for i in ids], engine


def config_for(runner, **overrides):
    base = dict(max_num_seqs=16, max_num_batched_tokens=128, max_model_len=runner.max_seq_len)
    base.update(overrides)
    return SchedulerConfig.for_runner(runner, **base)


@pytest.fixture(scope="module")
def alone(runner):
    requests = workload(runner.vocab_size)
    return requests, run_alone(runner, config_for(runner), requests)


def test_continuous_batching_matches_alone(runner, alone):
    requests, expected = alone
    mixed_before = runner.mixed_calls
    got, _ = run_staggered(runner, config_for(runner), requests)
    assert got == expected
    assert runner.mixed_calls > mixed_before  # joining requests' prompts were computed beside decodes


def test_multi_step_decoding_matches_alone(runner, alone):
    requests, expected = alone
    rounds = []
    mixed_before = runner.mixed_calls
    got, _ = run_staggered(
        runner,
        config_for(runner, num_scheduler_steps=4, max_num_seqs=4),
        requests,
        listener=lambda stats: rounds.append((stats.num_model_steps, stats.num_prefill_seqs)),
    )
    assert got == expected
    assert max(steps for steps, _ in rounds) == 4  # decode steps ran four at a time, the argmax fed back
    # prompts that filled the batch joined rounds: computed in a round's first step, beside its decodes
    assert any(steps == 4 and prefills for steps, prefills in rounds)
    assert runner.mixed_calls > mixed_before


def test_prefix_caching_matches_alone(runner, alone):
    requests, expected = alone
    got, _ = run_staggered(runner, config_for(runner, enable_prefix_caching=True), requests)
    assert got == expected


def test_static_batching_matches_alone(runner, alone):
    requests, expected = alone
    got, _ = run_staggered(runner, config_for(runner, batching="static"), requests)
    assert got == expected


def test_preemption_with_tiny_block_pool_matches_alone(runner, alone):
    requests, expected = alone
    # 17 usable blocks of 16 tokens: one max-length sequence fits, 16 concurrent ones do not
    tiny = config_for(runner, num_blocks=runner.max_seq_len // runner.block_size + 1)
    preempted = []
    got, engine = run_staggered(runner, tiny, requests, lambda stats: preempted.append(stats.num_preempted))
    assert got == expected
    assert sum(preempted) > 0


@pytest.mark.parametrize(
    "overrides",
    [
        dict(num_scheduler_steps=4, max_num_seqs=4, enable_prefix_caching=True),
        dict(num_scheduler_steps=2, num_blocks=17),
    ],
    ids=["rounds-of-4", "tiny-block-pool"],
)
def test_async_scheduling_matches_alone(runner, alone, overrides):
    requests, expected = alone
    ahead = Ahead(runner)
    got, engine = run_staggered(ahead, config_for(runner, async_scheduling=True, **overrides), requests)
    assert got == expected
    submissions = ahead.deferred.submissions
    assert sum(1 for *_, in_flight in submissions if in_flight) > len(submissions) / 2
    assert any(prev_rows for _, _, prev_rows, _ in submissions)


def test_mixed_steps_match_alone(runner, alone):
    """Seeded sampled requests among greedy ones, async scheduling on a runner that runs mixed steps: the greedy
    rows take the graph's argmax beside the sampled rows, and every request gets its tokens alone."""
    requests, expected = alone
    requests, expected = requests[:12], list(expected[:12])
    sampled = {
        i: {"temperature": 0.8, "top_k": 20, "seed": i, "max_new_tokens": n, "ignore_eos": True}
        for i, (_, n) in enumerate(requests)
        if i % 4 == 1
    }
    single = LLMEngine(runner, scheduler_config=config_for(runner))
    for i, params in sampled.items():
        expected[i] = single.generate([requests[i][0]], params)[0].token_ids
    ahead = Ahead(runner, mixed_steps=True)
    got, _ = run_staggered(
        ahead,
        config_for(runner, async_scheduling=True, num_scheduler_steps=4),
        requests,
        params_for=lambda i, n: sampled.get(i, greedy(n)),
    )
    assert got == expected
    assert any(ahead.deferred.logits_rows)  # some steps were mixed
