"""Threads that run batches: one per model subgraph and one per batched Python stage."""

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np

from mindspore_serving import log
from mindspore_serving.worker.batch_combiner import BatchCombiner
from mindspore_serving.worker.batching import SENTINEL, ExpectedCounter, collect_batch, merge_inputs, split_outputs
from mindspore_serving.worker.metrics import WORKER_METRICS
from mindspore_serving.worker.model_backend import LoadedModel
from mindspore_serving.worker.stage_values import check_model_inputs, normalize_outputs, shape_to_model


@dataclass
class _Item:
    inputs: tuple
    future: Future


class _BatchLoop:
    """A queue drained by one thread in batches of at most `batch_size`."""

    def __init__(self, name: str, batch_size: int, max_wait: float):
        self.batch_size = max(1, batch_size)
        self.max_wait = max_wait
        self.queue: queue.Queue = queue.Queue()
        self.expected = ExpectedCounter(self.queue)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, inputs: tuple) -> Future:
        future: Future = Future()
        # counted before it is queued: a batch must never wait for an instance that is already in the queue
        self.expected.arrived()
        self.queue.put(_Item(inputs, future))
        return future

    def close(self):
        self.queue.put(SENTINEL)
        self._thread.join(timeout=10)

    def _loop(self):
        while True:
            items = collect_batch(self.queue, self.batch_size, self.max_wait, self.expected)
            if items is None:
                return
            self._run(items)

    def _run(self, items: list[_Item]):
        raise NotImplementedError


class ModelExecutor(_BatchLoop):
    """Runs one subgraph of a loaded model on batches merged from concurrent instances."""

    def __init__(self, model: LoadedModel, subgraph: int, max_wait: float):
        self.model = model
        self.subgraph = subgraph
        self.graph = model.subgraphs[subgraph]
        self.instance_infos = model.instance_inputs(subgraph)
        self.no_batch_inputs = tuple(model.spec.without_batch_dim_inputs)
        self._graph_lock = threading.Lock()  # one graph call at a time, whichever thread makes it
        self.combiner = BatchCombiner(self.run_merged, model.batch_size)  # direct calls share batches through it
        self.stats = WORKER_METRICS.model(
            model.spec.model_key if len(model.subgraphs) == 1 else f"{model.spec.model_key}:{subgraph}"
        )
        super().__init__(f"model-{model.spec.model_key}-{subgraph}", model.batch_size, max_wait)
        # A model whose batches hold one instance has nothing to wait for: the caller's thread runs it at once,
        # which saves two thread hand-offs per instance; instances still run one at a time, in submit order.
        # Only on CPU: a device context may be bound to the thread that runs a device's graphs.
        self.inline = self.batch_size == 1 and getattr(model, "device_target", "CPU") == "CPU"

    @property
    def inputs_count(self) -> int:
        return len(self.instance_infos)

    def check(self, inputs: Sequence) -> str | None:
        return check_model_inputs(inputs, self.instance_infos)

    def submit(self, inputs: tuple) -> Future:
        if not self.inline:
            return super().submit(inputs)
        future: Future = Future()
        self.expected.arrived()
        self._run([_Item(inputs, future)])
        return future

    def _run(self, items: list[_Item]):
        with self._graph_lock:
            self._run_locked(items)

    def run_merged(self, batch: list[np.ndarray], count: int) -> list:
        """Runs inputs already merged into a full batch whose first `count` rows are instances (the others pad);
        the outputs, batch first. Raises what the graph raises."""
        with self._graph_lock:
            return self._run_batch(batch, count, time.perf_counter())

    def run_instance(self, inputs: list[np.ndarray]) -> list:
        """Runs one instance of a model without a batch dimension; its outputs. Raises what the graph raises."""
        with self._graph_lock:
            return self._run_one(inputs)

    def _run_one(self, inputs) -> list:
        started = time.perf_counter()
        outputs = self.graph.run(inputs)
        self.stats.record(1, 0, time.perf_counter() - started)
        return outputs

    def _run_batch(self, batch: list[np.ndarray], count: int, started: float) -> list:
        outputs = self.graph.run(batch)
        for output in outputs:
            if output.ndim == 0 or output.shape[0] < count:
                raise ValueError(f"Model output shape {list(output.shape)} cannot be split into {count} instances")
        self.stats.record(count, self.batch_size - count, time.perf_counter() - started)
        return outputs

    def _run_locked(self, items: list[_Item]):
        started = time.perf_counter()
        try:
            instances = [shape_to_model(item.inputs, self.instance_infos) for item in items]
            if self.model.spec.with_batch_dim:
                outputs = self._run_batch(
                    merge_inputs(instances, self.batch_size, self.no_batch_inputs), len(items), started
                )
                results = split_outputs(outputs, len(items))
            else:  # one graph call per instance
                results = [tuple(self._run_one(instance)) for instance in instances]
        except Exception as err:  # the graph failed: every instance of this batch gets the reason
            log.exception(f"model {self.model.spec.model_key} subgraph {self.subgraph} failed")
            for item in items:
                item.future.set_exception(RuntimeError(f"model predict failed: {err}"))
            return
        for item, result in zip(items, results):
            item.future.set_result(result)


def run_batch_function(function: Callable, instances: list[tuple], outputs_count: int) -> list:
    """Calls a batched Python stage; returns per instance either its output tuple or an exception.

    The function gets the list of input tuples and returns a list/tuple or yields one result per
    instance. When the call itself raises, every instance fails; when one yielded item raises, only
    that instance fails and the function is called again on the instances after it.
    """
    results: list = []
    while len(results) < len(instances):
        pending = instances[len(results) :]
        try:
            produced = iter(function(pending))
        except Exception as err:
            results.extend([err] * len(pending))
            break
        restart = False
        for _ in pending:
            try:
                output = next(produced)
            except StopIteration:
                missing = len(instances) - len(results)
                error = RuntimeError(
                    f"the number of results returned is less than the number of instances, "
                    f"{missing} instance(s) got no result"
                )
                results.extend([error] * missing)
                break
            except Exception as err:
                results.append(err)
                restart = True
                break
            try:
                results.append(normalize_outputs(output, outputs_count))
            except Exception as err:
                results.append(err)
        if not restart:
            break
    return results


class FunctionBatcher(_BatchLoop):
    """Collects instances for a Python stage declared with `batch_size` and runs them in the stage pool."""

    def __init__(
        self, name: str, function: Callable, batch_size: int, outputs_count: int, pool: Executor, max_wait: float
    ):
        self.function = function
        self.outputs_count = outputs_count
        self.pool = pool
        super().__init__(f"stage-{name}", batch_size, max_wait)

    def _run(self, items: list[_Item]):
        self.pool.submit(self._call, items)

    def _call(self, items: list[_Item]):
        results = run_batch_function(self.function, [item.inputs for item in items], self.outputs_count)
        for item, result in zip(items, results):
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)
