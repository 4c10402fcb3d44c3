"""Batch boundaries, merge, pad and split as pure functions driven from a queue."""

import queue

import numpy as np
import pytest

from mindspore_serving.worker.batching import (
    SENTINEL,
    WAKE,
    ExpectedCounter,
    collect_batch,
    merge_inputs,
    split_outputs,
)
from mindspore_serving.worker.executors import run_batch_function


def fill(items):
    source = queue.Queue()
    for item in items:
        source.put(item)
    return source


def test_batches_close_when_full_and_loop_ends_at_sentinel():
    source = fill([1, 2, 3, 4, 5, SENTINEL])
    batches = []
    while (batch := collect_batch(source, 2, max_wait=10.0)) is not None:
        batches.append(batch)
    assert batches == [[1, 2], [3, 4], [5]]


def test_lone_request_is_not_kept_waiting():
    source = fill([1])
    # nothing else expected: returns at once even with a long wait configured
    assert collect_batch(source, 8, max_wait=3600.0) == [1]


def test_waits_only_while_more_is_expected():
    source = fill([1, 2])
    counter = ExpectedCounter(source)
    counter.announce(1)
    source.put(3)
    counter.arrived()
    assert collect_batch(source, 8, max_wait=3600.0, more_expected=counter) == [1, 2, 3]


def test_retract_wakes_a_waiting_batch():
    source = fill([1])
    counter = ExpectedCounter(source)
    counter.announce(1)
    counter.retract()  # the announced instance failed before reaching the queue
    assert collect_batch(source, 8, max_wait=3600.0, more_expected=counter) == [1]


def test_wake_markers_are_not_items():
    source = fill([WAKE, 1, WAKE, 2, SENTINEL])
    assert collect_batch(source, 8, max_wait=0.0) == [1, 2]
    assert collect_batch(source, 8, max_wait=0.0) is None


def test_sentinel_inside_a_batch_ends_the_next_call():
    source = fill([1, SENTINEL])
    assert collect_batch(source, 4, max_wait=0.0) == [1]
    assert collect_batch(source, 4, max_wait=0.0) is None


def test_merge_pads_with_instance_zero_and_keeps_no_batch_inputs():
    a = (np.array([1.0, 2.0]), np.array([10]))
    b = (np.array([3.0, 4.0]), np.array([20]))
    merged = merge_inputs([a, b], 3, no_batch_inputs=(1,))
    np.testing.assert_array_equal(merged[0], [[1, 2], [3, 4], [1, 2]])
    np.testing.assert_array_equal(merged[1], [10])


def test_split_returns_first_count_rows():
    out = split_outputs([np.arange(6).reshape(3, 2), np.array([7, 8, 9])], 2)
    assert len(out) == 2
    np.testing.assert_array_equal(out[1][0], [2, 3])
    assert out[1][1] == 8


def test_merge_rejects_too_many_instances():
    with pytest.raises(ValueError):
        merge_inputs([(np.zeros(1),)] * 3, 2)


def test_batch_function_list_and_generator_results():
    def doubled(instances):
        return [x * 2 for (x,) in instances]

    def gen(instances):
        for (x,) in instances:
            if x == 2:
                raise ValueError("two is bad")
            yield x + 1

    assert [r[0].item() for r in run_batch_function(doubled, [(1,), (2,)], 1)] == [2, 4]
    results = run_batch_function(gen, [(1,), (2,), (3,)], 1)
    assert results[0][0].item() == 2
    assert isinstance(results[1], ValueError)
    assert results[2][0].item() == 4


def test_batch_function_too_few_results_fails_the_rest():
    results = run_batch_function(lambda instances: [1], [(1,), (2,)], 1)
    assert results[0][0].item() == 1
    assert "less than the number of instances" in str(results[1])
