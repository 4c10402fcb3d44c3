"""Several choices per request (SamplingParams n / best_of): the prompt is computed once, the choices share its full
KV blocks, each recomputes the partial last block, and all of them end, are aborted and free their blocks together.

The oracle: the fake runner derives logits from the KV cache it reads back, so a choice's tokens equal those of a
request alone with the choice's seed (seed + choice) only when its blocks are right; greedy choices equal the
greedy tokens of the request alone.
"""

import pytest

from mindspore_serving.agent.testing import AheadRunner
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.engine import LLMEngine
from mindspore_serving.llm.engine_loop import EngineLoop
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.request import FinishReason, Request, RequestStatus
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.llm.scheduler import Scheduler
from mindspore_serving.llm.testing import FakeModelRunner, reference_greedy

VOCAB = 64
EOS = 1
BS = 4
MAX_LEN = 96
PROMPT = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # two full blocks and a tail of 2


def make_runner(num_blocks=128, ahead=False):
    return (AheadRunner if ahead else FakeModelRunner)(
        num_blocks=num_blocks, block_size=BS, max_seq_len=MAX_LEN, vocab_size=VOCAB
    )


def make_engine(num_blocks=128, **overrides):
    runner = make_runner(num_blocks, ahead=overrides.get("async_scheduling", False))
    values = dict(max_num_seqs=8, max_num_batched_tokens=32)
    values.update(overrides)
    return LLMEngine(runner, None, SchedulerConfig.for_runner(runner, **values), eos_token_id=EOS, seed=0)


def sampled(n=4, seed=5, max_new=8, **kwargs):
    return SamplingParams(max_new_tokens=max_new, temperature=1.0, seed=seed, n=n, ignore_eos=True, **kwargs)


def alone(params, prompt=PROMPT):
    """The tokens of a request alone on a fresh engine."""
    return make_engine().generate([prompt], params)[0].token_ids


def prompt_tokens_computed(engine, prompt_len):
    """KV positions below the prompt's end that the runner computed, every row of every step."""
    return sum(
        max(0, min(seq.context_len, prompt_len) - seq.start_pos) for call in engine.core.runner.calls for seq in call
    )


def check_all_blocks_free(engine):
    bm = engine.core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks and engine.num_unfinished == 0


def run(engine, request_id):
    """Steps until the engine is idle; the outputs of `request_id`, checking that each choice finished once."""
    outputs = []
    while engine.has_unfinished():
        outputs += [out for out in engine.step() if out.request_id == request_id]
    finals = [out.index for out in outputs if out.finished]
    assert sorted(finals) == list(range(len(finals)))
    return outputs


# --- the engine -------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_the_prompt_is_computed_once_and_each_choice_recomputes_only_the_partial_block(prefix_caching):
    engine = make_engine(enable_prefix_caching=prefix_caching)
    outputs = engine.generate([PROMPT], sampled())
    assert [out.index for out in outputs] == [0, 1, 2, 3]
    tail = len(PROMPT) % BS
    assert prompt_tokens_computed(engine, len(PROMPT)) == len(PROMPT) + 3 * tail
    check_all_blocks_free(engine)


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_seeded_choices_differ_and_each_equals_a_request_alone_with_its_seed(prefix_caching):
    engine = make_engine(enable_prefix_caching=prefix_caching)
    outputs = engine.generate([PROMPT], sampled(seed=5))
    tokens = [out.token_ids for out in outputs]
    assert len({tuple(t) for t in tokens}) == 4
    assert tokens == [alone(sampled(n=1, seed=5 + i)) for i in range(4)]
    assert tokens == [out.token_ids for out in make_engine().generate([PROMPT], sampled(seed=5))]  # reproducible
    for out in outputs:
        assert out.cumulative_logprob == pytest.approx(sum(out.logprobs)) and out.num_choices == 4


def test_greedy_choices_are_identical_and_equal_the_request_alone():
    want = reference_greedy(make_runner, PROMPT, 8, EOS)
    outputs = make_engine().generate([PROMPT], SamplingParams(max_new_tokens=8, temperature=0, n=3))
    assert [out.token_ids for out in outputs] == [want] * 3
    assert len({out.cumulative_logprob for out in outputs}) == 1


@pytest.mark.parametrize(
    "config",
    [
        dict(num_scheduler_steps=4),
        dict(enable_chunked_prefill=False, max_num_batched_tokens=MAX_LEN),
        dict(max_num_batched_tokens=8),
        dict(batching="static"),
        dict(async_scheduling=True, num_scheduler_steps=3),
    ],
    ids=["multi-step", "no-chunking", "chunked-prompt", "static", "async"],
)
def test_choices_under_other_schedules(config):
    want = reference_greedy(make_runner, PROMPT, 8, EOS)
    engine = make_engine(**config)
    outputs = engine.generate(
        [PROMPT, PROMPT[:3]], [SamplingParams(max_new_tokens=8, temperature=0, n=2), sampled(n=3, seed=9)]
    )
    assert [out.token_ids for out in outputs[:2]] == [want] * 2
    assert [out.token_ids for out in outputs[2:]] == [alone(sampled(n=1, seed=9 + i), PROMPT[:3]) for i in range(3)]
    check_all_blocks_free(engine)


def test_best_of_reports_every_choice_with_its_cumulative_logprob():
    outputs = make_engine().generate([PROMPT], sampled(n=1, best_of=3))
    assert [out.index for out in outputs] == [0, 1, 2]
    for out in outputs:
        assert out.cumulative_logprob == pytest.approx(sum(out.logprobs)) and out.cumulative_logprob < 0


def test_each_choice_gets_its_own_top_logprobs_and_only_the_first_output_the_scored_prompt():
    engine = make_engine()
    engine.add_request(None, sampled(n=3, max_new=2, top_logprobs=2, prompt_logprobs=1), "r", prompt_token_ids=PROMPT)
    outputs = run(engine, "r")
    scored = [out for out in outputs if out.prompt_logprobs is not None]
    assert len(scored) == 1 and scored[0] is outputs[0]
    assert len(scored[0].prompt_logprobs) == len(PROMPT) and scored[0].prompt_logprobs[0] is None
    for out in outputs:
        assert len(out.new_top_logprobs) == len(out.new_token_ids) == 1
        assert len(out.new_top_logprobs[0]) == 2
    first_tops = {out.index: out.new_top_logprobs[0] for out in outputs if len(out.token_ids) == 1}
    assert len(first_tops) == 3 and first_tops[0] == first_tops[1] == first_tops[2]  # the one row they share


@pytest.mark.parametrize("prompt_logprobs", [None, 0])
def test_without_new_tokens_every_choice_ends_with_reason_length(prompt_logprobs):
    engine = make_engine()
    outputs = engine.generate([PROMPT], SamplingParams(max_new_tokens=0, n=2, prompt_logprobs=prompt_logprobs))
    assert [(out.index, out.finish_reason, out.token_ids) for out in outputs] == [
        (0, FinishReason.LENGTH, []),
        (1, FinishReason.LENGTH, []),
    ]
    assert (outputs[0].prompt_logprobs is not None) == (prompt_logprobs is not None)
    check_all_blocks_free(engine)


def test_a_shared_block_is_held_by_every_choice_until_the_last_one_ends():
    engine = make_engine()
    engine.add_request(None, sampled(n=4, max_new=3), "r", prompt_token_ids=PROMPT)
    bm = engine.core.scheduler.block_manager
    outputs = engine.step()  # the whole prompt in one step, then the fork
    assert [(out.index, out.finished) for out in outputs] == [(i, False) for i in range(4)]
    choices = engine.core.scheduler.group_members("r")
    assert [r.request_id for r in choices] == ["r", "r#1", "r#2", "r#3"]
    shared = choices[0].block_table[:2]
    assert [bm.ref_count(b) for b in shared] == [4, 4]
    for child in choices[1:]:
        assert child.block_table == shared and child.num_computed_tokens == 2 * BS
    engine.step()
    tails = {r.block_table[2] for r in choices}
    assert len(tails) == 4  # each choice wrote its partial block and its first token into a block of its own
    run(engine, "r")
    check_all_blocks_free(engine)


def test_aborting_the_request_aborts_every_choice():
    engine = make_engine()
    engine.add_request(None, sampled(n=3), "r", prompt_token_ids=PROMPT)
    engine.step()
    engine.step()
    assert engine.abort("r")
    outputs = engine.step()
    assert sorted((out.index, out.finish_reason) for out in outputs) == [(i, FinishReason.ABORT) for i in range(3)]
    assert not engine.abort("r") and not engine.has_unfinished()
    check_all_blocks_free(engine)


def test_aborting_a_request_before_it_forked_ends_every_choice():
    engine = make_engine()
    engine.add_request(None, sampled(n=3), "r", prompt_token_ids=PROMPT)
    engine.abort("r")
    outputs = engine.step()
    assert [(out.index, out.finished, out.finish_reason) for out in outputs] == [
        (i, True, FinishReason.ABORT) for i in range(3)
    ]
    check_all_blocks_free(engine)


def test_a_failed_prompt_step_fails_every_choice():
    engine = make_engine()
    engine.add_request(None, sampled(n=2), "r", prompt_token_ids=PROMPT)
    engine.core.runner.fail_next = RuntimeError("boom")
    outputs = engine.step()
    assert [(out.index, out.finish_reason) for out in outputs] == [(0, FinishReason.ERROR), (1, FinishReason.ERROR)]
    assert all("boom" in out.error for out in outputs)
    check_all_blocks_free(engine)


def test_a_choice_ending_early_leaves_the_others_running():
    engine = make_engine()
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5, n=4)
    engine.add_request(None, params, "r", prompt_token_ids=PROMPT)
    tokens = {}
    for out in run(engine, "r"):
        tokens.setdefault(out.index, []).extend(out.new_token_ids)
    assert tokens == {i: alone(SamplingParams(max_new_tokens=6, temperature=1.0, seed=5 + i)) for i in range(4)}
    check_all_blocks_free(engine)


@pytest.mark.parametrize(
    "config",
    [dict(), dict(enable_prefix_caching=True), dict(batching="static")],
    ids=["no-prefix-cache", "prefix-cache", "static"],
)
def test_preempted_choices_recompute_their_own_tokens(config):
    engine = make_engine(num_blocks=26, **config)
    ids = [
        engine.add_request(None, sampled(n=4, seed=20 * k, max_new=24), prompt_token_ids=PROMPT[k:]) for k in range(2)
    ]
    finals, preempted = {}, set()
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[(out.request_id, out.index)] = out.token_ids
        preempted.update(r.choice for r in engine.core.scheduler.waiting if r.num_output_tokens)
    assert preempted - {0}, "no forked choice was preempted"
    for k, request_id in enumerate(ids):
        for i in range(4):
            assert finals[(request_id, i)] == alone(sampled(n=1, seed=20 * k + i, max_new=24), PROMPT[k:]), (k, i)
    check_all_blocks_free(engine)


def test_a_request_holds_a_batch_seat_per_choice():
    engine = make_engine(max_num_seqs=4, max_num_batched_tokens=64)
    first = engine.add_request(None, sampled(n=3), prompt_token_ids=PROMPT)
    second = engine.add_request(None, sampled(n=2), prompt_token_ids=PROMPT[:5])
    engine.step()
    assert [r.request_id for r in engine.core.scheduler.running] == [first, f"{first}#1", f"{first}#2"]
    assert [r.request_id for r in engine.core.scheduler.waiting] == [second]  # 3 + 2 seats > 4
    finished = set()
    while engine.has_unfinished():
        finished.update((out.request_id, out.index) for out in engine.step() if out.finished)
    assert max(len(call) for call in engine.core.runner.calls) <= 4
    assert finished == {(first, 0), (first, 1), (first, 2), (second, 0), (second, 1)}
    check_all_blocks_free(engine)


def test_more_choices_than_max_num_seqs_are_refused():
    engine = make_engine(max_num_seqs=4)
    with pytest.raises(InvalidRequestError, match="5 choices"):
        engine.add_request(None, SamplingParams(n=1, best_of=5), prompt_token_ids=PROMPT)


def test_choice_ids_never_clash_with_a_request_s_own():
    engine = make_engine()
    engine.add_request(None, sampled(n=1, seed=1), "r#1", prompt_token_ids=PROMPT)
    engine.add_request(None, sampled(n=2, seed=5), "r", prompt_token_ids=PROMPT)
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[(out.request_id, out.index)] = out.token_ids
    assert finals == {
        ("r#1", 0): alone(sampled(n=1, seed=1)),
        ("r", 0): alone(sampled(n=1, seed=5)),
        ("r", 1): alone(sampled(n=1, seed=6)),
    }
    engine.add_request(None, sampled(n=2), "x", prompt_token_ids=PROMPT)
    engine.step()
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request(None, sampled(), "x#1", prompt_token_ids=PROMPT)


# --- the engine loop --------------------------------------------------------------------------
def test_a_stream_ends_after_the_last_choice_s_finished_output():
    loop = EngineLoop(make_engine(max_num_seqs=4), max_waiting=0)
    try:
        stream = loop.submit(PROMPT, sampled(n=3, max_new=4))
        outputs = list(stream)
        assert [out.index for out in outputs if out.finished] == [0, 1, 2] == [out.index for out in stream.finals]
        assert stream.final is outputs[-1] and stream.get() is None
        tokens = {i: [t for out in outputs if out.index == i for t in out.new_token_ids] for i in range(3)}
        assert tokens == {i: alone(sampled(n=1, seed=5 + i, max_new=4)) for i in range(3)}
        # its seats (max_num_seqs + max_waiting) are free again only now
        assert loop.submit(PROMPT, sampled(n=1, max_new=2)).result().finished
    finally:
        loop.close()


def test_an_aborted_stream_ends_once_each_choice_did():
    loop = EngineLoop(make_engine())
    try:
        stream = loop.submit(PROMPT, sampled(n=2, max_new=80))
        stream.abort()
        list(stream)
        assert sorted((out.index, out.finish_reason) for out in stream.finals) == [
            (0, FinishReason.ABORT),
            (1, FinishReason.ABORT),
        ]
    finally:
        loop.close()


# --- the scheduler ----------------------------------------------------------------------------
def test_the_scheduler_forks_a_request_at_its_first_sampled_token():
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32, block_size=4, num_blocks=32)
    )
    request = Request("r", list(range(100, 106)), SamplingParams(max_new_tokens=2, temperature=0, n=3), 0.0)
    sched.add_request(request)
    plan = sched.schedule()
    children = sched.children_to_fork(request)
    assert [c.request_id for c in children] == ["r#1", "r#2"] and sched.children_to_fork(request) == children
    deltas = sched.update_from_output(plan, [7], {0: [8, 9]})
    assert [(d.request_id, d.new_token_ids) for d in deltas] == [("r", [7]), ("r#1", [8]), ("r#2", [9])]
    assert sched.take_forked() == children and sched.take_forked() == []
    assert [c.num_computed_tokens for c in children] == [4, 4] and request.num_seats == 1
    plan = sched.schedule()
    assert [(row.request_id, row.num_tokens) for row in plan.scheduled] == [("r", 1), ("r#1", 3), ("r#2", 3)]
    deltas = sched.update_from_output(plan, [7, 7, 7])
    assert all(d.finished for d in deltas) and not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_usable_blocks
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in [request] + children)


def test_a_fork_without_its_children_s_tokens_is_refused():
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32, block_size=4, num_blocks=32)
    )
    request = Request("r", [5, 6], SamplingParams(temperature=0, n=2), 0.0)
    sched.add_request(request)
    plan = sched.schedule()
    sched.children_to_fork(request)
    with pytest.raises(ValueError, match="forks into 1 choices but got 0"):
        sched.update_from_output(plan, [7])
