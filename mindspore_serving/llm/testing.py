"""A fake model runner that really goes through the paged KV cache, for tests and scheduler benchmarks.

`FakeModelRunner` keeps a cache of token ids, shape [num_blocks, block_size] (one "key" per slot).
Each step it first writes every sequence's new tokens at their slots (as a real graph scatters keys
and values for the whole batch), then, for each sequence, reads the whole context back through the
block table and derives the logits from a hash of what it read. So a wrong block table, a missed
write, a block shared by mistake or a stale prefix block changes the next token, and the greedy
output of a request equals `reference_greedy` (the same runner on that request alone) only when the
engine gives the runner exactly the right cache.
"""

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from mindspore_serving.llm.model_io import (
    SCRATCH_BLOCK,
    MultiStepRunner,
    PromptScorer,
    SeqStep,
    StepLogits,
    StepResult,
    run_greedy_steps,
    split_logits,
)

_EMPTY = -1


class FakeModelRunner(MultiStepRunner, PromptScorer):
    """A MultiStepRunner with hash-derived logits read back from a paged token cache; a sequence with all_logits
    gets the logits of each of its positions, read back the same way (`StepLogits`)."""

    def __init__(
        self, num_blocks: int = 64, block_size: int = 4, max_seq_len: int = 128, vocab_size: int = 64, seed: int = 0
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size
        self.seed = seed
        self.cache = np.full((num_blocks, block_size), _EMPTY, dtype=np.int64)
        self.calls: list[list[SeqStep]] = []
        """Every `run` call's sequences, for tests that assert on batches."""
        self.num_computed_tokens = 0
        """Tokens written to the cache, all steps together."""
        self.fail_next: Exception | None = None
        """Set to make the next `run` raise it (tests of the error path)."""

    def run_greedy(self, seqs: list[SeqStep], num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Multi-step greedy decoding through `run` (see model_io.run_greedy_steps)."""
        return run_greedy_steps(self, seqs, num_steps)

    def score_refusal(self) -> str | None:
        return None

    def run(self, seqs: list[SeqStep]) -> StepResult:
        self.calls.append(seqs)
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        for seq in seqs:
            self._check(seq)
        for seq in seqs:  # write first, for the whole batch, like a graph's scatter into the caches
            for i, token in enumerate(seq.token_ids):
                block, offset = self._slot(seq.block_table, seq.start_pos + i)
                self.cache[block, offset] = token
            self.num_computed_tokens += len(seq.token_ids)
        logits = np.empty((len(seqs), self.vocab_size), dtype=np.float32)
        every = {}
        for row, seq in enumerate(seqs):
            positions = np.arange(seq.context_len)
            blocks = np.asarray(seq.block_table, dtype=np.int64)[positions // self.block_size]
            context = self.cache[blocks, positions % self.block_size]
            logits[row] = self.logits_for(context)
            if seq.all_logits:
                every[row] = np.stack(
                    [self.logits_for(context[:end]) for end in range(seq.start_pos + 1, seq.context_len + 1)]
                )
        return StepLogits(logits, every) if every else logits

    def logits_for(self, context: Sequence[int] | np.ndarray) -> np.ndarray:
        """Logits after the token sequence `context` (the cache read back); a pure function of it."""
        digest = hashlib.blake2b(
            np.asarray(context, dtype=np.int64).tobytes(), digest_size=8, key=self.seed.to_bytes(8, "little")
        ).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        return (rng.standard_normal(self.vocab_size) * 3.0).astype(np.float32)

    def _slot(self, block_table: Sequence[int], position: int) -> tuple[int, int]:
        return block_table[position // self.block_size], position % self.block_size

    def _check(self, seq: SeqStep) -> None:
        if not seq.token_ids:
            raise ValueError("a SeqStep must bring at least one token")
        if seq.start_pos < 0 or seq.context_len > self.max_seq_len:
            raise ValueError(f"positions [{seq.start_pos}, {seq.context_len}) outside max_seq_len {self.max_seq_len}")
        needed = -(-seq.context_len // self.block_size)
        if len(seq.block_table) < needed:
            raise ValueError(f"block table {seq.block_table} too short for {seq.context_len} tokens")
        for block in seq.block_table[:needed]:
            if block == SCRATCH_BLOCK or not 0 < block < self.num_blocks:
                raise ValueError(f"block table {seq.block_table} holds block {block}: not a usable block")
        tokens = np.asarray(seq.token_ids)
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise ValueError(f"token ids outside [0, {self.vocab_size})")


def reference_greedy(
    runner_factory: Callable[[], FakeModelRunner],
    prompt_token_ids: Sequence[int],
    max_new_tokens: int,
    eos_token_id: int | None = None,
    stop_token_ids: Sequence[int] = (),
) -> list[int]:
    """Greedy tokens of one request alone, without the scheduler: a fresh runner, a private block table
    (blocks 1, 2, ...), the whole prompt in one step, then one decode step per token."""
    runner = runner_factory()
    tokens = list(prompt_token_ids)
    table = list(range(1, runner.num_blocks))
    step = SeqStep(list(tokens), 0, table)
    output: list[int] = []
    while True:
        last, _ = split_logits(runner.run([step]))
        token = int(np.argmax(last[0]))
        output.append(token)
        if token == eos_token_id or token in stop_token_ids or len(output) >= max_new_tokens:
            return output
        step = SeqStep([token], len(tokens), table)
        tokens.append(token)
