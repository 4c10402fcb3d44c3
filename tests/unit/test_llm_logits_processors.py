"""What penalties, logit bias, allowed ids, bad words, min_tokens, min_p, a grammar bitmask and logprobs_mode do to
the sampler's choice and its reported logprobs, against numbers computed by hand; plain_greedy; the min_tokens stop
rule of a request."""

import numpy as np
import pytest

from mindspore_serving.llm.logits_processors import (
    bad_words_token_ids,
    banned_by_bad_words,
    bitmask_allows,
    process_logits,
)
from mindspore_serving.llm.request import Request, RequestStatus
from mindspore_serving.llm.sampler import NO_TOKEN, Sampler, log_softmax
from mindspore_serving.llm.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0)


def sample(
    logits, params, outputs=None, prompts=None, eos=None, bad_words=None, bitmasks=None, generators=None, sampler=None
):
    """One sampler call; a row's history is its prompt then its output."""
    logits = np.atleast_2d(np.asarray(logits, dtype=np.float32))
    n = logits.shape[0]
    params = [params] * n if isinstance(params, SamplingParams) else params
    outputs = outputs if outputs is not None else [[] for _ in range(n)]
    prompts = prompts if prompts is not None else [[] for _ in range(n)]
    return (sampler or Sampler(seed=0)).sample(
        logits,
        params,
        [list(p) + list(o) for p, o in zip(prompts, outputs)],
        generators,
        output_token_ids=outputs,
        eos_token_ids=eos,
        bad_words_ids=bad_words,
        bitmasks=bitmasks,
    )


def draws(logits, params, count=2000, **kwargs):
    """The tokens of `count` identical rows from one seeded sampler."""
    batch = np.tile(np.asarray(logits, dtype=np.float32), (count, 1))
    expand = {key: [value] * count for key, value in kwargs.items()}
    return np.array(sample(batch, params, **expand).token_ids)


def processed(logits, params, outputs=((),), prompts=None, eos=None, bad_words=None, bitmasks=None):
    rows = np.atleast_2d(np.asarray(logits, dtype=np.float32)).copy()
    n = rows.shape[0]
    params = [params] * n if isinstance(params, SamplingParams) else params
    prompts = prompts or [[] for _ in range(n)]
    return process_logits(
        rows,
        params,
        [list(p) + list(o) for p, o in zip(prompts, outputs)],
        outputs,
        eos or [()] * n,
        bad_words or [()] * n,
        bitmasks,
    )


def mask_of(allowed_rows, vocab):
    """llguidance's int32 bitmask rows allowing the given token ids."""
    words = -(-vocab // 32)
    masks = np.zeros((len(allowed_rows), words), dtype=np.uint32)
    for row, allowed in enumerate(allowed_rows):
        for token in allowed:
            masks[row, token // 32] |= np.uint32(1 << (token % 32))
    return masks.view(np.int32)


# --- presence and frequency penalties (OpenAI's formula, over the output only) ---------------------------------
def test_presence_and_frequency_penalties_follow_openais_formula_over_the_output_only():
    params = SamplingParams(
        temperature=0, presence_penalty=0.5, frequency_penalty=0.25, logprobs_mode="processed", top_logprobs=4
    )
    logits = [1.0, 2.0, 3.0, 0.5]
    # output counts: token 2 twice, token 1 once; token 0 is only in the prompt (not penalised)
    # 2: 3 - 0.25 * 2 - 0.5 = 2.0; 1: 2 - 0.25 * 1 - 0.5 = 1.25
    expected = [1.0, 1.25, 2.0, 0.5]
    got = processed(logits, params, outputs=[[2, 2, 1]], prompts=[[0, 0, 0]])
    assert got[0].tolist() == pytest.approx(expected)
    out = sample(logits, params, outputs=[[2, 2, 1]], prompts=[[0, 0, 0]])
    reference = log_softmax(np.array(expected))
    assert out.token_ids == [2] and out.logprobs[0] == pytest.approx(reference[2], abs=1e-6)
    assert [t for t, _ in out.top_logprobs[0]] == [2, 1, 0, 3]
    assert [v for _, v in out.top_logprobs[0]] == pytest.approx(reference[[2, 1, 0, 3]].tolist(), abs=1e-6)


def test_penalties_change_the_greedy_choice_and_negative_ones_favour_repeats():
    logits = [0.0, 2.0, 2.2]
    assert sample(logits, SamplingParams(temperature=0, presence_penalty=0.5), outputs=[[2]]).token_ids == [1]
    assert sample(logits, SamplingParams(temperature=0, frequency_penalty=0.1), outputs=[[2]]).token_ids == [2]
    assert sample(logits, SamplingParams(temperature=0, frequency_penalty=0.1), outputs=[[2, 2, 2]]).token_ids == [1]
    assert sample(logits, SamplingParams(temperature=0, presence_penalty=-1.0), outputs=[[1]]).token_ids == [1]


def test_repetition_penalty_then_output_penalties():
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0)
    # token 1: 4 / 2 (seen in the prompt) - 1 (once in the output) = 1; token 0: -1 * 2 (prompt) = -2
    got = processed([-1.0, 4.0, 3.0], params, outputs=[[1]], prompts=[[0]])
    assert got[0].tolist() == [-2.0, 1.0, 3.0]


# --- logit bias, allowed ids -----------------------------------------------------------------------------------
def test_logit_bias_of_plus_and_minus_100_forces_and_forbids():
    logits = [5.0, 0.0, 0.0, 0.0]
    params = SamplingParams(temperature=0, logit_bias={0: -100, 3: 100})
    assert processed(logits, params)[0].tolist() == [-95.0, 0.0, 0.0, 100.0]
    assert sample(logits, params).token_ids == [3]
    assert set(draws(logits, SamplingParams(temperature=1.0, logit_bias={"3": 100}), count=300)) == {3}
    assert sample(logits, SamplingParams(temperature=0, logit_bias={0: -100})).token_ids == [1]
    assert 0 not in set(draws(logits, SamplingParams(temperature=1.0, logit_bias={0: -100}), count=300))


def test_allowed_token_ids_keep_only_those():
    logits = [9.0, 1.0, 2.0, 3.0]
    assert sample(logits, SamplingParams(temperature=0, allowed_token_ids=[1, 3])).token_ids == [3]
    got = draws(logits, SamplingParams(temperature=1.0, allowed_token_ids=[1, 3]))
    assert set(got) == {1, 3}
    assert abs(np.mean(got == 1) - np.exp(1) / (np.exp(1) + np.exp(3))) < 0.03
    row = processed(logits, SamplingParams(allowed_token_ids=[1, 3]))[0]
    assert row.tolist() == [-np.inf, 1.0, -np.inf, 3.0]


# --- bad words -------------------------------------------------------------------------------------------------
def test_a_one_token_bad_word_is_always_banned():
    logits = [0.0, 1.0, 5.0]
    assert sample(logits, GREEDY, bad_words=[((2,),)]).token_ids == [1]
    assert sample(logits, GREEDY, outputs=[[0, 1]], bad_words=[((2,),)]).token_ids == [1]


def test_a_multi_token_bad_word_bans_its_last_token_after_the_others():
    logits = [0.0, 1.0, 2.0, 5.0]
    words = ((1, 2, 3),)
    assert sample(logits, GREEDY, outputs=[[0, 1, 2]], bad_words=[words]).token_ids == [2]  # "1 2" then not 3
    assert sample(logits, GREEDY, outputs=[[0, 2]], bad_words=[words]).token_ids == [3]  # only "2": allowed
    assert sample(logits, GREEDY, outputs=[[2]], bad_words=[words]).token_ids == [3]
    assert sample(logits, GREEDY, outputs=[[1, 2, 0]], bad_words=[words]).token_ids == [3]
    assert banned_by_bad_words([[5, 7], [7], []], [((7, 9), (4,), (5, 7, 8))] * 3) == [[9, 4, 8], [9, 4], [4]]


def test_bad_words_are_tokenized_alone_and_after_a_space():
    vocab = {"bad": 1, " bad": 2, "two": 3, " words": 4, " two": 5}

    def encode(text):  # a word-level tokenizer: each piece with its leading space
        pieces, ids = text.replace(" ", "\0 ").split("\0"), []
        for piece in pieces:
            if piece:
                ids.append(vocab[piece])
        return ids

    assert bad_words_token_ids(encode, ["bad", "  two words"]) == ((1,), (2,), (3, 4), (5, 4))
    assert bad_words_token_ids(encode, ["bad", "bad"]) == ((1,), (2,))


# --- min_tokens ------------------------------------------------------------------------------------------------
def test_min_tokens_bans_eos_and_stop_ids_until_the_output_has_that_many_tokens():
    logits = [0.0, 1.0, 2.0, 5.0, 4.0]
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4])
    eos = [frozenset({3})]
    assert sample(logits, params, outputs=[[]], eos=eos).token_ids == [2]
    assert sample(logits, params, outputs=[[0]], eos=eos).token_ids == [2]
    assert sample(logits, params, outputs=[[0, 0]], eos=eos).token_ids == [3]
    ignoring = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4], ignore_eos=True)
    assert sample(logits, ignoring, outputs=[[0]], eos=eos).token_ids == [3]  # EOS ends nothing: not banned
    assert 3 not in set(draws(logits, SamplingParams(min_tokens=1), count=300, eos=frozenset({3}), outputs=[]))


def test_a_request_does_not_stop_on_eos_before_min_tokens():
    request = Request("r", [7], SamplingParams(max_new_tokens=8, min_tokens=2, stop_token_ids=[4]), 0.0, eos_token_id=3)
    for token in (3, 4):
        request.append_output_token(token)
        assert request.check_stop(100) is None
    request.append_output_token(3)
    assert request.check_stop(100) is RequestStatus.FINISHED_EOS
    plain = Request("p", [7], SamplingParams(max_new_tokens=8), 0.0, eos_token_id=3)
    plain.append_output_token(3)
    assert plain.check_stop(100) is RequestStatus.FINISHED_EOS


# --- min_p -----------------------------------------------------------------------------------------------------
def test_min_p_drops_tokens_below_a_share_of_the_most_likely_after_temperature():
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    assert set(draws(logits, SamplingParams(min_p=0.2))) == {0, 1, 2}  # bar 0.1
    got = draws(logits, SamplingParams(min_p=0.5))  # bar 0.25
    assert set(got) == {0, 1} and abs(np.mean(got == 0) - 0.5 / 0.8) < 0.03
    # temperature 2 flattens it: probabilities relative to the first are 1, 0.77, 0.55, 0.32
    assert set(draws(logits, SamplingParams(min_p=0.5, temperature=2.0))) == {0, 1, 2}
    assert set(draws(logits, SamplingParams(min_p=1.0), count=200)) == {0}
    assert set(draws(logits, SamplingParams(min_p=0.5, top_k=3, top_p=0.9))) == {0, 1}


# --- logprobs_mode ---------------------------------------------------------------------------------------------
def test_raw_and_processed_logprobs():
    logits = np.array([1.0, 2.0, 3.0, 0.5])
    bias = {0: 4.0, 2: -100.0}
    raw = sample(logits, SamplingParams(temperature=0, logit_bias=bias, top_logprobs=2))
    assert raw.token_ids == [0]
    assert raw.logprobs[0] == pytest.approx(log_softmax(logits)[0], abs=1e-6)
    assert raw.top_logprobs[0][0][0] == 2  # the model's own favourite, banned by the bias
    proc = sample(
        logits, SamplingParams(temperature=0.7, top_k=1, logit_bias=bias, top_logprobs=2, logprobs_mode="processed")
    )
    expected = log_softmax(np.array([5.0, 2.0, -97.0, 0.5]))  # before temperature and top-k
    assert proc.token_ids == [0]
    assert proc.logprobs[0] == pytest.approx(expected[0], abs=1e-5)
    assert proc.top_logprobs[0] == [
        (0, pytest.approx(expected[0], abs=1e-5)),
        (1, pytest.approx(expected[1], abs=1e-5)),
    ]


def test_processed_logprobs_of_masked_tokens_are_minus_infinity():
    out = sample(
        [3.0, 2.0, 1.0],
        SamplingParams(temperature=0, allowed_token_ids=[1, 2], top_logprobs=3, logprobs_mode="processed"),
    )
    assert out.token_ids == [1]
    assert out.logprobs[0] == pytest.approx(np.log(np.e / (np.e + 1)), abs=1e-6)
    assert [t for t, _ in out.top_logprobs[0]] == [1, 2, 0] and out.top_logprobs[0][2][1] == -np.inf
    unprocessed = sample([3.0, 2.0, 1.0], SamplingParams(temperature=0, logprobs_mode="processed"))
    assert unprocessed.logprobs[0] == pytest.approx(log_softmax(np.array([3.0, 2.0, 1.0]))[0], abs=1e-6)


# --- grammar bitmask -------------------------------------------------------------------------------------------
def test_bitmask_layout_is_llguidances():
    rng = np.random.default_rng(0)
    masks = rng.integers(-(2**31), 2**31, size=(3, 4), dtype=np.int64).astype(np.int32)
    allowed = bitmask_allows(masks, 100)
    expected = [[bool((int(masks[r, t // 32]) >> (t % 32)) & 1) for t in range(100)] for r in range(3)]
    assert allowed.tolist() == expected
    assert bitmask_allows(mask_of([[31, 32, 99]], 100), 100).nonzero()[1].tolist() == [31, 32, 99]
    assert not bitmask_allows(np.full((1, 1), -1, dtype=np.int32), 40)[0, 32:].any()  # past its words


def test_bitmask_masks_rows_and_a_row_allowing_nothing_gets_no_token():
    vocab = 40
    logits = np.zeros((4, vocab), dtype=np.float32)
    logits[:, 0] = 5.0
    logits[:, 33] = 1.0
    masks = np.concatenate(
        [
            mask_of([[1, 33, 35]], vocab),
            np.full((1, 2), -1, dtype=np.int32),
            np.zeros((1, 2), dtype=np.int32),
            mask_of([[7]], vocab),
        ]
    )
    params = [GREEDY, GREEDY, SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_logprobs=2)]
    out = sample(logits, params, bitmasks=masks)
    assert out.token_ids == [33, 0, NO_TOKEN, 7]
    assert out.logprobs[2] == -np.inf and out.top_logprobs[2] == []
    assert out.logprobs[0] == pytest.approx(log_softmax(logits[0])[33], abs=1e-6)  # raw: the model's
    assert set(
        draws(logits[0], SamplingParams(temperature=1.0), count=500, bitmasks=mask_of([[1, 33, 35]], vocab)[0])
    ) == {1, 33, 35}


def test_masks_that_exclude_each_other_leave_no_token():
    params = SamplingParams(temperature=0, allowed_token_ids=[2], min_tokens=1)
    out = sample([0.0, 1.0, 2.0], params, eos=[frozenset({2})])
    assert out.token_ids == [NO_TOKEN] and out.logprobs == [-np.inf]


# --- batches ---------------------------------------------------------------------------------------------------
def test_a_seeded_processed_row_gets_the_same_token_whatever_the_batch():
    rng = np.random.default_rng(1)
    vocab = 70
    logits = (rng.standard_normal((6, vocab)) * 2).astype(np.float32)
    mine = SamplingParams(
        temperature=0.9,
        top_p=0.95,
        min_p=0.05,
        presence_penalty=0.7,
        frequency_penalty=0.3,
        logit_bias={5: 3.0},
        repetition_penalty=1.3,
        seed=7,
    )
    output = [5, 9, 5, 11]
    alone_generator = np.random.default_rng(7)
    alone = [sample(logits[2], mine, outputs=[output], generators=[alone_generator]).token_ids[0] for _ in range(12)]
    others = [
        GREEDY,
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=1.0, frequency_penalty=1.0),
        SamplingParams(temperature=0, allowed_token_ids=[3, 4]),
        SamplingParams(temperature=1.0, min_p=0.3),
    ]
    generator = np.random.default_rng(7)
    sampler = Sampler(seed=3)
    in_batches = []
    for step in range(12):
        count = step % 5
        rows = np.concatenate([logits[:count], logits[2:3]])
        masks = np.concatenate([mask_of([range(step, vocab)] * count, vocab), np.full((1, 3), -1, np.int32)])
        out = sample(
            rows,
            others[:count] + [mine],
            outputs=[[1, 2]] * count + [output],
            generators=[None] * count + [generator],
            bitmasks=masks if step % 2 else None,
            sampler=sampler,
        )
        in_batches.append(out.token_ids[-1])
    assert in_batches == alone and len(set(alone)) > 1


def test_plain_rows_keep_the_argmax_beside_processed_ones():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((5, 30)).astype(np.float32)
    params = [
        GREEDY,
        SamplingParams(temperature=0, logit_bias={0: 100}),
        GREEDY,
        SamplingParams(temperature=0, min_tokens=3),
        GREEDY,
    ]
    out = sample(logits, params, eos=[frozenset({int(np.argmax(logits[3]))})] * 5)
    argmax = np.argmax(logits, axis=1)
    assert [out.token_ids[i] for i in (0, 2, 4)] == argmax[[0, 2, 4]].tolist()
    assert out.token_ids[1] == 0 and out.token_ids[3] == int(np.argsort(-logits[3])[1])


# --- plain_greedy ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=1.0),
        dict(repetition_penalty=1.1),
        dict(stop=["x"]),
        dict(top_logprobs=1),
        dict(presence_penalty=0.1),
        dict(frequency_penalty=-0.1),
        dict(logit_bias={1: 1.0}),
        dict(allowed_token_ids=[1]),
        dict(bad_words=["x"]),
        dict(min_tokens=1),
        dict(logprobs_mode="processed"),
        dict(structured_output={"type": "json_object"}),
        dict(n=2),
        dict(best_of=2),
    ],
)
def test_plain_greedy_needs_nothing_but_the_argmax(kwargs):
    assert SamplingParams(temperature=0).plain_greedy
    assert SamplingParams(temperature=0, min_p=0.5, top_k=3, seed=1, stop_token_ids=[2]).plain_greedy
    assert SamplingParams(temperature=0, prompt_logprobs=2).plain_greedy  # its scored prompt step is not
    assert not SamplingParams(**dict(dict(temperature=0), **kwargs)).plain_greedy
