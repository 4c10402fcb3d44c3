"""Scheduler: exact batch composition per step, budgets, chunked prefill, preemption, abort, static batching.

The model is never run: each step's sampled tokens are literal (token 7 unless a test says otherwise).
"""

import random

import pytest

from mindspore_serving.llm.batching_policy import BatchingPolicy, ContinuousBatching, StaticBatching
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.request import FinishReason, Request, RequestStatus
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.llm.scheduler import Scheduler


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_scheduler(**overrides):
    values = dict(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32, block_size=4, num_blocks=64)
    values.update(overrides)
    return Scheduler(SchedulerConfig(**values), clock=FakeClock())


def add(sched, request_id, prompt_len, max_new=8, first_token=100, eos=None, **params):
    tokens = [first_token + i for i in range(prompt_len)]
    request = Request(
        request_id,
        tokens,
        SamplingParams(max_new_tokens=max_new, temperature=0, **params),
        arrival_time=sched.clock(),
        eos_token_id=eos,
    )
    sched.add_request(request)
    return request


def step(sched, token=7):
    out = sched.schedule()
    deltas = sched.update_from_output(out, [token if row.samples else None for row in out.scheduled])
    return out, deltas


def layout(out):
    return [(row.request_id, row.num_tokens) for row in out.scheduled]


def run_to_end(sched, max_steps=1000):
    outs = []
    while sched.has_unfinished():
        outs.append(step(sched)[0])
        assert len(outs) < max_steps
    return outs


# --- batch composition ----------------------------------------------------------------------
def test_decodes_first_then_prefills_within_the_budget():
    sched = make_scheduler(max_num_batched_tokens=10)
    a = add(sched, "A", 6)
    out, deltas = step(sched)
    assert layout(out) == [("A", 6)]
    assert out.scheduled[0].samples and out.scheduled[0].is_prefill
    assert [(d.request_id, d.new_token_ids) for d in deltas] == [("A", [7])]

    b = add(sched, "B", 8, first_token=200)
    c = add(sched, "C", 5, first_token=300)
    out, deltas = step(sched)
    assert layout(out) == [("A", 1), ("B", 8), ("C", 1)]  # C gets the last token of the budget
    assert [row.is_prefill for row in out.scheduled] == [False, True, True]
    assert [row.samples for row in out.scheduled] == [True, True, False]
    a_step, b_step, c_step = out.seq_steps
    assert (a_step.token_ids, a_step.start_pos, a_step.block_table) == ([7], 6, a.block_table)
    assert (b_step.token_ids, b_step.start_pos) == (list(range(200, 208)), 0)
    assert (c_step.token_ids, c_step.start_pos, len(c_step.block_table)) == ([300], 0, 1)
    assert [d.request_id for d in deltas] == ["A", "B"]  # the C chunk yields no token

    out, _ = step(sched)
    assert layout(out) == [("A", 1), ("B", 1), ("C", 4)]
    c_step = out.seq_steps[2]
    assert (c_step.token_ids, c_step.start_pos, len(c_step.block_table)) == ([301, 302, 303, 304], 1, 2)
    assert out.scheduled[2].samples
    out, _ = step(sched)
    assert layout(out) == [("A", 1), ("B", 1), ("C", 1)]
    assert c.output_token_ids == [7, 7] and b.num_computed_tokens == 10


def test_chunked_prefill_does_not_stall_decodes():
    sched = make_scheduler(max_num_batched_tokens=8, max_model_len=64)
    add(sched, "A", 3)
    step(sched)
    add(sched, "B", 30)
    starts = []
    for expected_chunk in (7, 7, 7, 7, 2):
        out, deltas = step(sched)
        assert layout(out) == [("A", 1), ("B", expected_chunk)]
        starts.append(out.seq_steps[1].start_pos)
        assert [d.request_id for d in deltas] == (["A", "B"] if expected_chunk == 2 else ["A"])
    assert starts == [0, 7, 14, 21, 28]
    assert layout(step(sched)[0]) == [("A", 1), ("B", 1)]


def test_prefill_share_is_capped_per_step():
    sched = make_scheduler(max_num_batched_tokens=16, max_prefill_tokens_per_step=4)
    add(sched, "A", 2)
    assert layout(step(sched)[0]) == [("A", 2)]
    add(sched, "B", 10)
    add(sched, "C", 3)
    assert layout(step(sched)[0]) == [("A", 1), ("B", 4)]
    assert layout(step(sched)[0]) == [("A", 1), ("B", 4)]
    assert layout(step(sched)[0]) == [("A", 1), ("B", 2), ("C", 2)]  # the share is split, FCFS
    assert layout(step(sched)[0]) == [("A", 1), ("B", 1), ("C", 1)]


def test_prompts_joining_a_decoding_step_are_capped():
    sched = make_scheduler(max_num_batched_tokens=32, max_prefills_per_decode_step=1)
    add(sched, "A", 2)
    add(sched, "B", 3)
    assert layout(step(sched)[0]) == [("A", 2), ("B", 3)]  # nothing decodes yet: no cap
    add(sched, "C", 4)
    add(sched, "D", 5)
    assert layout(step(sched)[0]) == [("A", 1), ("B", 1), ("C", 4)]
    assert layout(step(sched)[0]) == [("A", 1), ("B", 1), ("C", 1), ("D", 5)]


def test_a_chunked_prompt_takes_the_prefill_slot_of_a_decoding_step():
    for cap, expected in ((None, [("A", 1), ("B", 3), ("C", 3)]), (1, [("A", 1), ("B", 3)])):
        sched = make_scheduler(max_num_batched_tokens=8, max_prefills_per_decode_step=cap)
        add(sched, "A", 2)
        step(sched)
        add(sched, "B", 10)
        add(sched, "C", 3)
        assert layout(step(sched)[0]) == [("A", 1), ("B", 7)]
        assert layout(step(sched)[0]) == expected
    assert layout(step(sched)[0]) == [("A", 1), ("B", 1), ("C", 3)]


def test_without_chunking_a_prompt_waits_until_it_fits_whole():
    sched = make_scheduler(max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False)
    add(sched, "A", 3)
    add(sched, "B", 14, max_new=2)
    assert layout(step(sched)[0]) == [("A", 3)]  # 14 > 13 left: B waits, not cut
    assert layout(step(sched)[0]) == [("A", 1), ("B", 14)]

    chunked = make_scheduler(max_num_batched_tokens=16, max_model_len=16)
    add(chunked, "A", 3)
    add(chunked, "B", 14, max_new=2)
    assert layout(step(chunked)[0]) == [("A", 3), ("B", 13)]


def test_max_num_seqs_caps_the_running_set():
    sched = make_scheduler(max_num_seqs=2)
    add(sched, "A", 2, max_new=1)
    add(sched, "B", 2, max_new=3)
    add(sched, "C", 2)
    out, deltas = step(sched)
    assert layout(out) == [("A", 2), ("B", 2)]
    assert [d.finished for d in deltas] == [True, False]
    assert layout(step(sched)[0]) == [("B", 1), ("C", 2)]  # C joins the step after A left


def test_limits_hold_on_a_random_workload():
    rng = random.Random(0)
    sched = make_scheduler(
        max_num_seqs=5, max_num_batched_tokens=12, max_prefill_tokens_per_step=9, max_model_len=48, num_blocks=40
    )
    requests = []
    for i in range(30):
        requests.append(add(sched, f"r{i}", rng.randint(1, 30), max_new=rng.randint(1, 15)))
        if i % 3 == 0:
            step(sched)
    for out in run_to_end(sched):
        assert out.num_batched_tokens <= 12 and out.num_prefill_tokens <= 9 + out.num_decode_tokens
        assert len(out.scheduled) <= 5 and len(set(out.request_ids)) == len(out.request_ids)
        tables = [b for s in out.seq_steps for b in s.block_table]
        assert len(tables) == len(set(tables))  # no block shared without prefix caching
    for request in requests:
        assert request.status is RequestStatus.FINISHED_LENGTH
        assert request.num_output_tokens == request.sampling_params.max_new_tokens
        assert request.block_table == []
    assert sched.block_manager.num_free_blocks == 39


# --- preemption ---------------------------------------------------------------------------
def test_preemption_takes_the_newest_running_request_and_recomputes_it():
    sched = make_scheduler(num_blocks=5, max_model_len=16)  # 4 usable blocks of 4 tokens
    a = add(sched, "A", 4, max_new=10)
    b = add(sched, "B", 4, max_new=10, first_token=200)
    c = add(sched, "C", 4, max_new=10, first_token=300)
    assert layout(step(sched)[0]) == [("A", 4), ("B", 4), ("C", 4)]
    assert sched.block_manager.num_free_blocks == 1

    out, _ = step(sched)  # A and B both need a second block
    assert layout(out) == [("A", 1), ("B", 1)]
    assert out.preempted_request_ids == ["C"]
    assert c.status is RequestStatus.PREEMPTED and c.num_preemptions == 1
    assert c.block_table == [] and c.num_computed_tokens == 0 and c.output_token_ids == [7]
    assert list(sched.waiting) == [c]

    for _ in range(3):  # no room for C to come back
        assert layout(step(sched)[0]) == [("A", 1), ("B", 1)]
    out, _ = step(sched)  # A needs a third block: B is newest
    assert layout(out) == [("A", 1)] and out.preempted_request_ids == ["B"]
    assert list(sched.waiting) == [b, c]  # the last preempted goes first
    assert b.output_token_ids == [7] * 5

    while a.status is RequestStatus.RUNNING:
        out, _ = step(sched)
    assert a.status is RequestStatus.FINISHED_LENGTH
    out, _ = step(sched)  # B comes back: prompt + its 5 tokens
    assert layout(out) == [("B", 9)]
    assert out.seq_steps[0].token_ids == [200, 201, 202, 203] + [7] * 5
    assert out.seq_steps[0].start_pos == 0 and out.scheduled[0].samples
    assert b.output_token_ids == [7] * 6 and b.status is RequestStatus.RUNNING
    run_to_end(sched)
    assert [len(r.output_token_ids) for r in (a, b, c)] == [10, 10, 10]
    assert sched.num_preemptions >= 2 and sched.block_manager.num_free_blocks == 4


def test_a_request_may_preempt_itself_when_it_is_the_newest():
    sched = make_scheduler(num_blocks=3, max_model_len=9)  # 2 usable blocks
    add(sched, "A", 2, max_new=6)
    b = add(sched, "B", 4, max_new=5)
    step(sched)
    out, _ = step(sched)  # A fits its block; B needs a new one
    assert layout(out) == [("A", 1)] and out.preempted_request_ids == ["B"]
    assert b.status is RequestStatus.PREEMPTED


def test_nothing_joins_in_a_step_that_preempted():
    sched = make_scheduler(num_blocks=4, max_model_len=12, max_num_seqs=4)  # 3 usable blocks
    add(sched, "A", 4)
    add(sched, "B", 4)
    step(sched)
    add(sched, "C", 1)  # would fit in the block freed by B
    out, _ = step(sched)
    assert out.preempted_request_ids == ["B"] and layout(out) == [("A", 1)]
    assert [r.request_id for r in sched.waiting] == ["B", "C"]


# --- abort --------------------------------------------------------------------------------
def test_abort_frees_blocks_in_every_state():
    sched = make_scheduler(num_blocks=5, max_model_len=16, max_num_batched_tokens=8)
    usable = sched.block_manager.num_usable_blocks
    waiting = add(sched, "waiting", 3)
    assert sched.finish_request("waiting")
    assert waiting.status is RequestStatus.FINISHED_ABORTED and not sched.waiting
    assert waiting.finish_reason is FinishReason.ABORT

    prefilling = add(sched, "prefilling", 14)
    step(sched)
    assert prefilling.num_computed_tokens == 8 and len(prefilling.block_table) == 2
    assert sched.finish_request("prefilling")
    assert sched.block_manager.num_free_blocks == usable and not sched.running

    sched = make_scheduler(num_blocks=5, max_model_len=16)
    decoding = add(sched, "decoding", 4)
    add(sched, "newer", 4)
    third = add(sched, "third", 4)
    step(sched)
    step(sched)  # preempts "third"
    assert third.status is RequestStatus.PREEMPTED
    assert sched.finish_request("third")
    assert sched.finish_request("decoding")
    assert decoding.block_table == [] and third.status is RequestStatus.FINISHED_ABORTED
    assert sched.finish_request("newer")
    assert sched.block_manager.num_free_blocks == usable
    assert not sched.has_unfinished()
    assert not sched.finish_request("newer") and not sched.finish_request("unknown")


def test_abort_between_schedule_and_update_skips_the_row():
    sched = make_scheduler()
    add(sched, "A", 3)
    b = add(sched, "B", 3)
    out = sched.schedule()
    assert sched.finish_request("A")
    deltas = sched.update_from_output(out, [7, 8])
    assert [(d.request_id, d.new_token_ids) for d in deltas] == [("B", [8])]
    assert b.output_token_ids == [8] and sched.block_manager.num_free_blocks == 62


# --- static batching ----------------------------------------------------------------------
def test_static_batch_runs_until_all_its_requests_finish():
    sched = make_scheduler(max_num_seqs=2, batching="static")
    add(sched, "A", 2, max_new=1)
    add(sched, "B", 2, max_new=3)
    add(sched, "C", 2, max_new=1)
    assert layout(step(sched)[0]) == [("A", 2), ("B", 2)]
    add(sched, "D", 2, max_new=1)
    assert layout(step(sched)[0]) == [("B", 1)]  # A left, but nobody joins
    assert layout(step(sched)[0]) == [("B", 1)]
    assert layout(step(sched)[0]) == [("C", 2), ("D", 2)]  # the next batch
    assert not sched.has_unfinished()


def test_continuous_batching_refills_at_once():
    sched = make_scheduler(max_num_seqs=2)
    add(sched, "A", 2, max_new=1)
    add(sched, "B", 2, max_new=3)
    add(sched, "C", 2, max_new=1)
    assert layout(step(sched)[0]) == [("A", 2), ("B", 2)]
    assert layout(step(sched)[0]) == [("B", 1), ("C", 2)]


def test_static_batch_members_come_back_after_preemption_before_others():
    sched = make_scheduler(num_blocks=4, max_model_len=12, max_num_seqs=2, batching="static")
    a = add(sched, "A", 4, max_new=8)
    b = add(sched, "B", 4, max_new=2)
    add(sched, "C", 1, max_new=1)
    step(sched)
    out, _ = step(sched)
    assert out.preempted_request_ids == ["B"]
    outs = run_to_end(sched)
    first_c = next(i for i, o in enumerate(outs) if "C" in o.request_ids)
    last_b = max(i for i, o in enumerate(outs) if "B" in o.request_ids)
    last_a = max(i for i, o in enumerate(outs) if "A" in o.request_ids)
    assert first_c > max(last_a, last_b)
    assert a.num_output_tokens == 8 and b.num_output_tokens == 2


def test_an_aborted_member_of_the_static_batch_ends_it_when_the_others_are_done():
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=4, batching="static")
    add(sched, "A", 4, max_new=2)
    add(sched, "B", 4, max_new=1)  # in the batch, but no budget left this step
    add(sched, "C", 2, max_new=1)
    assert layout(step(sched)[0]) == [("A", 4)]
    assert sched.finish_request("B")
    assert layout(step(sched)[0]) == [("A", 1)]  # C is not in the batch
    assert layout(step(sched)[0]) == [("C", 2)]


def test_the_policy_is_chosen_from_the_config_or_given():
    assert isinstance(make_scheduler().policy, ContinuousBatching)
    assert isinstance(make_scheduler(batching="static").policy, StaticBatching)

    class OnlyVip(BatchingPolicy):
        def may_join(self, request):
            return request.request_id.startswith("vip")

    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32, block_size=4, num_blocks=64)
    sched = Scheduler(config, clock=FakeClock(), policy=OnlyVip())
    add(sched, "vip-1", 2)
    add(sched, "guest", 2)
    add(sched, "vip-2", 2)
    assert layout(step(sched)[0]) == [("vip-1", 2)]  # admission stops at the first one held back


# --- stopping -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, token, status",
    [
        (dict(eos=2), 2, RequestStatus.FINISHED_EOS),
        (dict(eos=2, ignore_eos=True), 2, None),
        (dict(stop_token_ids=(5, 6)), 6, RequestStatus.FINISHED_STOP),
        (dict(max_new=1), 9, RequestStatus.FINISHED_LENGTH),
        (dict(), 9, None),
    ],
)
def test_finish_conditions(params, token, status):
    sched = make_scheduler()
    request = add(sched, "A", 3, **{"max_new": 4, **params})
    _, deltas = step(sched, token=token)
    assert request.output_token_ids == [token]
    if status is None:
        assert request.status is RequestStatus.RUNNING and not deltas[0].finished
    else:
        assert request.status is status and deltas[0].finished
        assert deltas[0].finish_reason is status.finish_reason
        assert request.block_table == [] and not sched.has_unfinished()


def test_max_model_len_finishes_with_length():
    sched = make_scheduler(max_model_len=8)
    request = add(sched, "A", 6, max_new=10)
    step(sched)
    _, deltas = step(sched)
    assert request.num_tokens == 8 and deltas[0].finish_reason is FinishReason.LENGTH


# --- prefix caching -----------------------------------------------------------------------
def test_prefix_hit_skips_the_cached_blocks():
    sched = make_scheduler(enable_prefix_caching=True)
    a = add(sched, "A", 10, first_token=0)
    step(sched)
    b = Request("B", list(range(8)) + [50, 51], SamplingParams(temperature=0), arrival_time=0.0)
    sched.add_request(b)
    out, _ = step(sched)
    assert layout(out) == [("A", 1), ("B", 2)]
    b_step = out.seq_steps[1]
    assert (b_step.token_ids, b_step.start_pos) == ([50, 51], 8)
    assert b_step.block_table[:2] == a.block_table[:2] and b.num_cached_prompt_tokens == 8


def test_requests_admitted_in_one_step_do_not_share_unwritten_blocks():
    sched = make_scheduler(enable_prefix_caching=True)
    add(sched, "A", 10, first_token=0)
    add(sched, "B", 10, first_token=0)
    out, _ = step(sched)
    assert layout(out) == [("A", 10), ("B", 6)]
    assert not set(out.seq_steps[0].block_table) & set(out.seq_steps[1].block_table)


# --- bookkeeping --------------------------------------------------------------------------
def test_timestamps_follow_the_clock():
    sched = make_scheduler()
    sched.clock.now = 1.0
    request = add(sched, "A", 3, max_new=2)
    sched.clock.now = 2.0
    out = sched.schedule()
    sched.clock.now = 3.0
    sched.update_from_output(out, [7])
    sched.clock.now = 4.0
    step(sched)
    assert (
        request.arrival_time,
        request.first_scheduled_time,
        request.first_token_time,
        request.last_token_time,
        request.finished_time,
    ) == (1.0, 2.0, 3.0, 4.0, 4.0)


def test_update_checks_its_input():
    sched = make_scheduler()
    add(sched, "A", 3)
    out = sched.schedule()
    with pytest.raises(ValueError, match="update_from_output got 2 values for the 1 rows of the plan"):
        sched.update_from_output(out, [1, 2])
    with pytest.raises(ValueError, match="no sampled token for request A"):
        sched.update_from_output(out, [None])


def test_duplicate_ids_and_illegal_transitions_are_refused():
    sched = make_scheduler()
    request = add(sched, "A", 3)
    with pytest.raises(ValueError, match="already in the scheduler"):
        add(sched, "A", 3)
    with pytest.raises(RuntimeError, match="illegal status change WAITING -> PREEMPTED"):
        request.set_status(RequestStatus.PREEMPTED)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(max_num_seqs=0), "max_num_seqs must be >= 1, got 0"),
        (dict(block_size=True), "block_size must be an int, got True"),
        (dict(batching="dynamic"), "batching must be one of ('continuous', 'static'), got 'dynamic'"),
        (dict(num_blocks=4, block_size=4, max_model_len=32), "num_blocks=4 (block_size=4) cannot hold one sequence"),
        (dict(max_num_batched_tokens=8, max_num_seqs=16), "max_num_batched_tokens=8 is below max_num_seqs=16"),
        (
            dict(enable_chunked_prefill=False, max_num_batched_tokens=64, max_model_len=128),
            "max_num_batched_tokens=64 is below max_model_len=128 with enable_chunked_prefill=False",
        ),
        (dict(max_prefill_tokens_per_step=100, max_num_batched_tokens=64), "exceeds max_num_batched_tokens=64"),
        (dict(max_prefills_per_decode_step=0), "max_prefills_per_decode_step must be >= 1, got 0; use None for no cap"),
        (dict(async_scheduling="yes"), "async_scheduling must be True or False, got 'yes'"),
    ],
)
def test_config_errors_name_field_value_and_fix(overrides, message):
    values = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, block_size=4, num_blocks=64)
    values.update(overrides)
    with pytest.raises(ValueError) as info:
        SchedulerConfig(**values)
    assert message in str(info.value)


# --- planning ahead (async scheduling) --------------------------------------------------------
def test_a_step_in_flight_is_taken_as_done_and_its_real_tokens_replace_the_placeholders():
    sched = make_scheduler(max_num_seqs=2, enable_prefix_caching=True)
    a = add(sched, "a", 5, max_new=3)
    b = add(sched, "b", 6, max_new=10, first_token=200)
    add(sched, "c", 2, first_token=300)
    plan = sched.schedule()
    assert layout(plan) == [("a", 5), ("b", 6)]
    assert sched.reserve_decode_steps(plan, 4) == 4  # the batch is full: the prompts ride in a round of 4
    free_before = sched.block_manager.num_free_blocks
    sched.advance_in_flight(plan, 4)
    # a reaches max_new_tokens within the round: out of the batch, blocks freed, not finished yet
    assert a.status is RequestStatus.RUNNING and a not in sched.running and a.block_table == []
    assert sched.block_manager.num_free_blocks > free_before
    assert b.output_token_ids == [-1] * 4 and b.num_computed_tokens == 9 and b.num_tokens_to_compute == 1
    assert sched.fits_without_preemption()
    following = sched.schedule()  # c takes a's slot; b continues from its last placeholder
    assert layout(following) == [("b", 1), ("c", 2)]
    assert following.scheduled[0].seq_step.token_ids == [-1] and following.scheduled[0].seq_step.start_pos == 9
    deltas = sched.update_from_steps(plan, [[11, 12, 13, 14], [21, 22, 23, 24]])
    assert [(d.request_id, d.new_token_ids, d.finish_reason) for d in deltas] == [
        ("a", [11, 12, 13], FinishReason.LENGTH),
        ("b", [21, 22, 23, 24], None),
    ]
    assert a.finished and "a" not in sched.requests
    assert b.output_token_ids == [21, 22, 23, 24] and b.num_computed_tokens == 9
    # shareable: a's full prompt block (when it left the batch) and b's two full blocks, with its real tokens
    assert sched.block_manager.num_cached_blocks == 1 + 2
    twin = Request("twin", list(b.all_token_ids), SamplingParams(), arrival_time=0.0)
    assert sched.block_manager.get_computed_blocks(twin) == (b.block_table[:2], 8)


@pytest.mark.parametrize("max_new", [20, 2], ids=["with-placeholders", "leaving-the-batch"])
def test_abort_while_the_step_is_in_flight_takes_back_placeholders_and_frees_blocks(max_new):
    sched = make_scheduler(max_num_seqs=1)
    a = add(sched, "a", 3, max_new=max_new)
    plan = sched.schedule()
    assert sched.reserve_decode_steps(plan, 4) == 4
    sched.advance_in_flight(plan, 4)
    assert (a in sched.running) == (max_new > 4)
    assert a.output_token_ids == ([-1] * 4 if max_new > 4 else [])
    assert sched.finish_request("a")
    assert a.output_token_ids == [] and a.status is RequestStatus.FINISHED_ABORTED and not sched.has_unfinished()
    assert sched.update_from_steps(plan, [[1, 2, 3, 4]]) == []
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_usable_blocks
