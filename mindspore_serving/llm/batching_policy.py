"""Batching policies: which waiting requests may join the running batch (SchedulerConfig.batching).

The scheduler asks its policy before admitting each waiting request, in FCFS order, and stops at the first one
the policy holds back; budgets, blocks and max_num_seqs are the scheduler's own checks, the same under every
policy. `make_batching_policy` picks the policy once, when the scheduler is built.
"""

import itertools
from collections import deque
from collections.abc import Sequence

from mindspore_serving.llm.config import CONTINUOUS, STATIC, SchedulerConfig
from mindspore_serving.llm.request import Request


class BatchingPolicy:
    """Admission rule of a scheduler; it sees the queues at each admission phase and every finished request."""

    def open_admission(self, waiting: deque[Request], num_running: int) -> None:
        """Called once per step, before the waiting requests are considered."""

    def may_join(self, request: Request) -> bool:
        raise NotImplementedError

    def forget(self, request_id: str) -> None:
        """The request has finished (or was aborted)."""

    def add_choices(self, parent: Request, children: Sequence[Request]) -> None:
        """`parent` forked into `children` (its other choices, llm/choices.py), which run from now on."""


class ContinuousBatching(BatchingPolicy):
    """Requests join and leave between any two steps: every waiting request may join."""

    def may_join(self, request: Request) -> bool:
        return True


class StaticBatching(BatchingPolicy):
    """When nothing runs, the first max_num_seqs waiting requests become the batch; only they join (over several
    steps if the budget requires) until every one of them has finished."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.batch: set[str] = set()

    def open_admission(self, waiting: deque[Request], num_running: int) -> None:
        if not self.batch and not num_running:
            self.batch = {r.request_id for r in itertools.islice(waiting, self.max_num_seqs)}

    def may_join(self, request: Request) -> bool:
        return request.request_id in self.batch

    def forget(self, request_id: str) -> None:
        self.batch.discard(request_id)

    def add_choices(self, parent: Request, children: Sequence[Request]) -> None:
        # the batch lasts until every choice of its requests has finished (a preempted one may join again)
        if parent.request_id in self.batch:
            self.batch.update(c.request_id for c in children)


def make_batching_policy(config: SchedulerConfig) -> BatchingPolicy:
    if config.batching == STATIC:
        return StaticBatching(config.max_num_seqs)
    if config.batching == CONTINUOUS:
        return ContinuousBatching()
    raise ValueError(f"no batching policy {config.batching!r}")
