"""Runs one registered method over a request's instances, stage by stage.

All alive instances of a request enter a stage together, so model and batched Python stages see
them (and those of concurrent requests) in one batch. A failing instance gets its own error and
leaves the pipeline; its neighbours go on. A stage's exception reaches the client as MindSpore Serving
reports it ("Call <stage> Failed, ... error msg: <exception>"), its text cut of paths and reprs
(errors.client_text); the exception itself, traceback and all, is the InstanceError's `__cause__`, for the
worker's log (worker/service.py logs it with the request's id).
"""

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

import numpy as np

from mindspore_serving.common.errors import client_text
from mindspore_serving.common.instance_checks import check_instance
from mindspore_serving.spec.servable import MethodSpec, StageSpec, TensorRef
from mindspore_serving.worker.executors import FunctionBatcher, ModelExecutor
from mindspore_serving.worker.stage_values import normalize_outputs, to_model_input


class InstanceError(Exception):
    """An error that belongs to one instance; its text reaches the client unchanged. One a stage raised has that
    exception as its `__cause__`."""


class ModelStage:
    def __init__(self, executor: ModelExecutor):
        self.executor = executor

    def check(self, inputs: tuple) -> str | None:
        return self.executor.check(inputs)

    def submit(self, inputs: tuple) -> Future:
        return self.executor.submit(inputs)


class FunctionStage:
    """A Python stage called once per instance in the stage pool."""

    def __init__(self, function: Callable, outputs_count: int, pool: Executor):
        self.function = function
        self.outputs_count = outputs_count
        self.pool = pool

    def check(self, inputs: tuple) -> str | None:
        return None

    def submit(self, inputs: tuple) -> Future:
        return self.pool.submit(self._call, inputs)

    def _call(self, inputs: tuple) -> tuple:
        return normalize_outputs(self.function(*inputs), self.outputs_count)


class BatchFunctionStage:
    def __init__(self, batcher: FunctionBatcher):
        self.batcher = batcher

    def check(self, inputs: tuple) -> str | None:
        return None

    def submit(self, inputs: tuple) -> Future:
        return self.batcher.submit(inputs)


class ArgmaxStage:
    """The built-in "argmax_cpp" stage: index of the largest element."""

    def check(self, inputs: tuple) -> str | None:
        if len(inputs) != 1 or not isinstance(inputs[0], np.ndarray):
            return "argmax_cpp expects one numeric tensor input"
        return None

    def submit(self, inputs: tuple) -> Future:
        future: Future = Future()
        future.set_result((np.array(np.argmax(inputs[0]), np.int64),))
        return future


BUILTIN_STAGES = {"argmax_cpp": ArgmaxStage}


def stage_input(value):
    """Values as Python stages see them: MS_BYTES arrive as 1-D uint8 arrays, as in MindSpore Serving."""
    return to_model_input(value)


class MethodRunner:
    def __init__(self, servable_name: str, method: MethodSpec, stages: Sequence):
        self.servable_name = servable_name
        self.method = method
        self.stages = list(stages)
        self._model_stage_indexes = [
            index for index, stage in enumerate(self.stages, start=1) if isinstance(stage, ModelStage)
        ]

    def _stage_error(self, index: int, err: BaseException) -> str:
        """The client's text of the exception a stage raised: MindSpore Serving's, without paths and reprs."""
        spec: StageSpec = self.method.stages[index - 1]
        if isinstance(err, InstanceError):
            return client_text(str(err))
        return client_text(
            f"Call {spec.tag} Failed, method: '{self.method.name}', stage index(begin with 1): "
            f"{index}, error msg: {err}"
        )

    def _retract_after(self, index: int):
        for later in self._model_stage_indexes:
            if later > index:
                self.stages[later - 1].executor.expected.retract()

    def run(self, instances: Sequence[dict]) -> list:
        """Per instance: a dict of output name -> value, or an InstanceError."""
        count = len(instances)
        values: list[dict[TensorRef, object]] = [{} for _ in range(count)]
        errors: list[str | None] = [None] * count
        causes: dict[int, BaseException] = {}  # position -> the exception a stage raised for it
        input_names = self.method.input_names
        for position, instance in enumerate(instances):
            errors[position] = check_instance(instance, input_names, self.servable_name, self.method.name)
            if errors[position] is None:
                values[position] = {TensorRef(0, index): instance[name] for index, name in enumerate(input_names)}
        alive = sum(1 for error in errors if error is None)
        for index in self._model_stage_indexes:
            self.stages[index - 1].executor.expected.announce(alive)

        for index, stage in enumerate(self.stages, start=1):
            spec = self.method.stages[index - 1]
            futures = {}
            for position in range(count):
                if errors[position] is not None:
                    continue
                inputs = tuple(self._value(values[position], ref) for ref in spec.inputs)
                reason = stage.check(inputs)
                if reason is not None:
                    errors[position] = reason
                    if isinstance(stage, ModelStage):
                        stage.executor.expected.retract()
                    self._retract_after(index)
                    continue
                futures[position] = stage.submit(inputs)
            for position, future in futures.items():
                try:
                    outputs = future.result()
                except Exception as err:
                    errors[position] = self._stage_error(index, err)
                    causes[position] = err
                    self._retract_after(index)
                    continue
                for output_index, value in enumerate(outputs):
                    values[position][TensorRef(index, output_index)] = value

        results: list = []
        for position in range(count):
            if errors[position] is not None:
                error = InstanceError(errors[position])
                error.__cause__ = causes.get(position)
                results.append(error)
                continue
            results.append(
                {name: values[position][ref] for name, ref in zip(self.method.output_names, self.method.outputs)}
            )
        return results

    @staticmethod
    def _value(instance_values: dict[TensorRef, object], ref: TensorRef):
        return stage_input(instance_values[ref])
