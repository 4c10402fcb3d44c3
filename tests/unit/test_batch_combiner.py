"""Calls that meet at a busy graph share its next batches (worker/batch_combiner.py): how a worker fed by
several connections (a second call in flight, front-end processes) keeps its batches full. A fake graph that
blocks until released stands in for MindSpore; threads play the connections."""

import threading
import time

import numpy as np
import pytest

from mindspore_serving.worker.batch_combiner import BatchCombiner

BATCH = 8


class Graph:
    """Doubles its input; records every run's real rows; the first run may block until `release` is set."""

    def __init__(self, block_first=False, fail_on=None, batch=BATCH):
        self.batch = batch
        self.runs, self.release, self.entered = [], threading.Event(), threading.Event()
        self.block_first, self.fail_on = block_first, fail_on

    def __call__(self, inputs, count):
        assert inputs[0].shape[0] == self.batch and inputs[0].flags.c_contiguous
        self.runs.append(inputs[0][:count, 0].tolist())
        self.entered.set()
        if self.block_first and len(self.runs) == 1:
            assert self.release.wait(10)
        if self.fail_on is not None and self.fail_on in inputs[0][:count, 0]:
            raise RuntimeError("graph failed")
        return [inputs[0] * 2, inputs[0].sum(axis=1)]


def rows(first, count):
    return [np.arange(first, first + count, dtype=np.float32).reshape(count, 1).repeat(3, axis=1)]


def until(predicate):
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.001)  # ok-sleep: polling another thread's progress with a deadline


def queued_behind_a_running_call(combiner, graph, results, *calls):
    """Starts the first call, and each of the others from its own thread once the previous one waits in the queue;
    the graph is still running the first call's batch when this returns."""
    threads = [run_in_thread(combiner, calls[0][1], results, calls[0][0])]
    assert graph.entered.wait(10)
    for waiting, (name, inputs) in enumerate(calls[1:], 1):
        threads.append(run_in_thread(combiner, inputs, results, name))
        until(lambda count=waiting: len(combiner._queue) == count)
    return threads


def run_in_thread(combiner, inputs, results, name):
    def run():
        try:
            results[name] = combiner.run(inputs)
        except Exception as err:  # the test asserts on it
            results[name] = err

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_call_alone_runs_in_full_batches_and_gets_its_rows_back_in_order():
    graph = Graph()
    outputs = BatchCombiner(graph, BATCH).run(rows(0, 19))
    assert graph.runs == [list(range(0, 8)), list(range(8, 16)), list(range(16, 19))]
    assert outputs[0][:, 0].tolist() == [2.0 * x for x in range(19)] and outputs[1].tolist() == [
        3.0 * x for x in range(19)
    ]


def test_calls_that_wait_for_the_graph_share_its_next_batch():
    graph = Graph(block_first=True)
    combiner = BatchCombiner(graph, BATCH)
    results = {}
    # a's batch runs; b and c come meanwhile, from two other connections
    threads = queued_behind_a_running_call(
        combiner, graph, results, ("a", rows(0, 4)), ("b", rows(100, 3)), ("c", rows(200, 4))
    )
    graph.release.set()
    for thread in threads:
        thread.join(10)
    # b's 3 rows and c's 4 share one run (7 of 8), not two half-empty ones; c's last row waited for nothing
    assert graph.runs == [[0, 1, 2, 3], [100, 101, 102, 200, 201, 202, 203]]
    assert results["b"][1].tolist() == [300.0, 303.0, 306.0] and results["c"][0][:, 0].tolist() == [400, 402, 404, 406]
    assert results["a"][1].tolist() == [0.0, 3.0, 6.0, 9.0]


def test_a_call_spread_over_runs_shared_with_others_gets_all_its_rows():
    graph = Graph(block_first=True)
    combiner = BatchCombiner(graph, BATCH)
    results = {}
    threads = queued_behind_a_running_call(
        combiner, graph, results, ("a", rows(0, 2)), ("b", rows(100, 6)), ("c", rows(200, 5))
    )
    graph.release.set()
    for thread in threads:
        thread.join(10)
    assert graph.runs == [[0, 1], [100, 101, 102, 103, 104, 105, 200, 201], [202, 203, 204]]
    assert results["c"][1].tolist() == [3.0 * x for x in range(200, 205)]


def test_a_failed_run_fails_the_calls_it_held_and_the_others_still_run():
    graph = Graph(block_first=True, fail_on=100, batch=4)
    combiner = BatchCombiner(graph, 4)
    results = {}
    # b's first run fails: the rest of b is not run
    threads = queued_behind_a_running_call(
        combiner, graph, results, ("a", rows(0, 4)), ("b", rows(100, 6)), ("c", rows(200, 2))
    )
    graph.release.set()
    for thread in threads:
        thread.join(10)
    assert isinstance(results["b"], RuntimeError)
    assert results["c"][1].tolist() == [600.0, 603.0] and results["a"][1].tolist() == [0.0, 3.0, 6.0, 9.0]
    assert graph.runs[-1] == [200, 201]


@pytest.mark.parametrize("callers", [2, 6])
def test_concurrent_calls_all_get_their_own_answers(callers):
    graph = Graph()
    combiner = BatchCombiner(graph, BATCH)
    results = {}
    threads = [run_in_thread(combiner, rows(1000 * n, 1 + n * 3), results, n) for n in range(callers)]
    for thread in threads:
        thread.join(10)
    for n in range(callers):
        assert results[n][0][:, 0].tolist() == [2.0 * x for x in range(1000 * n, 1000 * n + 1 + n * 3)]
    assert all(len(run) <= BATCH for run in graph.runs) and not combiner._leading and not combiner._queue
