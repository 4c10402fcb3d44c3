"""LLMEngine end to end over a fake runner that really reads its paged KV cache.

The oracle: for greedy decoding, the tokens served for each request under any load (requests joining
at different steps, chunked prefill, prefix caching, preemption by a tiny block pool, static batching)
equal the tokens of that request computed alone, without the scheduler (`reference_greedy`).
"""

import itertools
import random
import re

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mindspore_serving.agent.testing import AheadRunner
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.engine import LLMEngine
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.logits_processors import bad_words_token_ids
from mindspore_serving.llm.request import FinishReason
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.llm.testing import FakeModelRunner, reference_greedy

VOCAB = 64
EOS = 1
BS = 4
MAX_LEN = 96
NUM_REQUESTS = 32


def make_runner(num_blocks=256, vocab_size=VOCAB, ahead=False):
    return (AheadRunner if ahead else FakeModelRunner)(
        num_blocks=num_blocks, block_size=BS, max_seq_len=MAX_LEN, vocab_size=vocab_size
    )


def make_engine(num_blocks=256, tokenizer=None, eos=EOS, vocab_size=VOCAB, **overrides):
    runner = make_runner(num_blocks, vocab_size, ahead=overrides.get("async_scheduling", False))
    values = dict(max_num_seqs=8, max_num_batched_tokens=32)
    values.update(overrides)
    return LLMEngine(runner, tokenizer, SchedulerConfig.for_runner(runner, **values), eos_token_id=eos, seed=0)


def make_workload(seed, shared_prefixes=False):
    """32 (prompt, max_new_tokens, join step) with mixed lengths; optionally 4 shared prompt prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(2, VOCAB) for _ in range(rng.randint(5, 17))] for _ in range(4)]
    workload = []
    for i in range(NUM_REQUESTS):
        prompt = [rng.randrange(2, VOCAB) for _ in range(rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 40]))]
        if shared_prefixes:
            prompt = prefixes[i % 4] + prompt
        workload.append((prompt, rng.randint(1, 30), rng.randint(0, 40)))
    return workload


def expected_tokens(workload):
    return [reference_greedy(make_runner, prompt, max_new, EOS) for prompt, max_new, _ in workload]


WORKLOAD = make_workload(1)
SHARED_WORKLOAD = make_workload(2, shared_prefixes=True)


@pytest.fixture(scope="module")
def expected():
    return expected_tokens(WORKLOAD)


@pytest.fixture(scope="module")
def expected_shared():
    return expected_tokens(SHARED_WORKLOAD)


def serve(engine, workload, params_for=lambda max_new: SamplingParams(max_new_tokens=max_new, temperature=0)):
    """Adds each request at its join step and steps until all are done; returns the final outputs in order
    and checks that every request got exactly one finished output."""
    pending = sorted(range(len(workload)), key=lambda i: workload[i][2])
    ids, finals = {}, {}
    for step in itertools.count():
        while pending and workload[pending[0]][2] <= step:
            i = pending.pop(0)
            prompt, max_new, _ = workload[i]
            ids[i] = engine.add_request(None, params_for(max_new), prompt_token_ids=prompt)
        for out in engine.step():
            assert out.request_id not in finals, "a second finished output"
            if out.finished:
                finals[out.request_id] = out
        if not pending and not engine.has_unfinished():
            break
        assert step < 5000
    return [finals[ids[i]] for i in range(len(workload))]


def check_oracle(outputs, expected, workload):
    for i, (out, want) in enumerate(zip(outputs, expected)):
        assert out.token_ids == want, f"request {i} (prompt {len(workload[i][0])}, max_new {workload[i][1]})"
        assert out.finish_reason is (FinishReason.EOS if want[-1] == EOS else FinishReason.LENGTH)


def check_all_blocks_free(engine):
    bm = engine.core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks and bm.usage == 0.0


# --- the oracle -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config",
    [
        dict(),
        dict(max_num_batched_tokens=8),
        dict(max_prefill_tokens_per_step=8),
        dict(max_num_seqs=32, max_num_batched_tokens=64),
        dict(enable_chunked_prefill=False, max_num_batched_tokens=MAX_LEN),
        dict(batching="static"),
        dict(num_scheduler_steps=4),
        dict(num_scheduler_steps=3, batching="static"),
        dict(async_scheduling=True),
        dict(async_scheduling=True, num_scheduler_steps=4),
        dict(async_scheduling=True, num_scheduler_steps=3, batching="static"),
        dict(async_scheduling=True, max_num_batched_tokens=8, num_scheduler_steps=2),
    ],
    ids=[
        "continuous",
        "tiny-budget",
        "prefill-share",
        "wide",
        "no-chunking",
        "static",
        "multi-step",
        "multi-step-static",
        "async",
        "async-multi-step",
        "async-multi-step-static",
        "async-tiny-budget",
    ],
)
def test_greedy_tokens_equal_each_request_alone(expected, config):
    engine = make_engine(**config)
    outputs = serve(engine, WORKLOAD)
    check_oracle(outputs, expected, WORKLOAD)
    assert any(o.finish_reason is FinishReason.EOS for o in outputs)
    assert any(o.finish_reason is FinishReason.LENGTH for o in outputs)
    check_all_blocks_free(engine)


@pytest.mark.parametrize(
    "config",
    [
        dict(),
        dict(batching="static"),
        dict(max_num_batched_tokens=8),
        dict(num_scheduler_steps=4),
        dict(async_scheduling=True),
        dict(async_scheduling=True, num_scheduler_steps=4),
    ],
    ids=["continuous", "static", "tiny-budget", "multi-step", "async", "async-multi-step"],
)
def test_greedy_tokens_survive_preemption(expected, config):
    engine = make_engine(num_blocks=26, **config)  # 25 blocks: one sequence of MAX_LEN tokens fits
    outputs = serve(engine, WORKLOAD)
    assert engine.core.scheduler.num_preemptions > 0
    assert sum(o.metrics.num_preemptions for o in outputs) == engine.core.scheduler.num_preemptions
    check_oracle(outputs, expected, WORKLOAD)
    check_all_blocks_free(engine)


def test_greedy_tokens_with_prefix_caching(expected_shared):
    plain = make_engine()
    check_oracle(serve(plain, SHARED_WORKLOAD), expected_shared, SHARED_WORKLOAD)
    cached = make_engine(enable_prefix_caching=True)
    outputs = serve(cached, SHARED_WORKLOAD)
    check_oracle(outputs, expected_shared, SHARED_WORKLOAD)
    bm = cached.core.scheduler.block_manager
    assert bm.prefix_cache_hits > 0
    assert cached.core.runner.num_computed_tokens < plain.core.runner.num_computed_tokens
    assert sum(o.metrics.num_cached_tokens for o in outputs) > 0
    check_all_blocks_free(cached)


@pytest.mark.parametrize("steps", [1, 4])
@pytest.mark.parametrize("ahead", [False, True], ids=["sync", "async"])
def test_greedy_tokens_with_prefix_caching_and_preemption(expected_shared, steps, ahead):
    engine = make_engine(num_blocks=26, enable_prefix_caching=True, num_scheduler_steps=steps, async_scheduling=ahead)
    outputs = serve(engine, SHARED_WORKLOAD)
    assert engine.core.scheduler.num_preemptions > 0
    check_oracle(outputs, expected_shared, SHARED_WORKLOAD)
    check_all_blocks_free(engine)


# --- async scheduling -----------------------------------------------------------------------
def test_async_scheduling_submits_each_step_before_collecting_the_one_in_flight(expected):
    engine = make_engine(async_scheduling=True, num_scheduler_steps=4, max_num_seqs=4)
    outputs = serve(engine, WORKLOAD)
    check_oracle(outputs, expected, WORKLOAD)
    check_all_blocks_free(engine)
    submissions = engine.core.runner.deferred.submissions
    assert max(in_flight for *_, in_flight in submissions) == 1  # never two steps ahead
    ahead = [s for s in submissions if s[3] == 1]
    assert len(ahead) > 0.6 * len(submissions)  # the others follow an idle engine or a prompt chunk
    continued = [s for s in ahead if s[2]]
    assert continued and all(rows.count(-1) < len(rows) for _, _, rows, _ in continued)
    for seqs, _, rows, _ in continued:  # rows continuing a step in flight are one-token placeholder rows
        assert all((r >= 0) == (seq.token_ids == [-1]) for seq, r in zip(seqs, rows))


def test_a_request_at_its_length_limit_frees_its_slot_while_its_last_tokens_are_computed():
    engine = make_engine(async_scheduling=True, num_scheduler_steps=4, max_num_seqs=1)
    params = SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True)
    prompts = [[5, 6, 7], [8, 9]]
    outputs = engine.generate(prompts, params)
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == reference_greedy(make_runner, prompt, 4)
    first, second = engine.core.runner.deferred.submissions[:2]
    # the first prompt rides in a round of 4 (full batch), which gives all its tokens: the second prompt is
    # submitted while that round is still in flight
    assert first[0][0].token_ids == prompts[0] and first[1] == 4
    assert second[0][0].token_ids == prompts[1] and second[3] == 1
    check_all_blocks_free(engine)


def test_abort_while_a_step_is_in_flight(expected):
    engine = make_engine(async_scheduling=True, num_scheduler_steps=2, max_num_seqs=4)
    params = [SamplingParams(max_new_tokens=m, temperature=0) for _, m, _ in WORKLOAD[:4]]
    ids = [engine.add_request(None, p, prompt_token_ids=w[0]) for p, w in zip(params, WORKLOAD[:4])]
    finals = {}
    for _ in range(3):
        for out in engine.step():
            finals[out.request_id] = out
    while not engine.core.runner.deferred.submissions[-1][3]:  # until a step went out with one in flight
        for out in engine.step():
            finals[out.request_id] = out
    assert ids[1] not in finals or not finals[ids[1]].finished
    assert engine.abort(ids[1])
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                assert out.request_id not in finals or not finals[out.request_id].finished
            finals[out.request_id] = out
    assert finals[ids[1]].finish_reason is FinishReason.ABORT and -1 not in finals[ids[1]].token_ids
    assert [finals[ids[i]].token_ids for i in (0, 2, 3)] == [expected[i] for i in (0, 2, 3)]
    check_all_blocks_free(engine)


def test_a_failed_step_in_flight_fails_its_requests_and_the_step_after_it(expected):
    engine = make_engine(async_scheduling=True, num_scheduler_steps=2, max_num_seqs=2)
    params = SamplingParams(max_new_tokens=30, temperature=0, ignore_eos=True)
    first = [engine.add_request(None, params, prompt_token_ids=p) for p, _, _ in WORKLOAD[:2]]
    while not engine.step():
        pass
    engine.core.runner.fail_next = RuntimeError("device lost")
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    assert set(finals) == set(first)
    assert all(o.finish_reason is FinishReason.ERROR and "device lost" in o.error for o in finals.values())
    assert all(-1 not in o.token_ids for o in finals.values())
    check_all_blocks_free(engine)
    later = serve(engine, [(p, m, 0) for p, m, _ in WORKLOAD[2:5]])
    assert [o.token_ids for o in later] == expected[2:5]


def test_async_scheduling_with_sampled_and_penalized_requests_in_the_batch(expected):
    """The plain greedy rows of a step that samples the others in the engine are the runner's to choose (a mixed
    step: only the others' logits come back), and every request gets the tokens it gets alone."""
    engine = make_engine(async_scheduling=True, num_scheduler_steps=4, max_num_seqs=6)
    extra = [
        ([3, 4, 5], SamplingParams(max_new_tokens=15, temperature=0.8, top_k=20, seed=7)),
        ([9, 8, 7, 6], SamplingParams(max_new_tokens=12, temperature=0, repetition_penalty=1.3)),
    ]
    alone = [make_engine().generate([prompt], params)[0].token_ids for prompt, params in extra]
    names, finals, extra_seqs = {}, {}, set()

    def step():
        for out in engine.step():
            if out.finished:
                finals[names[out.request_id]] = out.token_ids

    for i, (prompt, n, _) in enumerate(WORKLOAD[:10]):
        names[engine.add_request(None, SamplingParams(max_new_tokens=n, temperature=0), prompt_token_ids=prompt)] = i
        if i in (3, 6):  # join while greedy steps are in flight
            for _ in range(3):
                step()
            prompt, params = extra[i // 6]
            request_id = engine.add_request(None, params, prompt_token_ids=prompt)
            names[request_id] = f"extra{i // 6}"
            extra_seqs.add(engine.core.scheduler.get_request(request_id).seq_id)
    while engine.has_unfinished():
        step()
    assert [finals[i] for i in range(10)] == expected[:10]
    assert [finals["extra0"], finals["extra1"]] == alone
    deferred = engine.core.runner.deferred
    mixed = [
        (seqs, prev_rows, rows)
        for (seqs, greedy_steps, prev_rows, _), rows in zip(deferred.submissions, deferred.logits_rows)
        if rows
    ]
    for (seqs, _, _, _), rows in zip(deferred.submissions, deferred.logits_rows):
        decoding = {seq.seq_id in extra_seqs for seq in seqs if len(seq.token_ids) == 1}
        assert rows or decoding != {True, False}  # a step where both kinds decode is mixed
    for seqs, _, rows in mixed:  # only the rows the engine samples bring their logits
        assert list(rows) == [i for i, seq in enumerate(seqs) if seq.seq_id in extra_seqs] and len(rows) < len(seqs)
    # mixed steps continued rows of a greedy step in flight
    assert any(prev_rows for _, prev_rows, _ in mixed)
    check_all_blocks_free(engine)


# --- multi-step decoding --------------------------------------------------------------------
def test_multi_step_decoding_runs_steps_back_to_back_and_matches_single_steps():
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20]]
    params = SamplingParams(max_new_tokens=11, temperature=0, ignore_eos=True)
    single = make_engine().generate(prompts, params)
    engine = make_engine(num_scheduler_steps=4)
    rounds = []
    engine.add_step_listener(lambda stats: rounds.append((stats.num_model_steps, stats.num_new_tokens)))
    multi = engine.generate(prompts, params)
    for a, b in zip(single, multi):
        assert a.token_ids == b.token_ids and len(b.token_ids) == 11
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-6)
        assert b.finish_reason is FinishReason.LENGTH
    # one prefill step (the batch has room: first tokens go out at once), then rounds of 4 decode steps (the
    # last cut short by max_new_tokens: tokens dropped)
    assert rounds[0] == (1, 3) and [steps for steps, _ in rounds[1:]] == [4, 4, 4]
    assert [tokens for _, tokens in rounds[1:]] == [12, 12, 6]
    # with a full batch the prompts are the first step of a round
    engine = make_engine(num_scheduler_steps=4, max_num_seqs=3)
    rounds.clear()
    engine.add_step_listener(lambda stats: rounds.append((stats.num_model_steps, stats.num_new_tokens)))
    assert [r.token_ids for r in engine.generate(prompts, params)] == [r.token_ids for r in single]
    assert rounds == [(4, 12), (4, 12), (4, 9)]
    check_all_blocks_free(engine)


def test_no_round_while_the_batch_has_room_for_a_waiting_prompt():
    engine = make_engine(num_scheduler_steps=4, max_prefills_per_decode_step=1, max_num_seqs=4)
    steps = []
    engine.add_step_listener(lambda stats: steps.append((stats.num_model_steps, stats.num_prefill_seqs)))
    params = SamplingParams(max_new_tokens=10, temperature=0, ignore_eos=True)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [13]]
    engine.add_request(None, params, prompt_token_ids=prompts[0])
    engine.step()
    ids = [engine.add_request(None, params, prompt_token_ids=p) for p in prompts[1:]]
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    # one prompt joins each decoding step, a single step while the batch has room; the admission that fills
    # it starts a round
    assert steps[:4] == [(1, 1), (1, 1), (1, 1), (4, 1)]
    single = make_engine().generate(prompts[1:], params)
    assert [outputs[i] for i in ids] == [r.token_ids for r in single]
    check_all_blocks_free(engine)


def test_a_prompt_chunk_runs_alone_and_a_completed_prompt_joins_the_round():
    prompts = [[5, 6, 7], list(range(30, 50))]  # the second needs two chunks of the 16-token budget
    params = SamplingParams(max_new_tokens=9, temperature=0, ignore_eos=True)
    single = make_engine(max_num_batched_tokens=16).generate(prompts, params)
    engine = make_engine(max_num_batched_tokens=16, num_scheduler_steps=4, max_num_seqs=2)
    rounds = []
    engine.add_step_listener(lambda stats: rounds.append((stats.num_model_steps, stats.num_prefill_seqs)))
    multi = engine.generate(prompts, params)
    assert [r.token_ids for r in multi] == [r.token_ids for r in single]
    # step 1: the first prompt and a chunk of the second (no round: the chunk samples nothing); then the rest of
    # the second prompt joins a round of 4 with the first request's decodes
    assert rounds[0] == (1, 2) and rounds[1] == (4, 1)
    check_all_blocks_free(engine)


def test_multi_step_decoding_stops_at_a_stop_token_inside_a_round():
    prompt = [5, 6, 7]
    free_run = reference_greedy(make_runner, prompt, 20)
    stop = free_run[6]  # a token produced in the middle of the second round
    want = reference_greedy(make_runner, prompt, 20, stop_token_ids=[stop])
    engine = make_engine(num_scheduler_steps=4)
    out = engine.generate(
        [prompt], SamplingParams(max_new_tokens=20, temperature=0, stop_token_ids=(stop,), ignore_eos=True)
    )[0]
    assert out.token_ids == want and out.finish_reason is FinishReason.STOP
    check_all_blocks_free(engine)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=8, temperature=0.7, seed=1),
        SamplingParams(max_new_tokens=8, temperature=0, repetition_penalty=1.3),
        SamplingParams(max_new_tokens=8, temperature=0, top_logprobs=2),
        SamplingParams(max_new_tokens=8, temperature=0, frequency_penalty=0.5),
        SamplingParams(max_new_tokens=8, temperature=0, logit_bias={3: 2.0}),
        SamplingParams(max_new_tokens=8, temperature=0, logprobs_mode="processed"),
    ],
    ids=["sampled", "repetition-penalty", "top-logprobs", "frequency-penalty", "logit-bias", "processed-logprobs"],
)
def test_rows_that_need_the_engine_between_tokens_run_one_step_at_a_time(params):
    engine = make_engine(num_scheduler_steps=4)
    steps = []
    engine.add_step_listener(lambda stats: steps.append(stats.num_model_steps))
    got = engine.generate([[5, 6, 7]], params)[0]
    assert set(steps) == {1} and len(got.token_ids) == 8
    assert got.token_ids == make_engine().generate([[5, 6, 7]], params)[0].token_ids


def test_a_prompt_filling_the_batch_joins_a_round():
    engine = make_engine(num_scheduler_steps=4, max_num_seqs=2)
    steps = []
    engine.add_step_listener(lambda stats: steps.append((stats.num_model_steps, stats.num_prefill_seqs)))
    params = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
    first = engine.add_request(None, params, prompt_token_ids=[5, 6, 7])
    outputs = {first: [t for out in engine.step() for t in out.new_token_ids]}  # the prompt alone: room left
    outputs[first] += [t for out in engine.step() for t in out.new_token_ids]  # a round of 4 decode steps
    second = engine.add_request(None, params, prompt_token_ids=[8, 9])
    while engine.has_unfinished():  # the newcomer fills the batch: its prompt is a round's first step
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert steps[:3] == [(1, 1), (4, 0), (4, 1)]
    single = make_engine().generate([[5, 6, 7], [8, 9]], params)
    assert [outputs[first], outputs[second]] == [r.token_ids for r in single]
    check_all_blocks_free(engine)


def test_the_fake_runner_catches_a_wrong_block_table():
    """The oracle has teeth: a scheduler that hands a stale block table changes the output."""
    engine = make_engine()
    prompt = [5, 6, 7, 8, 9, 10, 11]
    want = reference_greedy(make_runner, prompt, 6, EOS)
    request_id = engine.add_request(None, SamplingParams(max_new_tokens=6, temperature=0), prompt_token_ids=prompt)
    engine.step()
    request = engine.core.get_request(request_id)
    request.block_table[0], request.block_table[1] = request.block_table[1], request.block_table[0]
    got = []
    while engine.has_unfinished():
        for out in engine.step():
            got = out.token_ids
    assert got != want


# --- seeded sampling ------------------------------------------------------------------------
def test_seeded_sampling_is_independent_of_the_batch():
    params = SamplingParams(max_new_tokens=20, temperature=0.8, top_k=20, top_p=0.95, seed=42)
    prompt = [3, 4, 5, 6, 7, 8, 9]
    alone = make_engine().generate([prompt], params)[0].token_ids

    busy = make_engine(num_blocks=26)
    rng = random.Random(3)
    for i in range(12):
        busy.add_request(
            None,
            SamplingParams(max_new_tokens=rng.randint(5, 40), temperature=1.0),
            prompt_token_ids=[rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 40))],
        )
        if i % 3 == 0:
            busy.step()
    mine = busy.add_request(None, params, prompt_token_ids=prompt)
    got = None
    while busy.has_unfinished():
        for out in busy.step():
            if out.request_id == mine and out.finished:
                got = out.token_ids
    assert busy.core.scheduler.num_preemptions > 0
    assert got == alone and len(set(alone)) > 1


# --- bad input, abort, failures -------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt=""), "prompt is empty"),
        (dict(prompt="hello"), "this engine has no tokenizer; send prompt_token_ids"),
        (dict(prompt_token_ids=[]), "prompt_token_ids is empty"),
        (dict(prompt_token_ids=[3, VOCAB]), f"prompt_token_ids must hold ints in [0, {VOCAB}), got {VOCAB}"),
        (dict(prompt_token_ids=[3, True]), "prompt_token_ids must hold ints"),
        (dict(prompt_token_ids=[3] * MAX_LEN), f"prompt has {MAX_LEN} tokens, but max_model_len is {MAX_LEN}"),
        (
            dict(prompt_token_ids=[3] * 90, params=SamplingParams(max_new_tokens=10)),
            "together 100 > max_model_len 96; lower max_new_tokens to at most 6",
        ),
        (dict(prompt_token_ids=[3], params={"top_p": 1.5}), "top_p must be in (0, 1], got 1.5"),
        (dict(prompt_token_ids=[3], params={"max_tokens": 4}), "unknown sampling parameters ['max_tokens']"),
        (dict(prompt_token_ids=[3], params="greedy"), "params must be SamplingParams, a dict or None"),
        (dict(prompt_token_ids=[3], params=SamplingParams(stop=["x"])), "stop strings need a tokenizer"),
        (dict(prompt_token_ids=[3], params=SamplingParams(stop_token_ids=[VOCAB])), "outside the vocabulary"),
        (dict(prompt_token_ids=[3], params=SamplingParams(bad_words=["x"])), "bad_words need a tokenizer"),
        (
            dict(prompt_token_ids=[3], params=SamplingParams(logit_bias={VOCAB: 1.0, 2: -1.0})),
            f"logit_bias names token ids [{VOCAB}] outside the vocabulary [0, {VOCAB})",
        ),
        (
            dict(prompt_token_ids=[3], params=SamplingParams(allowed_token_ids=[5, VOCAB + 1, VOCAB + 1])),
            f"allowed_token_ids names token ids [{VOCAB + 1}] outside the vocabulary",
        ),
        (dict(prompt="", prompt_token_ids=[3]), "prompt is empty"),
        (dict(), "give a prompt (text) or prompt_token_ids"),
        (dict(prompt_token_ids=[3], request_id="busy"), "request_id 'busy' is already in use"),
        (dict(prompt_token_ids=[3], request_id=""), "request_id must be a non-empty string"),
    ],
)
def test_bad_requests_are_refused_while_others_keep_running(expected, kwargs, message):
    engine = make_engine()
    workload = WORKLOAD[:6]
    params = SamplingParams(max_new_tokens=workload[0][1], temperature=0)
    engine.add_request(None, params, "busy", prompt_token_ids=workload[0][0])
    engine.step()
    before = engine.num_unfinished
    kwargs = dict(kwargs)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(
            kwargs.pop("prompt", None), kwargs.pop("params", None), kwargs.pop("request_id", None), **kwargs
        )
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)
    assert engine.num_unfinished == before
    rest = [(p, m, 0) for p, m, _ in workload[1:]]
    outputs = serve(engine, rest)
    check_oracle(outputs, expected[1:6], rest)
    check_all_blocks_free(engine)


def test_abort_in_any_state_frees_blocks_and_reports_once(expected):
    engine = make_engine(max_num_seqs=2)
    params = [SamplingParams(max_new_tokens=m, temperature=0) for _, m, _ in WORKLOAD[:4]]
    ids = [engine.add_request(None, p, prompt_token_ids=w[0]) for p, w in zip(params, WORKLOAD[:4])]
    engine.step()
    assert engine.abort(ids[0])  # running
    assert engine.abort(ids[3])  # waiting
    assert not engine.abort(ids[3]) and not engine.abort("nobody")
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                assert out.request_id not in finals
                finals[out.request_id] = out
    assert finals[ids[0]].finish_reason is FinishReason.ABORT
    assert finals[ids[3]].finish_reason is FinishReason.ABORT and finals[ids[3]].token_ids == []
    assert finals[ids[1]].token_ids == expected[1] and finals[ids[2]].token_ids == expected[2]
    check_all_blocks_free(engine)


@pytest.mark.parametrize("steps", [1, 4])
def test_a_failed_model_step_fails_only_its_requests(expected, steps):
    engine = make_engine(max_num_seqs=2, num_scheduler_steps=steps)
    first = [
        engine.add_request(None, SamplingParams(max_new_tokens=m, temperature=0), prompt_token_ids=p)
        for p, m, _ in WORKLOAD[:2]
    ]
    engine.step()
    engine.core.runner.fail_next = RuntimeError("device lost")
    outputs = engine.step()
    assert {o.request_id for o in outputs} == set(first)
    assert all(o.finished and o.finish_reason is FinishReason.ERROR for o in outputs)
    assert "model step failed: RuntimeError: device lost" in outputs[0].error
    check_all_blocks_free(engine)
    later = serve(engine, [(p, m, 0) for p, m, _ in WORKLOAD[2:5]])
    assert [o.token_ids for o in later] == expected[2:5]


# --- text, stop strings, generate, stats ------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
        show_progress=False,
    )
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog. " * 20], trainer)
    return tok


def text_engine(tokenizer, **overrides):
    return make_engine(
        tokenizer=tokenizer, eos=tokenizer.token_to_id("<eos>"), vocab_size=tokenizer.get_vocab_size(), **overrides
    )


@pytest.mark.parametrize("steps", [1, 4])
def test_streamed_text_adds_up_to_the_decoded_tokens(tokenizer, steps):
    engine = text_engine(tokenizer, num_scheduler_steps=steps)
    prompts = ["hello world", "the quick brown fox", "日本語 is fine", "a"]
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=40, temperature=0)) for p in prompts]
    streamed = {i: "" for i in ids}
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            streamed[out.request_id] += out.new_text
            assert out.text == streamed[out.request_id]
            assert len(out.new_token_texts) == len(out.new_token_ids) and "".join(out.new_token_texts) == out.new_text
            if out.finished:
                finals[out.request_id] = out
    for request_id, prompt in zip(ids, prompts):
        out = finals[request_id]
        assert out.prompt == prompt and out.prompt_token_ids == tokenizer.encode(prompt).ids
        assert out.text == tokenizer.decode(out.token_ids) != ""
        assert len(out.logprobs) == len(out.token_ids) and all(lp <= 0 for lp in out.logprobs)


def test_stop_string_cuts_the_text_and_frees_the_request(tokenizer):
    prompt = "hello world"
    free = text_engine(tokenizer).generate(prompt, SamplingParams(max_new_tokens=40, temperature=0))[0]
    text = free.text
    stop = re.search("[a-z]{4,}", text[3:]).group(0)  # a word from the middle of the free output
    engine = text_engine(tokenizer)
    out = engine.generate(prompt, SamplingParams(max_new_tokens=40, temperature=0, stop=[stop]))[0]
    assert out.finish_reason is FinishReason.STOP
    assert out.text == text[: text.index(stop)]
    assert out.token_ids == free.token_ids[: len(out.token_ids)] and len(out.token_ids) < len(free.token_ids)
    assert not engine.has_unfinished()
    check_all_blocks_free(engine)


def test_bad_words_keep_their_token_sequences_out_of_the_output(tokenizer):
    prompt = "hello world"
    free = text_engine(tokenizer).generate(prompt, SamplingParams(max_new_tokens=30, temperature=0))[0]
    word = re.search("[a-z]{4,}", free.text).group(0)
    banned = bad_words_token_ids(lambda text: tokenizer.encode(text, add_special_tokens=False).ids, [word])
    assert any(_occurs(sequence, free.token_ids) for sequence in banned)
    out = text_engine(tokenizer).generate(prompt, SamplingParams(max_new_tokens=30, temperature=0, bad_words=[word]))[0]
    assert out.token_ids != free.token_ids
    assert not any(_occurs(sequence, out.token_ids) for sequence in banned)


def _occurs(sequence, tokens) -> bool:
    return any(tuple(tokens[i : i + len(sequence)]) == tuple(sequence) for i in range(len(tokens)))


@pytest.mark.parametrize("config", [dict(), dict(num_scheduler_steps=4), dict(async_scheduling=True)])
def test_min_tokens_holds_back_eos(config):
    prompt = [3, 4, 5]
    first = make_engine(eos=None).generate([prompt], SamplingParams(max_new_tokens=1, temperature=0))[0].token_ids[0]
    engine = make_engine(eos=first, **config)
    assert engine.generate([prompt], SamplingParams(max_new_tokens=10, temperature=0))[0].token_ids == [first]
    out = engine.generate([prompt], SamplingParams(max_new_tokens=10, temperature=0, min_tokens=3))[0]
    assert first not in out.token_ids[:3] and len(out.token_ids) >= 4
    assert out.finish_reason is (FinishReason.EOS if out.token_ids[-1] == first else FinishReason.LENGTH)


def test_generate_keeps_order_and_refuses_a_busy_engine(expected):
    engine = make_engine()
    prompts = [p for p, _, _ in WORKLOAD[:5]]
    params = [SamplingParams(max_new_tokens=m, temperature=0) for _, m, _ in WORKLOAD[:5]]
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected[:5]
    assert engine.generate(prompts[0], params[0])[0].token_ids == expected[0]
    with pytest.raises(InvalidRequestError, match="prompt_token_ids is empty"):
        engine.generate([prompts[1], []], params[0])
    assert not engine.has_unfinished()
    check_all_blocks_free(engine)
    engine.add_request(None, params[0], prompt_token_ids=prompts[0])
    with pytest.raises(RuntimeError, match="needs an idle engine"):
        engine.generate(prompts, params)


def test_step_stats_and_request_metrics():
    ticks = itertools.count()
    runner = make_runner()
    engine = LLMEngine(
        runner,
        None,
        SchedulerConfig.for_runner(runner, max_num_seqs=8, max_num_batched_tokens=32),
        eos_token_id=EOS,
        clock=lambda: float(next(ticks)),
    )
    stats = []
    engine.add_step_listener(stats.append)
    outputs = serve(engine, WORKLOAD)
    assert len(stats) > 0 and stats[-1] is engine.stats
    assert all(s.num_seqs <= 8 and s.num_batched_tokens <= 32 for s in stats)
    assert all(0.0 <= s.kv_usage <= 1.0 and 0.0 <= s.token_budget_usage <= 1.0 for s in stats)
    assert sum(s.num_new_tokens for s in stats) == sum(len(o.token_ids) for o in outputs)
    assert sum(s.num_finished for s in stats) == NUM_REQUESTS
    assert sum(s.num_prefill_tokens + s.num_decode_tokens for s in stats) == runner.num_computed_tokens
    assert max(s.num_seqs for s in stats) == 8
    for out in outputs:
        m = out.metrics
        assert m.arrival_time < m.first_scheduled_time < m.first_token_time <= m.last_token_time <= m.finished_time
        assert m.time_to_first_token > 0 and m.e2e_latency >= m.time_to_first_token and m.queue_time > 0


def test_config_must_fit_the_runner():
    runner = make_runner(num_blocks=30)
    with pytest.raises(ValueError, match="block_size=8 differs from the model runner's block_size=4"):
        LLMEngine(
            runner, None, SchedulerConfig(block_size=8, num_blocks=16, max_model_len=64, max_num_batched_tokens=64)
        )
    with pytest.raises(ValueError, match="num_blocks=32 exceeds the model runner's num_blocks=30"):
        LLMEngine(
            runner, None, SchedulerConfig(block_size=4, num_blocks=32, max_model_len=64, max_num_batched_tokens=64)
        )
    with pytest.raises(ValueError, match="max_model_len=100 exceeds the model runner's max_seq_len=96"):
        LLMEngine(
            runner, None, SchedulerConfig(block_size=4, num_blocks=30, max_model_len=100, max_num_batched_tokens=128)
        )
    default = LLMEngine(runner).config
    assert (default.num_blocks, default.block_size, default.max_model_len) == (30, 4, 96)


def test_logits_of_the_wrong_shape_fail_the_step():
    engine = make_engine()
    engine.core.runner.run = lambda seqs: np.zeros((len(seqs) + 1, VOCAB), dtype=np.float32)
    request_id = engine.add_request(None, SamplingParams(max_new_tokens=3), prompt_token_ids=[3, 4])
    (out,) = engine.step()
    assert out.request_id == request_id and out.finish_reason is FinishReason.ERROR
    assert "returned logits of shape (2, 64) for 1 sequences" in out.error


def test_a_prompt_beyond_the_character_limit_is_refused_before_it_is_tokenized():
    class Untouchable:
        def encode(self, text):
            raise AssertionError(f"tokenized {len(text)} characters")

    engine = make_engine(tokenizer=Untouchable(), max_prompt_chars=10)
    with pytest.raises(InvalidRequestError, match=r"prompt has 11 characters, more than this model takes \(10, "):
        engine.add_request("x" * 11, SamplingParams(max_new_tokens=1))
    default = make_engine(tokenizer=Untouchable())
    with pytest.raises(InvalidRequestError, match=f"more than this model takes \\({32 * MAX_LEN}, "):
        default.add_request("x" * (32 * MAX_LEN + 1), SamplingParams(max_new_tokens=1))


@pytest.mark.parametrize(
    "config",
    [dict(), dict(num_scheduler_steps=4), dict(async_scheduling=True)],
    ids=["continuous", "multi-step", "async"],
)
def test_a_request_stops_on_any_of_several_eos_ids(config):
    prompt = [5, 9, 14, 3]
    free = reference_greedy(make_runner, prompt, 40)  # no eos: the tokens the fake model writes
    first = {}
    for position, token in enumerate(free):
        first.setdefault(token, position)
    early, late = sorted(first.items(), key=lambda item: item[1])[1:3]  # two tokens, each new where it appears
    for eos, stop_at in (([late[0], early[0]], early[1]), ((late[0],), late[1]), (early[0], early[1])):
        engine = make_engine(eos=eos, **config)
        (out,) = engine.generate([prompt], SamplingParams(max_new_tokens=40, temperature=0))
        assert (out.token_ids, out.finish_reason) == (free[: stop_at + 1], FinishReason.EOS), eos
    ignored = make_engine(eos=[late[0], early[0]], **config).generate(
        [prompt], SamplingParams(max_new_tokens=40, temperature=0, ignore_eos=True)
    )[0]
    assert (ignored.token_ids, ignored.finish_reason) == (free, FinishReason.LENGTH)


def test_a_prompt_tokenized_already_keeps_its_text_and_its_ids():
    engine = make_engine()
    request_id = engine.add_request(
        "<s>[user]hi", SamplingParams(max_new_tokens=2, temperature=0), prompt_token_ids=[5, 9, 14]
    )
    outputs = [out for _ in range(10) for out in engine.step() if out.request_id == request_id]
    assert (outputs[-1].prompt, outputs[-1].prompt_token_ids) == ("<s>[user]hi", [5, 9, 14])
