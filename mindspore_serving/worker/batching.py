"""Batch boundaries, merging and splitting, shared by model and Python stages: `collect_batch` blocks on the
stage's queue to gather a batch; merging and splitting are pure functions.

A batch closes when it is full, when nothing more is expected (no fixed wait for a lone
request), or when the batch wait expires while more instances are still on their way.
"""

import queue
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

SENTINEL = object()  # ends a batch loop
WAKE = object()  # re-evaluates whether more instances are expected


def collect_batch(
    source: "queue.Queue", max_size: int, max_wait: float, more_expected: Callable[[], bool] = lambda: False
) -> list | None:
    """Takes up to `max_size` items from `source`; returns None when the sentinel arrives first.

    Blocks for the first item, then takes whatever is queued. When the batch is not full it waits
    (at most `max_wait` seconds after the first item) only while `more_expected()` says that more
    items are on their way.
    """
    items: list = []
    while not items:
        first = source.get()
        if first is SENTINEL:
            return None
        if first is not WAKE:
            items.append(first)
    deadline = time.monotonic() + max_wait
    while len(items) < max_size:
        try:
            item = source.get_nowait()
        except queue.Empty:
            if not more_expected():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                item = source.get(timeout=remaining)
            except queue.Empty:
                break
        if item is SENTINEL:
            source.put(SENTINEL)  # keep it for the next call so the loop ends after this batch
            break
        if item is not WAKE:
            items.append(item)
    return items


class ExpectedCounter:
    """Counts instances announced to a batch queue that have not reached it yet."""

    def __init__(self, source: "queue.Queue"):
        self._source = source
        self._count = 0
        self._lock = threading.Lock()

    def announce(self, count: int):
        with self._lock:
            self._count += count

    def arrived(self, count: int = 1):
        with self._lock:
            self._count = max(0, self._count - count)

    def retract(self, count: int = 1):
        """Announced instances that will never arrive (they failed on the way)."""
        self.arrived(count)
        self._source.put(WAKE)

    def __call__(self) -> bool:
        return self._count > 0


def merge_inputs(
    instances: Sequence[Sequence[np.ndarray]], batch_size: int, no_batch_inputs: Sequence[int] = ()
) -> list[np.ndarray]:
    """Stacks per-instance inputs along a new first dimension of `batch_size`.

    Empty slots are padded with copies of instance 0; inputs without a batch dimension are taken
    from instance 0 alone.
    """
    if not instances:
        raise ValueError("Input instances count is 0")
    if len(instances) > batch_size:
        raise ValueError(f"Instances count {len(instances)} exceeds batch size {batch_size}")
    merged = []
    for index in range(len(instances[0])):
        if index in no_batch_inputs:
            merged.append(np.asarray(instances[0][index], order="C"))
            continue
        first = np.asarray(instances[0][index])
        batch = np.empty((batch_size,) + first.shape, dtype=first.dtype)
        for slot in range(batch_size):
            source = instances[slot][index] if slot < len(instances) else first
            batch[slot] = source
        merged.append(batch)
    return merged


def split_outputs(outputs: Sequence[np.ndarray], count: int) -> list[tuple]:
    """Splits batched outputs (checked: ModelExecutor's run) along dimension 0 into `count` per-instance output
    tuples."""
    return [tuple(np.asarray(output[slot], order="C") for output in outputs) for slot in range(count)]
