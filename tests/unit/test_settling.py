"""Settling (worker/settling.py): each CPU graph run on zeros before the worker registers, and a small graph whose
kernels still run split over MindSpore's threads loaded afresh and settled again."""

import os
import threading

import pytest

from mindspore_serving.worker import settling
from mindspore_serving.worker.model_backend import LoadedModel
from mindspore_serving.worker.settling import settle_graphs


class RemoteModel:
    """A model this worker does not run (an extra worker's, run by its device worker)."""


@pytest.fixture(name="said")
def _said(monkeypatch):
    """What settling logs, as (level, text)."""
    lines = []
    monkeypatch.setattr(settling.log, "info", lambda text: lines.append(("info", text)))
    monkeypatch.setattr(settling.log, "warning", lambda text: lines.append(("warning", text)))
    return lines


class FakeGraph:
    """A graph whose settling is recorded; `split_cpu_per_call` is faked per test."""

    def __init__(self, name, settled, calls=50, error=None):
        self.name, self.settled, self.calls, self.error = name, settled, calls, error
        self.reloads = 0

    def run_on_zeros(self, calls, budget_s):
        if self.error is not None:
            raise self.error
        self.settled.append((self.name, calls, budget_s))
        return self.calls

    def reload(self):
        self.reloads += 1


def loaded_model(device_target, graphs):
    model = LoadedModel.__new__(LoadedModel)  # its graphs are fakes: nothing is loaded
    model.device_target, model.subgraphs = device_target, graphs
    return model


def test_every_graph_run_here_on_cpu_is_settled_and_the_others_are_left(said, monkeypatch):
    monkeypatch.setattr(settling, "split_cpu_per_call", lambda graph: 0.0)
    settled = []
    models = {
        "cpu": loaded_model(
            "CPU",
            [
                FakeGraph("a", settled),
                FakeGraph("b", settled, error=RuntimeError("x")),
                FakeGraph("c", settled, calls=0),
            ],
        ),
        "gpu": loaded_model("GPU", [FakeGraph("d", settled)]),
        "elsewhere": RemoteModel(),
    }
    settle_graphs(models)
    assert settled == [
        ("a", settling.SETTLE_CALLS, settling.SETTLE_SECONDS),
        ("c", settling.SETTLE_CALLS, settling.SETTLE_SECONDS),
    ]
    assert [level for level, _ in said] == ["info", "warning"]  # graph 2 has dynamic shapes: nothing to say
    assert said[0][1].startswith("model cpu graph 0 settled: 50 calls on zeros in ")
    assert said[1][1] == "model cpu graph 1 was not settled: x"


@pytest.mark.parametrize(
    "splits, reloads, last_words",
    [
        ([None], 0, "settled: 50 calls"),  # a larger graph, or no /proc: not checked
        ([1.5], 0, "settled: 50 calls"),  # within SPLIT_US_PER_CALL
        ([40.0, 0.0], 1, "settled: 50 calls"),
        (
            [40.0, 35.0, 30.0],
            2,
            "still runs its kernels split over its threads (30 us of their CPU per call) after 3 "
            "settlings; register.Context(thread_num=1) keeps a small model in the calling thread",
        ),
    ],
)
def test_a_small_graph_whose_kernels_run_split_is_loaded_afresh_and_settled_again(
    said, monkeypatch, splits, reloads, last_words
):
    measured = iter(splits)
    monkeypatch.setattr(settling, "split_cpu_per_call", lambda graph: next(measured))
    settled = []
    graph = FakeGraph("a", settled)
    settle_graphs({"m": loaded_model("CPU", [graph])})
    assert graph.reloads == reloads and len(settled) == len(splits)
    assert sum("loaded afresh to settle again" in text for _, text in said) == reloads
    assert last_words in said[-1][1] and said[-1][0] == ("warning" if reloads == 2 else "info")


def test_a_graph_that_settles_slowly_is_not_checked(said, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(settling.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(settling, "split_cpu_per_call", lambda graph: pytest.fail("a large graph was checked"))

    class SlowGraph(FakeGraph):
        def run_on_zeros(self, calls, budget_s):
            clock[0] += calls * settling.SMALL_GRAPH_S  # each call as long as a small graph's limit
            return super().run_on_zeros(calls, budget_s)

    settled = []
    settle_graphs({"m": loaded_model("CPU", [SlowGraph("a", settled)])})
    assert len(settled) == 1 and said == [("info", "model m graph 0 settled: 50 calls on zeros in 50.0 ms")]


class CountingGraph:
    """Each call takes `call_s` (a fake clock) and makes MindSpore's threads work `helper_ns` (a fake counter)."""

    def __init__(self, clock, helper, call_s, helper_ns, static=True):
        self.clock, self.helper, self.call_s, self.helper_ns, self.static = clock, helper, call_s, helper_ns, static

    def run_on_zeros(self, calls, budget_s):
        if not self.static:
            return 0
        for _ in range(calls):
            self.clock[0] += self.call_s
            self.helper[0] += self.helper_ns
        return calls


@pytest.mark.parametrize(
    "call_s, helper_ns, static, expected",
    [
        (0.0001, 30_000, True, 30.0),  # small, split: its threads' CPU per call, in us
        (0.0001, 0, True, 0.0),
        (0.002, 30_000, True, None),  # larger than SMALL_GRAPH_S: its threads may well be worth it
        (0.0001, 30_000, False, None),  # dynamic shapes
    ],
)
def test_the_split_is_measured_as_the_cpu_of_mindspores_threads_per_call_of_a_small_graph(
    monkeypatch, call_s, helper_ns, static, expected
):
    clock, helper = [0.0], [0]
    monkeypatch.setattr(settling.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(settling, "helper_cpu_ns", lambda: helper[0])
    assert settling.split_cpu_per_call(CountingGraph(clock, helper, call_s, helper_ns, static)) == expected


def test_mindspores_threads_are_found_by_name_in_proc():
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc")
    before = settling.helper_cpu_ns()
    named, worked, done = threading.Event(), threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (named.wait(5), sum(range(200_000)), worked.set(), done.wait(5)))
    thread.start()
    try:
        with open(f"/proc/self/task/{thread.native_id}/comm", "w", encoding="utf-8") as stream:
            stream.write("KernelThread_9")  # the name MindSpore gives its kernel threads
        named.set()
        assert worked.wait(5)  # the thread's CPU is counted once it has spent some, not when it was told to
        with open(f"/proc/self/task/{thread.native_id}/schedstat", encoding="utf-8") as stream:
            spent = int(stream.read().split()[0])
        assert spent > 0 and settling.helper_cpu_ns() >= before + spent
    finally:
        done.set()
        thread.join()
