"""Sampler rules (greedy, temperature, top-k, top-p, repetition penalty, seeds, logprobs) and SamplingParams checks."""

import numpy as np
import pytest

from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.logits_processors import apply_repetition_penalties
from mindspore_serving.llm.sampler import Sampler, log_softmax
from mindspore_serving.llm.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0)


def sample(logits, params, histories=None, generators=None, sampler=None):
    logits = np.asarray(logits, dtype=np.float32)
    if logits.ndim == 1:
        logits = logits[None]
    if isinstance(params, SamplingParams):
        params = [params] * logits.shape[0]
    histories = histories if histories is not None else [[] for _ in params]
    return (sampler or Sampler(seed=0)).sample(logits, params, histories, generators)


def draws(logits, params, count=2000, seed=0):
    """`count` tokens drawn for `count` identical rows from one seeded sampler."""
    batch = np.tile(np.asarray(logits, dtype=np.float32), (count, 1))
    return np.array(Sampler(seed=seed).sample(batch, [params] * count, [[]] * count).token_ids)


def test_greedy_takes_the_argmax_and_the_lowest_id_on_ties():
    out = sample([[0.1, 3.0, -1.0, 3.0], [5.0, 5.0, 5.0, 5.0], [-2.0, -1.0, -3.0, -1.5]], GREEDY)
    assert out.token_ids == [1, 0, 1]


def test_do_sample_false_is_greedy_whatever_the_temperature():
    params = SamplingParams(temperature=5.0, do_sample=False)
    assert params.greedy
    assert sample([0.0, 0.1, 2.0, 1.9], params).token_ids == [2]


def test_greedy_and_sampled_rows_mix_in_one_batch():
    logits = [[0.0, 9.0, 0.0], [0.0, 0.0, 0.0], [9.0, 0.0, 0.0]]
    out = sample(
        logits,
        [GREEDY, SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=0, repetition_penalty=1.5)],
    )
    assert out.token_ids == [1, 0, 0]


def test_temperature_reshapes_the_distribution():
    logits = np.log(np.array([0.6, 0.3, 0.1]))
    counts = np.bincount(draws(logits, SamplingParams(temperature=1.0)), minlength=3) / 2000
    assert np.allclose(counts, [0.6, 0.3, 0.1], atol=0.04)
    hot = np.exp(logits / 2.0) / np.exp(logits / 2.0).sum()
    counts = np.bincount(draws(logits, SamplingParams(temperature=2.0)), minlength=3) / 2000
    assert np.allclose(counts, hot, atol=0.04)
    assert set(draws(logits, SamplingParams(temperature=1e-3), count=200)) == {0}


def test_top_k_keeps_only_the_k_most_likely():
    logits = np.log(np.array([0.1, 0.4, 0.05, 0.3, 0.15]))
    got = draws(logits, SamplingParams(top_k=2))
    assert set(got) == {1, 3}
    assert abs(np.mean(got == 1) - 0.4 / 0.7) < 0.04
    assert set(draws(logits, SamplingParams(top_k=1), count=100)) == {1}
    assert set(draws(logits, SamplingParams(top_k=-1), count=2000)) == {0, 1, 2, 3, 4}


def test_top_k_ties_keep_the_lowest_ids():
    got = draws(np.zeros(6), SamplingParams(top_k=3), count=600)
    assert set(got) == {0, 1, 2}


def test_top_p_keeps_the_smallest_head_reaching_p():
    logits = np.log(np.array([0.15, 0.5, 0.05, 0.3]))
    assert set(draws(logits, SamplingParams(top_p=0.8))) == {1, 3}  # 0.5 + 0.3 reaches 0.8
    assert set(draws(logits, SamplingParams(top_p=0.81))) == {0, 1, 3}
    assert set(draws(logits, SamplingParams(top_p=0.3), count=100)) == {1}  # at least one token
    got = draws(logits, SamplingParams(top_p=0.8))
    assert abs(np.mean(got == 1) - 0.5 / 0.8) < 0.04


def test_top_p_over_a_large_vocabulary_widens_past_the_first_candidates():
    flat = np.zeros(1000)  # the nucleus of 0.5 is 500 tokens: ids 0..499 by ties
    got = draws(flat, SamplingParams(top_p=0.5), count=3000)
    assert got.max() < 500 and len(set(got)) > 400
    rng = np.random.default_rng(7)
    logits = rng.standard_normal(1000) * 2
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    ranked = np.argsort(-probs, kind="stable")
    nucleus = set(ranked[: np.searchsorted(np.cumsum(probs[ranked]), 0.9) + 1].tolist())
    assert len(nucleus) > Sampler.TOP_P_FIRST_CANDIDATES
    got = set(draws(logits, SamplingParams(top_p=0.9), count=4000).tolist())
    assert got <= nucleus and len(got) > 0.8 * len(nucleus)


def test_top_k_then_top_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    # top_k=3 renormalises to 4/9, 3/9, 2/9; top_p=0.7 then keeps 4/9 + 3/9 = 0.78.
    assert set(draws(logits, SamplingParams(top_k=3, top_p=0.7))) == {0, 1}


def test_repetition_penalty_rule():
    row = np.array([[2.0, -2.0, 1.0, -1.0, 4.0]])
    apply_repetition_penalties(row, [[0, 1, 1, 4]], np.array([2.0]))  # repeated ids are penalised once
    assert row.tolist() == [[1.0, -4.0, 1.0, -1.0, 2.0]]
    row = np.array([[2.0, -2.0]])
    apply_repetition_penalties(row, [[0, 1]], np.array([0.5]))  # < 1 favours seen tokens
    assert row.tolist() == [[4.0, -1.0]]


def test_repetition_penalty_covers_prompt_and_output_and_changes_the_choice():
    logits = [3.0, 2.0, 0.5]
    params = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample(logits, params, histories=[[0]]).token_ids == [1]  # 3/2 < 2
    assert sample(logits, params, histories=[[0, 1]]).token_ids == [0]  # 1.5 > 1.0
    assert sample(logits, params, histories=[[]]).token_ids == [0]


def test_a_seed_gives_the_same_tokens_whatever_the_batch():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 50)).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    generator = np.random.default_rng(1234)
    alone = [sample(logits[2], params, generators=[generator]).token_ids[0] for _ in range(10)]

    mine = np.random.default_rng(1234)
    sampler = Sampler(seed=99)
    in_batches = []
    for step in range(10):
        others = [SamplingParams(temperature=0.7)] * (step % 4)
        batch = np.concatenate([logits[: step % 4], logits[2:3]])
        out = sampler.sample(batch, others + [params], [[]] * (len(others) + 1), [None] * len(others) + [mine])
        in_batches.append(out.token_ids[-1])
    assert in_batches == alone
    assert len(set(alone)) > 1


def test_different_seeds_differ_and_the_shared_generator_is_seeded():
    logits = np.zeros(1000)
    a = draws(logits, SamplingParams(), count=20, seed=1)
    b = draws(logits, SamplingParams(), count=20, seed=2)
    assert list(a) != list(b)
    first = [Sampler(seed=5).sample(np.zeros((1, 1000)), [SamplingParams()], [[]]).token_ids[0] for _ in range(2)]
    assert first[0] == first[1]


def test_logprobs_come_from_the_model_distribution():
    logits = np.array([[1.0, 2.0, 3.0, 0.5]], dtype=np.float32)
    out = sample(logits, SamplingParams(temperature=0, top_logprobs=2, repetition_penalty=3.0), histories=[[2]])
    expected = log_softmax(logits)[0]
    assert out.token_ids == [1]  # the penalty moved the choice...
    assert out.logprobs[0] == pytest.approx(expected[1])  # ...but not the reported logprob
    assert [t for t, _ in out.top_logprobs[0]] == [2, 1]
    assert out.top_logprobs[0][0][1] == pytest.approx(expected[2])
    assert sample(logits, GREEDY).top_logprobs == [[]]
    assert np.exp(log_softmax(logits)).sum() == pytest.approx(1.0)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"expects logits \[2, vocab\]"):
        Sampler().sample(np.zeros((3, 4)), [GREEDY, GREEDY], [[], []])


# --- SamplingParams -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
        (dict(top_p=0), "top_p must be in (0, 1], got 0"),
        (dict(temperature=-0.1), "temperature must be a finite number >= 0 (0 means greedy), got -0.1"),
        (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
        (dict(top_k=-2), "top_k must be an int >= -1 (0 or -1 disables it), got -2"),
        (dict(top_k=2.5), "top_k must be an int"),
        (dict(repetition_penalty=0), "repetition_penalty must be a finite number > 0 (1.0 is off), got 0"),
        (dict(max_new_tokens=-1), "max_new_tokens must be an int >= 0, got -1"),
        (dict(max_new_tokens=True), "max_new_tokens must be an int >= 0, got True"),
        (dict(seed=-1), "seed must be an int in [0, 2**64 - 1] or null, got -1"),
        (dict(do_sample=True, temperature=0), "do_sample=True needs temperature > 0"),
        (dict(do_sample="yes"), "do_sample must be true, false or null"),
        (dict(stop=[""]), "stop strings must be non-empty strings, got ''"),
        (dict(stop=5), "stop must be a string or a list of strings, got int"),
        (dict(stop_token_ids=[-1]), "stop_token_ids must hold ints >= 0, got -1"),
        (dict(ignore_eos=1), "ignore_eos must be true or false, got 1"),
        (dict(top_logprobs=-1), "top_logprobs must be an int in [0, 20], got -1"),
    ],
)
def test_params_errors_are_clear(kwargs, message):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_params_normalise_and_reject_unknown_keys():
    params = SamplingParams(stop="###", stop_token_ids=[np.int64(3)])
    assert params.stop == ("###",) and params.stop_token_ids == (3,)
    assert SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 4}).greedy
    with pytest.raises(InvalidRequestError, match=r"unknown sampling parameters \['max_tokens'\]"):
        SamplingParams.from_dict({"max_tokens": 4})
    assert not SamplingParams().greedy and SamplingParams(temperature=0).greedy
