"""In-process stand-ins for an agent, for the engine's tests: steps are computed only when collected."""

from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from mindspore_serving.agent.steps import run_submitted
from mindspore_serving.llm.model_io import SeqStep, StepSubmitter
from mindspore_serving.llm.testing import FakeModelRunner


class DeferredSubmitter(StepSubmitter):
    """`submit` (model_io) for a runner that has none, computing a submitted step only when a result is asked
    for (then every step submitted before it runs first, in order), as a runner that is still computing it:
    async scheduling's tests see what the engine does while a step is in flight. `submissions` records
    (seqs, greedy_steps, prev_rows, steps submitted and not yet run), and `logits_rows` each step's logits rows
    (a mixed step's, model_io; () for the others)."""

    mixed_steps = True

    def __init__(self, runner):
        self.runner = runner
        self._last_tokens: np.ndarray | None = None
        self._queue: list[tuple[Future, list, int, Sequence[int], Sequence[int]]] = []
        self.submissions: list[tuple[list[SeqStep], int, list[int], int]] = []
        self.logits_rows: list[tuple[int, ...]] = []

    def submit(self, seqs, greedy_steps=0, prev_rows=(), logits_rows=()):
        self.submissions.append((list(seqs), greedy_steps, list(prev_rows), len(self._queue)))
        self.logits_rows.append(tuple(logits_rows))
        future = _DeferredFuture(self)
        self._queue.append((future, list(seqs), greedy_steps, prev_rows, logits_rows))
        return future

    def run_until(self, future: Future) -> None:
        while not future.done():
            queued, seqs, greedy_steps, prev_rows, logits_rows = self._queue.pop(0)
            last, self._last_tokens = self._last_tokens, None  # a failing step leaves nothing to continue from
            try:
                result, self._last_tokens = run_submitted(self.runner, seqs, greedy_steps, prev_rows, last, logits_rows)
            except Exception as err:  # pylint: disable=broad-except
                queued.set_exception(err)
            else:
                queued.set_result(result)


class _DeferredFuture(Future):
    def __init__(self, submitter: DeferredSubmitter):
        super().__init__()
        self._submitter = submitter

    def result(self, timeout=None):
        self._submitter.run_until(self)
        return super().result(timeout)


class AheadRunner(FakeModelRunner, StepSubmitter):
    """The fake runner taking steps ahead (async scheduling): they run only when their result is collected."""

    mixed_steps = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.deferred = DeferredSubmitter(self)

    def submit(self, seqs, greedy_steps=0, prev_rows=(), logits_rows=()):
        return self.deferred.submit(seqs, greedy_steps, prev_rows, logits_rows)


class Ahead:
    """Any runner taking steps ahead, as the agents do for async scheduling: a submitted step runs only when its
    result is collected, after the engine has planned and submitted the next one. `mixed_steps`: it runs mixed
    steps too (model_io), as the agents do."""

    def __init__(self, runner, mixed_steps=False):
        self.runner = runner
        self.deferred = DeferredSubmitter(runner)
        self.mixed_steps = mixed_steps

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def submit(self, seqs, greedy_steps=0, prev_rows=(), logits_rows=()):
        return self.deferred.submit(seqs, greedy_steps, prev_rows, logits_rows)
