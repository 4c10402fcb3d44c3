"""ModelExecutor: where a model's graph runs (caller's thread for batches of one on CPU, else the batch thread)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mindspore_serving.spec.servable import ModelSpec
from mindspore_serving.worker.executors import ModelExecutor
from mindspore_serving.worker.model_backend import TensorInfo


class ThreadRecordingGraph:
    def __init__(self, fail_on=None):
        self.threads = []
        self.calls = []
        self.fail_on = fail_on

    def run(self, inputs):
        self.threads.append(threading.get_ident())
        self.calls.append([np.array(value) for value in inputs])
        if self.fail_on is not None and float(np.asarray(inputs[0]).ravel()[0]) == self.fail_on:
            raise ValueError("graph failure")
        return [np.asarray(inputs[0]) * 2]


class FakeModel:
    def __init__(self, batch_size, with_batch_dim, device_target=None, fail_on=None):
        self.spec = ModelSpec(
            model_key="fake.mindir", model_files=("fake.mindir",), model_format="MindIR", with_batch_dim=with_batch_dim
        )
        self.subgraphs = [ThreadRecordingGraph(fail_on)]
        self.batch_size = batch_size
        if device_target is not None:
            self.device_target = device_target

    def instance_inputs(self, subgraph):
        return [TensorInfo((2,), np.dtype(np.float32))]


@pytest.mark.timeout(60)
def test_a_model_without_batch_dimension_runs_in_the_callers_thread():
    model = FakeModel(1, with_batch_dim=False)
    executor = ModelExecutor(model, 0, max_wait=5.0)
    try:
        assert executor.inline
        futures = [executor.submit((np.array([x, x], np.float32),)) for x in (1, 2, 3)]
        assert all(future.done() for future in futures)  # already answered when submit returns
        assert [future.result()[0].tolist() for future in futures] == [[2, 2], [4, 4], [6, 6]]
        assert set(model.subgraphs[0].threads) == {threading.get_ident()}
        assert not executor.expected()
    finally:
        executor.close()


@pytest.mark.timeout(60)
def test_a_failing_instance_fails_alone_when_run_inline():
    model = FakeModel(1, with_batch_dim=False, fail_on=2.0)
    executor = ModelExecutor(model, 0, max_wait=5.0)
    try:
        futures = [executor.submit((np.array([x, x], np.float32),)) for x in (1, 2, 3)]
        assert futures[0].result()[0].tolist() == [2, 2] and futures[2].result()[0].tolist() == [6, 6]
        with pytest.raises(RuntimeError, match="model predict failed: graph failure"):
            futures[1].result()
    finally:
        executor.close()


@pytest.mark.timeout(60)
def test_concurrent_callers_never_run_the_graph_at_the_same_time():
    model = FakeModel(1, with_batch_dim=False)
    graph = model.subgraphs[0]
    active, overlaps = [0], []
    original = graph.run

    def guarded(inputs):
        active[0] += 1
        overlaps.append(active[0])
        try:
            threading.Event().wait(0.001)  # ok-sleep: a graph call must last a while for callers to overlap
            return original(inputs)
        finally:
            active[0] -= 1

    graph.run = guarded
    executor = ModelExecutor(model, 0, max_wait=5.0)
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = list(pool.map(lambda x: executor.submit((np.array([x, x], np.float32),)), range(40)))
        assert [f.result()[0][0] for f in futures] == [2 * x for x in range(40)]
        assert max(overlaps) == 1
    finally:
        executor.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch_size, device", [(4, None), (1, "GPU")])
def test_batched_models_and_device_models_run_in_the_batch_thread(batch_size, device):
    model = FakeModel(batch_size, with_batch_dim=batch_size > 1, device_target=device)
    executor = ModelExecutor(model, 0, max_wait=5.0)
    try:
        assert not executor.inline
        futures = [executor.submit((np.array([x, x], np.float32),)) for x in (1, 2)]
        assert [future.result(10)[0].tolist() for future in futures] == [[2, 2], [4, 4]]
        assert threading.get_ident() not in model.subgraphs[0].threads
    finally:
        executor.close()
