"""The contract between the LLM engine (scheduler) and whatever runs the model (agents, graph runner, fakes).

One engine step asks the runner to compute a list of sequences. Each sequence brings the tokens to
compute now (a whole prompt, a prompt chunk, or one decode token), the position of the first of them,
and its block table. The runner writes their keys/values into the paged KV cache (slot =
block_table[pos // block_size] * block_size + pos % block_size), attends over every cached position
<= the token's own, and returns the logits of the last computed token of each sequence.

A sequence may ask for the logits of every token it computes (`SeqStep.all_logits`: a prompt chunk whose prompt
logprobs are wanted, or a decode row verifying proposed tokens: its last token then the proposal, speculative
decoding); `run` then returns a `StepLogits`, those beside the usual last-token logits. Only a runner that declares
it (`PromptScorer`, `score_refusal()` None; or, for verifying rows, one whose `spec_tokens` covers the proposals)
gets such sequences, and never in a greedy round; in a mixed step only verifying rows have it
(see below).

Physical block 0 is reserved as a scratch block: padding writes there, and the block manager never
hands it out.

What a runner can do beyond `run` it declares by the protocols it implements (the engine chooses its step
executor from them once, at start-up; see step_executor.py):

* `ModelRunner`: runs one step (every runner).
* `PromptScorer`: says whether `run` honours `SeqStep.all_logits` (prompt logprobs), and if not, why.
* `MultiStepRunner`: also runs a greedy multi-step round itself (`run_greedy`, the meaning of run_greedy_steps).
* `StepSubmitter`: computes apart from the engine (the agents): `submit(seqs, greedy_steps, prev_rows)` returns at
  once an object whose `result()` is the step's logits (greedy_steps 0) or, as `run_greedy` gives them, its
  tokens and logprobs (SchedulerConfig.async_scheduling). It computes submitted steps in submission order, and a
  one-token row whose token is PLACEHOLDER takes, as `prev_rows` names it, the last token chosen for that row of
  the step submitted just before (a greedy step).
  One that says so (`submits_mixed_steps`) also runs a *mixed* step, `submit(seqs, 1, prev_rows, logits_rows)` with
  `logits_rows` non-empty or some row verifying proposed tokens (`is_mixed_step`): one step whose `result()` is a
  `MixedStep`, the greedy token and logprob of every row (as a one-step greedy round gives them) plus the logits of
  the rows in `logits_rows` only, which the engine samples itself (a grammar, a temperature...) while the runner
  chooses the other rows' tokens: only those rows' logits cross to the engine. Its last tokens (for a following
  step's placeholders) are the greedy ones. The `all_logits` rows of a mixed step are rows verifying proposed
  tokens (speculative decoding, never prompt chunks): one in `logits_rows` gets every position's logits
  (`MixedStep.every`), any other the greedy token and logprob at every position (`MixedStep.verified`), which
  is all a greedy row's verification needs.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from mindspore_serving.llm.sampler import greedy_with_logprobs

SCRATCH_BLOCK = 0
PLACEHOLDER = -1
"""The token of a decode row that continues from a token the runner has not returned yet."""


@dataclass
class SeqStep:
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    seq_id: int = -1
    """The engine's id of the sequence (-1: none): a runner across processes sends its table once, then the
    blocks appended to it."""
    all_logits: bool = False
    """Return the logits of every token computed (`StepLogits.every`), not only of the last."""

    @property
    def query_len(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Tokens in the cache once this step has written its own."""
        return self.start_pos + len(self.token_ids)


@dataclass
class StepLogits:
    """What `run` returns when some sequence asks for the logits of every token it computes."""

    last: np.ndarray
    """float32 [len(seqs), vocab]: what `run` returns otherwise (each sequence's last token's logits)."""
    every: dict[int, np.ndarray]
    """For each sequence index with `all_logits`: float32 [query_len, vocab], the logits of each token computed
    (row j: position start_pos + j)."""


StepResult = np.ndarray | StepLogits


class MixedStep(NamedTuple):
    """What a mixed step (`StepSubmitter.submit` with `logits_rows`) returns."""

    tokens: np.ndarray
    """int64 [len(seqs), 1]: each row's greedy token (greedy_with_logprobs of its last token's logits)."""
    logprobs: np.ndarray
    """float32 [len(seqs), 1]: the log-probability of that token."""
    logits: np.ndarray
    """float32 [len(logits_rows), vocab]: the last token's logits of the rows in `logits_rows`, in that order."""
    verified: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    """For each `all_logits` row not in `logits_rows`: (int64 [query_len], float32 [query_len]) the greedy token and
    its logprob at each position."""
    every: dict[int, np.ndarray] = {}
    """For each `all_logits` row in `logits_rows`: float32 [query_len, vocab], every position's logits."""


def is_mixed_step(greedy_steps: int, logits_rows: Sequence[int], verifying: bool) -> bool:
    """Whether a submitted step is a mixed step (see the module docstring): it names logits rows, or it is one
    greedy step whose rows include some verifying proposed tokens (`verifying`: some row has `all_logits`)."""
    return bool(len(logits_rows)) or (greedy_steps == 1 and verifying)


def mixed_step_result(result: "StepResult", logits_rows: Sequence[int]) -> "MixedStep":
    """The MixedStep of what `run` returned for a mixed step's rows (see the module docstring)."""
    last, every = split_logits(result)
    last = np.asarray(last, dtype=np.float32)
    rows = set(int(i) for i in logits_rows)
    tokens, logprobs = greedy_with_logprobs(last)
    verified, every_logits = {}, {}
    for i, values in every.items():
        if i in rows:
            every_logits[i] = np.asarray(values, np.float32)
        else:
            row_tokens, row_logprobs = greedy_with_logprobs(values)
            verified[i] = (row_tokens.astype(np.int64), row_logprobs.astype(np.float32))
    return MixedStep(
        tokens.astype(np.int64)[:, None],
        logprobs.astype(np.float32)[:, None],
        last[np.asarray(logits_rows, dtype=np.int64)],
        verified,
        every_logits,
    )


def split_logits(result: StepResult) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """(the last-token logits, every-token logits by sequence index) of what `run` returned."""
    if isinstance(result, StepLogits):
        return result.last, result.every
    return result, {}


class ModelRunner(Protocol):
    """Runs one step at a time over its paged KV cache of this geometry."""

    block_size: int
    num_blocks: int
    max_seq_len: int
    vocab_size: int

    def run(self, seqs: list[SeqStep]) -> StepResult:
        """Logits [len(seqs), vocab_size] (float32) of the last token of each sequence (a `StepLogits` when a
        sequence asks for all its logits, see `PromptScorer`)."""
        ...


@runtime_checkable
class PromptScorer(Protocol):
    """A runner whose `run` may honour `SeqStep.all_logits` (the engine's prompt logprobs)."""

    def score_refusal(self) -> str | None:
        """None when `run` returns every token's logits for sequences with `all_logits`; else why it cannot
        (the engine refuses requests for prompt logprobs with this reason)."""
        ...


@runtime_checkable
class MultiStepRunner(ModelRunner, Protocol):
    """Also runs a greedy multi-step round in one call (SchedulerConfig.num_scheduler_steps)."""

    def run_greedy(self, seqs: list[SeqStep], num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """What run_greedy_steps(self, seqs, num_steps) returns, computed however the runner likes."""
        ...


@runtime_checkable
class StepSubmitter(Protocol):
    """Computes submitted steps apart from the engine, in submission order (SchedulerConfig.async_scheduling).

    NOTE: `submit` is its only member, so that a wrapper adding `submit` to a runner it forwards to counts."""

    def submit(self, seqs: Sequence[SeqStep], greedy_steps: int = 0, prev_rows: Sequence[int] = ()) -> Any:
        """Returns at once; `.result()` is what `run` (greedy_steps 0) or `run_greedy` would return (a
        MixedStep for a mixed step, when the submitter runs them: `submits_mixed_steps`)."""
        ...


def submits_mixed_steps(runner: Any) -> bool:
    """Whether `runner` is a StepSubmitter whose `submit` also takes `logits_rows` (a mixed step, see above): one
    that says so with a true class attribute `mixed_steps`. Others (fakes, wrappers) keep the engine sampling
    every row of a step it samples any row of."""
    return isinstance(runner, StepSubmitter) and getattr(runner, "mixed_steps", False) is True


def run_greedy_steps(runner: ModelRunner, seqs: Sequence[SeqStep], num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Multi-step greedy decoding over `runner.run`: the first step computes `seqs` as they are (decode rows, or
    whole prompts), each next one every row's argmax of the step before, at the row's next position; the rows'
    blocks already hold every position of the round. Returns the chosen tokens int64 [n, num_steps] and their
    log-probabilities float32 [n, num_steps] (as the sampler computes them for greedy rows).

    A MultiStepRunner's `run_greedy(seqs, num_steps)` has this meaning (an agent does the loop itself, saving a
    round trip per step); this function is how runners without a faster way provide it."""
    tokens = np.zeros((len(seqs), num_steps), np.int64)
    logprobs = np.zeros((len(seqs), num_steps), np.float32)
    step_seqs = list(seqs)
    for step in range(num_steps):
        last, _ = split_logits(runner.run(step_seqs))
        tokens[:, step], logprobs[:, step] = greedy_with_logprobs(last)
        step_seqs = [
            SeqStep([int(token)], seq.context_len + step, seq.block_table) for token, seq in zip(tokens[:, step], seqs)
        ]
    return tokens, logprobs
