"""Speculative decoding in the engine: n-gram proposals, lossless acceptance (greedy: token for token; sampled:
the model's distribution), and how it composes with batching, preemption, prefix caching and async steps."""

import numpy as np
import pytest
from scipy import stats

from mindspore_serving.agent.testing import AheadRunner
from mindspore_serving.llm import LLMEngine, SamplingParams, SchedulerConfig
from mindspore_serving.llm.config import SpeculativeConfig, blocks_for
from mindspore_serving.llm.ngram_proposer import propose_ngram
from mindspore_serving.llm.sampler import NO_TOKEN, Sampler
from mindspore_serving.llm.testing import FakeModelRunner

PERIOD = 5


def _echoing_logits(runner, context):
    """The fake's logits, whose argmax usually repeats the token PERIOD back (a model quoting its context), so
    that proposals are mostly accepted, and sometimes not."""
    logits = FakeModelRunner.logits_for(runner, context)
    if len(context) > PERIOD and logits[0] > -2.0:  # a coin the context decides: about 3 times in 4
        logits[context[-PERIOD]] += 12.0
    return logits


class EchoingRunner(FakeModelRunner):
    logits_for = _echoing_logits


class AheadEchoingRunner(AheadRunner):
    logits_for = _echoing_logits


def engine(runner, speculative=None, **overrides):
    values = dict(max_num_seqs=8, max_num_batched_tokens=64, enable_prefix_caching=True, speculative=speculative)
    values.update(overrides)
    return LLMEngine(runner, scheduler_config=SchedulerConfig.for_runner(runner, **values), seed=0)


def prompts(count, seed=0, shared=12):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(3, 64, shared).tolist()  # a shared prefix: prefix-cache hits
    return [prefix + rng.integers(3, 64, int(rng.integers(4, 30))).tolist() for _ in range(count)]


def generate(eng, token_prompts, params):
    drafts = []
    eng.add_step_listener(lambda s: drafts.append((s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens)))
    outs = eng.generate(token_prompts, params)
    return outs, np.sum(drafts, axis=0) if drafts else np.zeros(3)


SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)


# --- proposals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, k, lo, hi, proposed",
    [
        ([1, 2, 3, 4, 1, 2, 3], 4, 1, 4, [4, 1, 2, 3]),  # the 3-gram 1 2 3 recurs: what followed it
        ([1, 2, 3, 0, 2, 3, 4, 7, 1, 2, 3], 2, 1, 4, [0, 2]),  # the longest match wins over a later shorter one
        ([5, 2, 9, 6, 2, 8, 2], 3, 1, 4, [8, 2]),  # the latest of equally long matches
        ([7, 1, 2, 3, 9, 8, 2, 3], 4, 3, 4, []),  # only a 2-gram recurs: below prompt_lookup_min
        ([5, 6, 7], 4, 1, 4, []),  # nothing recurs
        ([1, 2, 1, 2, 1, 2], 1, 1, 4, [1]),  # cut to k
    ],
)
def test_ngram_proposals(tokens, k, lo, hi, proposed):
    assert propose_ngram(tokens, k, lo, hi) == proposed


# --- greedy: token for token ------------------------------------------------------------------


@pytest.mark.parametrize(
    "runner_class, overrides",
    [
        (EchoingRunner, dict(num_scheduler_steps=1)),
        (EchoingRunner, dict(num_scheduler_steps=4)),
        (AheadEchoingRunner, dict(num_scheduler_steps=4, async_scheduling=True)),
    ],
    ids=["single-steps", "rounds", "async"],
)
def test_greedy_output_and_logprobs_equal_those_without_speculation_under_preemption_and_prefix_caching(
    runner_class, overrides
):
    # 10 requests of up to 80 tokens on 23 usable blocks of 4: they preempt each other; small budget: chunked prompts
    token_prompts = prompts(10)
    params = SamplingParams(max_new_tokens=40, temperature=0, ignore_eos=True, top_logprobs=2)
    plain, _ = generate(engine(runner_class(num_blocks=24, max_seq_len=80), **overrides), token_prompts, params)
    spec_engine = engine(runner_class(num_blocks=24, max_seq_len=80), SPEC, **overrides)
    speculated, (drafts, draft_tokens, accepted) = generate(spec_engine, token_prompts, params)
    assert [o.token_ids for o in speculated] == [o.token_ids for o in plain]
    np.testing.assert_allclose([o.logprobs for o in speculated], [o.logprobs for o in plain], rtol=1e-5, atol=1e-5)
    assert drafts > 20 and 0 < accepted < draft_tokens  # it did speculate, and was sometimes wrong
    assert spec_engine.core.scheduler.num_preemptions > 0


def test_after_a_step_a_verifying_request_holds_the_blocks_decoding_would():
    """The blocks reserved for proposed tokens the model rejected go back when the step is recorded."""
    runner = EchoingRunner(num_blocks=64)
    eng = engine(runner, SPEC)
    scheduler, held = eng.core.scheduler, []

    def check(stats):
        for request in scheduler.running:
            if not request.is_prefilling:
                held.append(len(request.block_table) - blocks_for(request.num_tokens, runner.block_size))

    eng.add_step_listener(check)
    _, (drafts, proposed, accepted) = generate(
        eng, prompts(4, seed=7), SamplingParams(max_new_tokens=40, temperature=0, ignore_eos=True)
    )
    assert drafts > 0 and accepted < proposed and held and max(held) == 0


def test_stops_penalties_and_min_tokens_apply_per_accepted_token():
    token_prompts = prompts(6, seed=1)
    runner = EchoingRunner(num_blocks=64)
    # which tokens the plain run produces: stop on one of them, ban another
    free = [
        o.token_ids for o in engine(runner).generate(token_prompts, SamplingParams(max_new_tokens=30, temperature=0))
    ]
    stop_id = free[0][12]
    cases = [
        SamplingParams(max_new_tokens=30, temperature=0, stop_token_ids=[stop_id]),
        SamplingParams(max_new_tokens=30, temperature=0, repetition_penalty=1.3),
        SamplingParams(max_new_tokens=30, temperature=0, presence_penalty=0.8, frequency_penalty=0.3),
        SamplingParams(max_new_tokens=30, temperature=0, logit_bias=((free[1][5], -100.0),)),
        SamplingParams(max_new_tokens=30, temperature=0, min_tokens=20, stop_token_ids=[stop_id]),
        SamplingParams(max_new_tokens=7, temperature=0),
    ]
    for params in cases:
        plain = engine(EchoingRunner(num_blocks=64)).generate(token_prompts, params)
        speculated = engine(EchoingRunner(num_blocks=64), SPEC).generate(token_prompts, params)
        assert [(o.token_ids, o.finish_reason) for o in speculated] == [(o.token_ids, o.finish_reason) for o in plain]
    assert any(o.finish_reason.value == "stop" for o in plain) or params.max_new_tokens == 7


def test_through_mixed_steps_greedy_rows_verify_from_the_runner_s_tokens_and_sampled_ones_from_their_logits():
    """A runner taking mixed steps (the agents): a step's greedy verifying rows bring back only the greedy token at
    each position, the sampled ones every position's logits; every request gets what it gets in-process."""
    token_prompts = prompts(8, seed=4)

    def params_for(i):
        if i % 2:
            return SamplingParams(max_new_tokens=30, temperature=0.8, top_k=10, seed=i, ignore_eos=True)
        return SamplingParams(max_new_tokens=30, temperature=0, ignore_eos=True)

    def run(runner, **overrides):
        return [
            o.token_ids
            for o in engine(runner, SPEC, **overrides).generate(
                token_prompts, [params_for(i) for i in range(len(token_prompts))]
            )
        ]

    ahead = AheadEchoingRunner(num_blocks=64)
    assert run(ahead, async_scheduling=True) == run(EchoingRunner(num_blocks=64))
    mixed = [
        (seqs, rows)
        for (seqs, greedy_steps, *_), rows in zip(ahead.deferred.submissions, ahead.deferred.logits_rows)
        if greedy_steps == 1 and any(seq.all_logits for seq in seqs)
    ]
    # rows of greedy requests (even seq ids: the order they were added) verify from the runner's tokens, those of
    # sampled ones from their logits
    verifying = [
        (i in rows, seq.seq_id % 2 == 1) for seqs, rows in mixed for i, seq in enumerate(seqs) if seq.all_logits
    ]
    greedy = [brings_logits for brings_logits, is_sampled in verifying if not is_sampled]
    sampled = [brings_logits for brings_logits, is_sampled in verifying if is_sampled]
    assert greedy and not any(greedy) and sampled and all(sampled)


def test_async_steps_are_planned_ahead_while_the_text_proposes_nothing():
    """Text without recurring 3-grams: after a step that found no proposal the next ones are planned ahead (async
    scheduling's overlap), with a look for proposals every num_scheduler_steps steps."""
    token_prompts = prompts(4, seed=5, shared=0)
    params = SamplingParams(max_new_tokens=30, temperature=0, ignore_eos=True)
    plain, _ = generate(engine(AheadRunner(num_blocks=64)), token_prompts, params)
    runner = AheadRunner(num_blocks=64)  # hash-derived logits: the output does not repeat itself
    speculative = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=3)
    got, _ = generate(engine(runner, speculative, num_scheduler_steps=4, async_scheduling=True), token_prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    submissions = runner.deferred.submissions
    assert sum(1 for *_, in_flight in submissions if in_flight) > len(submissions) / 2


def test_choices_and_prompt_logprobs_speculate_like_any_request():
    """n choices fork and then verify proposals each; a request scoring its prompt speculates once it is scored."""
    token_prompts = prompts(2, seed=6)
    cases = [
        SamplingParams(max_new_tokens=25, temperature=0, n=3, ignore_eos=True),
        SamplingParams(max_new_tokens=25, temperature=0, prompt_logprobs=2, ignore_eos=True),
    ]
    for params in cases:
        plain = engine(EchoingRunner(num_blocks=64)).generate(token_prompts, params)
        speculated, counts = generate(engine(EchoingRunner(num_blocks=64), SPEC), token_prompts, params)
        assert [(o.index, o.token_ids) for o in speculated] == [(o.index, o.token_ids) for o in plain]
        assert [o.prompt_logprobs for o in speculated] == [o.prompt_logprobs for o in plain]
        assert counts[0] > 0


def test_a_batch_at_disable_by_batch_size_decodes_without_proposals():
    runner = EchoingRunner(num_blocks=64)
    eng = engine(runner, SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=4))
    rows = []
    eng.add_step_listener(lambda s: rows.append((s.num_running, s.num_drafts)))
    eng.generate(prompts(6, seed=2), SamplingParams(max_new_tokens=30, temperature=0, ignore_eos=True))
    # a step's proposals are made with the batch as it is when it is planned (before its requests finish)
    assert all(drafts == 0 for running, drafts in rows if running >= 5)
    assert any(drafts > 0 for _, drafts in rows)


def test_sampled_requests_speculate_and_stay_seeded():
    runner = EchoingRunner(num_blocks=64)
    params = SamplingParams(max_new_tokens=30, temperature=0.7, top_k=20, seed=5, ignore_eos=True)
    first, counts = generate(engine(runner, SPEC), prompts(3, seed=3), params)
    again, _ = generate(engine(EchoingRunner(num_blocks=64), SPEC), prompts(3, seed=3), params)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert counts[2] > 0


# --- sampled: the model's distribution ----------------------------------------------------------


class _Row:
    """What Sampler.verify reads of a request."""

    def __init__(self, params, generator=None, output=(5, 6)):
        self.sampling_params = params
        self.all_token_ids = [1, 2, 3] + list(output)
        self.output_token_ids = list(output)
        self.eos_token_ids = frozenset()
        self.bad_words_ids = ()
        self.generator = generator


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_k=5, top_p=0.9),
        SamplingParams(temperature=1.2, min_p=0.05, presence_penalty=0.5),
    ],
    ids=["plain", "top-k-top-p", "min-p-penalty"],
)
def test_rejection_sampling_keeps_the_models_distribution(params):
    """Over many draws at a fixed context, the tokens a verified row emits are distributed as plain sampling
    draws them: the first token as p_0, and, after an accepted first proposal, the second as p_1."""
    vocab, draws = 8, 2500
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1.5, (3, vocab)).astype(np.float32)
    draft = [int(np.argsort(logits[0])[-2]), int(np.argmax(logits[1]))]  # a likely, not the likeliest, first
    sampler, generator = Sampler(), np.random.default_rng(7)
    first, second = np.zeros(vocab), np.zeros(vocab)
    for _ in range(draws):
        tokens = sampler.verify(logits, _Row(params, generator), draft).token_ids
        first[tokens[0]] += 1
        if tokens[0] == draft[0]:
            second[tokens[1]] += 1
    plain_first, plain_second = np.zeros(vocab), np.zeros(vocab)
    row = _Row(params, generator)
    for _ in range(draws):
        plain_first[sampler.sample_requests(logits[:1], [row]).token_ids[0]] += 1
    after = _Row(params, generator, output=(5, 6, draft[0]))
    for _ in range(draws):
        plain_second[sampler.sample_requests(logits[1:2], [after]).token_ids[0]] += 1
    for got, want in ((first, plain_first), (second, plain_second)):
        seen = (got + want) > 0
        table = np.stack([got[seen], want[seen]])
        assert stats.chi2_contingency(table)[1] > 1e-3, table


def test_a_greedy_row_keeps_the_longest_agreeing_prefix_then_the_argmax():
    logits = np.zeros((4, 6), np.float32)
    logits[0, 2] = logits[1, 4] = logits[2, 1] = logits[3, 5] = 5.0
    row = _Row(SamplingParams(temperature=0))
    assert Sampler().verify(logits, row, [2, 4, 3]).token_ids == [2, 4, 1]
    assert Sampler().verify(logits, row, [2, 4, 1]).token_ids == [2, 4, 1, 5]
    assert Sampler().verify(logits, row, [0, 4, 1]).token_ids == [2]


def test_a_row_that_allows_no_token_stops_at_its_last_accepted_one():
    logits = np.zeros((3, 6), np.float32)
    logits[0, 2] = 5.0
    row = _Row(SamplingParams(temperature=0, allowed_token_ids=[2]))
    # position 1 allows only token 2, so the proposed 3 is rejected there
    assert Sampler().verify(logits, row, [2, 3]).token_ids == [2, 2]
    row.bad_words_ids = ((2,),)  # and token 2 is banned: no token at all
    assert Sampler().verify(logits, row, [2, 3]).token_ids == [NO_TOKEN]
