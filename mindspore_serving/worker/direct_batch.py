"""Model-only methods run straight from the request's bytes.

A method whose only stage is one model (`return register.add_stage(model, x, ...)`) needs no per-instance work
in Python: the inputs of all the call's instances are joined into arrays in one copy each (no numpy object per
instance, no thread hand-off per instance). With a batch dimension the graph runs on full batches and each
instance's outputs are rows of the batched outputs; without one it runs once per instance, from views of those
arrays. On the bench's `dense_batch` this cuts the worker's time per 64-instance call from ~2.5 ms over the graph
call to ~1 ms.

Only when every instance feeds the model exactly (every input present, the model's dtype and byte size, as the
general path accepts them); otherwise, or when the graph fails, the call takes the general path
(MethodRunner), which gives each instance its own answer or error text. Only on CPU: a device context may be
bound to the thread of the model's executor.
"""

import sys
from collections.abc import Sequence
from typing import Optional

import numpy as np

from mindspore_serving import log
from mindspore_serving.common.tensor_codec import NUMPY_TO_PROTO
from mindspore_serving.spec.servable import MethodSpec
from mindspore_serving.worker.batching import split_outputs
from mindspore_serving.worker.executors import ModelExecutor
from mindspore_serving.worker.method_runner import MethodRunner, ModelStage


class DirectBatch:
    def __init__(self, method: MethodSpec, executor: ModelExecutor):
        stage = method.stages[0]
        self.executor = executor
        self.batch_size = executor.batch_size
        self.batched = executor.model.spec.with_batch_dim
        self.input_names = [method.input_names[ref.output_index] for ref in stage.inputs]
        self.infos = executor.instance_infos
        self.codes = [NUMPY_TO_PROTO[np.dtype(info.dtype)] for info in self.infos]
        self.outputs = [(name, ref.output_index) for name, ref in zip(method.output_names, method.outputs)]

    @classmethod
    def of(cls, runner: MethodRunner) -> Optional["DirectBatch"]:
        """The direct path of a method runner's method, or None when the method cannot take it."""
        stages = runner.stages
        executor = stages[0].executor if len(stages) == 1 and isinstance(stages[0], ModelStage) else None
        return cls(runner.method, executor) if cls.applies(runner.method, executor) else None

    @staticmethod
    def applies(method: MethodSpec, executor) -> bool:
        """Whether `method` (whose one stage runs on `executor`, None when it is not a model stage) can run here:
        `executor` must run its model in this worker (a ModelExecutor, not an extra worker's remote one)."""
        if not isinstance(executor, ModelExecutor) or len(method.stages) != 1 or sys.byteorder != "little":
            return False
        stage, model = method.stages[0], executor.model
        return (
            getattr(model, "device_target", "CPU") == "CPU"
            and not executor.no_batch_inputs
            and len(stage.inputs) == executor.inputs_count
            and all(ref.stage_index == 0 for ref in stage.inputs)
            and all(ref.stage_index == 1 for ref in method.outputs)
            and all(info.is_static and np.dtype(info.dtype) in NUMPY_TO_PROTO for info in executor.instance_infos)
        )

    def _inputs(self, instances_pb: Sequence) -> list[np.ndarray] | None:
        """The model inputs of all instances, batch first; None when one instance does not feed the model exactly."""
        count, arrays = len(instances_pb), []
        for name, info, code in zip(self.input_names, self.infos, self.codes):
            size, parts = info.nbytes, []
            for instance in instances_pb:
                tensor = instance.items.get(name)
                if tensor is None or tensor.dtype != code:
                    return None
                data = tensor.data
                if len(data) != size:  # also a tensor in shared memory (no data)
                    return None
                parts.append(data)
            arrays.append(np.frombuffer(b"".join(parts), info.dtype).reshape((count,) + tuple(info.shape)))
        return arrays

    def run(self, instances_pb: Sequence) -> list | None:
        """Per instance a dict of output name -> value, as MethodRunner answers; None: take the general path."""
        inputs = self._inputs(instances_pb)
        if inputs is None:
            return None
        try:
            return self._run_batches(inputs) if self.batched else self._run_each(inputs)
        except Exception as err:  # the general path runs it again and words the error per instance
            log.warning(
                f"model {self.executor.model.spec.model_key} failed on the direct path, the call takes the "
                f"general path: {err}"
            )
            return None

    def _run_batches(self, inputs: list[np.ndarray]) -> list:
        # full batches, shared with the calls of other connections that wait for the graph (batch_combiner.py)
        outputs = self.executor.combiner.run(inputs)
        return [{name: row[index] for name, index in self.outputs} for row in split_outputs(outputs, len(inputs[0]))]

    def _run_each(self, inputs: list[np.ndarray]) -> list:
        answers = []
        for slot in range(len(inputs[0])):
            outputs = self.executor.run_instance([array[slot] for array in inputs])
            answers.append({name: outputs[index] for name, index in self.outputs})
        return answers
