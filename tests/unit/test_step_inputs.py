"""How a step's sequences become graph calls and their inputs (agent/step_inputs.py): pure numpy, no MindSpore."""

import numpy as np
import pytest

from mindspore_serving.agent.step_inputs import (
    EVERY_LOGITS,
    LAST_LOGITS,
    NO_LOGITS,
    call_inputs,
    plan_calls,
    slots_of,
)
from mindspore_serving.llm.model_io import SeqStep

BLOCK = 4


def test_slots_follow_the_block_table():
    assert slots_of([5, 2, 9], 2, 7, BLOCK).tolist() == [22, 23, 8, 9, 10]


def test_decode_rows_first_then_prompts_packed_and_cut_at_the_call_size():
    seqs = [
        SeqStep([1, 2, 3, 4, 5], 0, [1, 2]),
        SeqStep([7], 9, [3, 4, 5]),
        SeqStep([8, 9, 10], 2, [6], all_logits=True),
        SeqStep([11], 0, [7]),
    ]
    calls = plan_calls(seqs, 4)
    assert [[(p.row, list(p.tokens), p.start_pos, p.logits, p.offset) for p in call] for call in calls] == [
        [(1, [7], 9, LAST_LOGITS, 0), (3, [11], 0, LAST_LOGITS, 0), (0, [1, 2], 0, NO_LOGITS, 0)],
        [(0, [3, 4, 5], 2, LAST_LOGITS, 2), (2, [8], 2, EVERY_LOGITS, 0)],
        [(2, [9, 10], 3, EVERY_LOGITS, 1)],
    ]


def test_call_inputs_lay_out_both_groups_and_the_logits_wanted():
    pieces = plan_calls(
        [SeqStep([5, 6, 7], 1, [2, 3]), SeqStep([9], 5, [4, 6]), SeqStep([1, 2], 0, [8], all_logits=True)], 16
    )[0]
    inputs = call_inputs(pieces, BLOCK, context_align=4)
    assert inputs.input_ids.tolist() == [9, 5, 6, 7, 1, 2]
    assert inputs.positions.tolist() == [5, 1, 2, 3, 0, 1]
    assert inputs.slot_mapping.tolist() == [25, 9, 10, 11, 32, 33]
    assert inputs.decode_slots.tolist() == [[16, 17, 18, 19, 24, 25, 0, 0]]  # 6 positions, aligned to 8
    assert inputs.chunk_index.tolist() == [[1, 2, 3], [4, 5, 5]]  # the short row repeats its last token
    assert inputs.chunk_scatter.tolist() == [0, 1, 2, 3, 4]
    assert inputs.chunk_slots.tolist() == [[8, 9, 10, 11], [32, 33, 0, 0]]
    assert inputs.logits_index.tolist() == [0, 3, 4, 5]  # the decode row, the prompt's last, every scored one
    assert [(p.row, first) for p, first in inputs.outputs] == [(1, 0), (0, 1), (2, 2)]
    assert inputs.mixed and all(a.dtype == np.int32 for a in (inputs.input_ids, inputs.chunk_slots))


def test_a_call_of_one_kind_of_row_adds_no_token_and_placeholders_for_the_other_group():
    decode = call_inputs(plan_calls([SeqStep([3], 5, [1, 2]), SeqStep([4], 0, [3])], 8)[0], BLOCK)
    assert decode.kind == "decode" and not decode.mixed and decode.input_ids.tolist() == [3, 4]
    assert decode.chunk_index.tolist() == [[0]] and decode.chunk_slots.tolist() == [[0]]
    assert decode.logits_index.tolist() == [0, 1]
    chunk = call_inputs(plan_calls([SeqStep([3, 4, 5], 0, [1])], 8)[0], BLOCK)
    assert chunk.kind == "chunk" and chunk.input_ids.tolist() == [3, 4, 5] and chunk.decode_slots.tolist() == [[0]]
    assert chunk.chunk_scatter.tolist() == [0, 1, 2] and chunk.logits_index.tolist() == [2]


def test_short_rows_do_not_pad_to_a_long_one_past_twice_the_call_size():
    """A 30-token chunk and ten 2-token prompts at max_tokens 32: the long row's call takes one short row (two rows
    pad to 60 <= 2 * 32 query tokens, three would not fit the room); the others share the next call."""
    seqs = [SeqStep([1] * 30, 0, [1, 2, 3, 4, 5, 6, 7, 8])] + [SeqStep([2, 3], 0, [9 + i]) for i in range(10)]
    calls = plan_calls(seqs, 32)
    assert [[p.row for p in call] for call in calls] == [[0, 1], list(range(2, 11))]
    seqs = [SeqStep([1] * 20, 0, [1, 2, 3])] + [SeqStep([2, 3], 0, [9 + i]) for i in range(10)]
    calls = plan_calls(seqs, 32)  # 4 rows pad to 80 > 64: the fourth goes to the next call
    assert [[p.row for p in call] for call in calls] == [[0, 1, 2], list(range(3, 11))]
    for call in calls:
        rows = [len(p.tokens) for p in call]
        assert sum(rows) <= 32 and len(rows) * max(rows) <= 64


def test_rows_without_tokens_are_refused():
    with pytest.raises(ValueError, match="seqs\\[1\\] has no tokens"):
        plan_calls([SeqStep([1], 0, [1]), SeqStep([], 0, [2])], 8)
