"""Prompt logprobs (SamplingParams.prompt_logprobs): the log-probability of each prompt token given the tokens before
it, and the k most likely tokens at each prompt position, from the logits the model computes for the prompt.

How they are computed (lm-evaluation-harness scores multiple choice this way: echo, logprobs, max_tokens 0):

* the engine gives a scored request a `PromptScores` (Request.prompt_scores);
* the scheduler computes its whole prompt, whatever the prefix cache holds (a cached block's positions would
  have no logits), and asks the runner for every token's logits of each prompt chunk that holds a position
  before the prompt's last (`wants_logits` -> SeqStep.all_logits);
* the step executor hands those logits to `record_prompt_scores`, which keeps, for each position i >= 1,
  log_softmax(logits[i - 1])[token i] and the k most likely (token id, logprob), computed in float64 over the
  raw logits (no penalty, temperature or bias); a chunk of a prompt computed in pieces records its own
  positions, and a prompt computed again after a preemption writes the same values again;
* the engine puts them on the request's first output (RequestOutput.prompt_logprobs: None at position 0;
  prompt_top_logprobs: [] at position 0, and with k = 0).
"""

from collections.abc import Mapping, Sequence

import numpy as np

from mindspore_serving.llm.model_io import PromptScorer, StepResult, split_logits
from mindspore_serving.llm.sampler import log_softmax, top_candidates

TopLogprobs = list[tuple[int, float]]
_ROWS_AT_ONCE = 32  # positions whose float64 log-softmax is held at once (a large vocabulary: ~40 MB)


class PromptScores:
    """The prompt logprobs of one request, filled position by position as its prompt chunks are computed."""

    def __init__(self, prompt_token_ids: Sequence[int], num_top: int) -> None:
        self.token_ids = np.asarray(prompt_token_ids, dtype=np.int64)
        self.num_top = int(num_top)
        n = len(self.token_ids)
        self._logprobs = np.zeros(n, np.float64)
        self._top: list[TopLogprobs] = [[] for _ in range(n)]
        self._done = np.zeros(n, bool)
        self._done[0] = True  # the first token has no score

    @property
    def complete(self) -> bool:
        """Every position is scored."""
        return bool(self._done.all())

    def wants_logits(self, start_pos: int, num_tokens: int) -> bool:
        """Whether the logits of tokens [start_pos, start_pos + num_tokens) score a prompt position (those of
        position p score token p + 1), not scored yet."""
        end = min(start_pos + num_tokens + 1, len(self.token_ids))
        return start_pos + 1 < end and not self._done[start_pos + 1 : end].all()

    def record(self, start_pos: int, logits: np.ndarray) -> None:
        """Scores the prompt tokens after positions start_pos... from their logits [num_tokens, vocab]."""
        count = min(len(logits), len(self.token_ids) - 1 - start_pos)
        for begin in range(0, max(count, 0), _ROWS_AT_ONCE):
            end = min(begin + _ROWS_AT_ONCE, count)
            rows = log_softmax(logits[begin:end])
            targets = self.token_ids[start_pos + begin + 1 : start_pos + end + 1]
            positions = slice(start_pos + begin + 1, start_pos + end + 1)
            self._logprobs[positions] = rows[np.arange(end - begin), targets]
            self._done[positions] = True
            if self.num_top:
                for j, row in enumerate(rows):
                    self._top[start_pos + begin + 1 + j] = top_logprobs(row, self.num_top)

    def logprobs(self) -> list[float | None]:
        """log P(token i | tokens before it) per prompt position, None for the first (and any not scored)."""
        return [float(v) if done and i else None for i, (v, done) in enumerate(zip(self._logprobs, self._done))]

    def top_logprobs(self) -> list[TopLogprobs]:
        """The `num_top` most likely (token id, logprob) per prompt position, most likely first ([] at 0)."""
        return [list(top) for top in self._top]


def top_logprobs(row: np.ndarray, k: int) -> TopLogprobs:
    """The k largest entries of a 1-D row as (id, value), largest first, ties by lowest id (the sampler's ranking)."""
    return [(int(t), float(row[t])) for t in top_candidates(row, k)]


def score_refusal(runner: object) -> str | None:
    """None when `runner` returns every token's logits of the sequences that ask (model_io.PromptScorer); else
    why requests for prompt logprobs are refused."""
    if isinstance(runner, PromptScorer):
        return runner.score_refusal()
    return f"its model runner ({type(runner).__name__}) does not return the logits of every prompt position"


def record_prompt_scores(rows: Sequence, result: StepResult, requests: Mapping) -> np.ndarray:
    """Records the every-token logits a runner returned (`StepLogits.every`, by row of the plan) into the prompt
    scores of their requests (`rows[i].request_id` in `requests`; a request gone since is skipped); returns the
    last-token logits [len(rows), vocab] that are sampled."""
    logits, every = split_logits(result)
    for i, values in every.items():
        request = requests.get(rows[i].request_id)
        scores = getattr(request, "prompt_scores", None)
        if scores is not None:
            scores.record(rows[i].seq_step.start_pos, np.asarray(values))
    return logits
