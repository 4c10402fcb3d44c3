"""How an agent computes a submitted step (model_io: steps in submission order, placeholder rows continued
from the step submitted before): used by the agent's servicer and by `agent.testing.DeferredSubmitter`, its
in-process stand-in."""

from collections.abc import Sequence

import numpy as np

from mindspore_serving.llm.model_io import PLACEHOLDER, MultiStepRunner, SeqStep, is_mixed_step, mixed_step_result


def fill_placeholders(
    seqs: Sequence[SeqStep], prev_rows: Sequence[int], last_tokens: np.ndarray | None
) -> list[SeqStep]:
    """`seqs` with each PLACEHOLDER token replaced by `last_tokens[prev_rows[i]]` (the last tokens the previous
    greedy step chose, one per row; None when there was none). Raises ValueError when a placeholder cannot be
    filled."""
    if not len(prev_rows):
        return list(seqs)
    if len(prev_rows) != len(seqs):
        raise ValueError(f"{len(prev_rows)} prev_rows for {len(seqs)} sequences")
    filled = []
    for i, (seq, row) in enumerate(zip(seqs, prev_rows)):
        if row < 0:
            filled.append(seq)
            continue
        if last_tokens is None:
            raise ValueError(
                f"sequence {i} continues row {row} of the previous step, which chose no tokens "
                f"(it was not a greedy step, or it failed)"
            )
        if seq.token_ids != [PLACEHOLDER] or row >= len(last_tokens):
            raise ValueError(
                f"sequence {i} (tokens {seq.token_ids[:4]}) cannot continue row {row} of a previous "
                f"step of {len(last_tokens)} rows; only one-token placeholder rows can"
            )
        filled.append(SeqStep([int(last_tokens[row])], seq.start_pos, seq.block_table, seq.seq_id))
    return filled


def run_submitted(
    runner: MultiStepRunner,
    seqs: Sequence[SeqStep],
    greedy_steps: int,
    prev_rows: Sequence[int],
    last_tokens: np.ndarray | None,
    logits_rows: Sequence[int] = (),
):
    """Computes one submitted step (see `submit` above) on a runner of this process: its placeholders filled from
    `last_tokens` (those of the step before); a mixed step (`logits_rows`) returns a MixedStep. Returns (its
    result, its last chosen token per row, for the step after it; None when it did not choose tokens)."""
    seqs = fill_placeholders(seqs, prev_rows, last_tokens)
    if is_mixed_step(greedy_steps, logits_rows, any(seq.all_logits for seq in seqs)):
        return run_mixed(runner, seqs, greedy_steps, logits_rows)
    if not greedy_steps:
        return runner.run(list(seqs)), None
    result = runner.run_greedy(seqs, greedy_steps)
    return result, np.asarray(result[0])[:, -1]


def run_mixed(runner: MultiStepRunner, seqs: Sequence[SeqStep], greedy_steps: int, logits_rows: Sequence[int]):
    """A mixed step (model_io): one step, every row's greedy token and logprob (as a greedy step chooses them),
    the logits of `logits_rows`, and what the rows verifying proposed tokens (all_logits) need: every position's
    logits for those in `logits_rows`, the greedy token and logprob at every position for the others. Returns (the
    MixedStep, its greedy tokens)."""
    if greedy_steps != 1:
        raise ValueError(f"a mixed step (logits_rows) is one step, not {greedy_steps}")
    rows = np.asarray(logits_rows, dtype=np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(seqs)):
        raise ValueError(f"logits_rows {list(logits_rows)[:8]} name rows outside the step's {len(seqs)}")
    step = mixed_step_result(runner.run(list(seqs)), logits_rows)
    return step, step.tokens[:, 0]
