"""Method specs and a fake loaded model for the worker's stage tests (MethodRunner, ModelExecutor, the direct
path): specs written by hand, and a graph that is a Python function."""

import numpy as np

from mindspore_serving.spec.servable import STAGE_FUNCTION, STAGE_MODEL, MethodSpec, ModelSpec, StageSpec, TensorRef


def ref(stage, index=0):
    return TensorRef(stage, index)


def function_spec(function, *inputs, outputs_count=1, tag=None, batch_size=None):
    key = f"svc.{function.__name__}"
    return StageSpec(
        kind=STAGE_FUNCTION,
        tag=tag or f"Function '{key}'",
        inputs=list(inputs),
        outputs_count=outputs_count,
        batch_size=batch_size,
        function=function,
        function_key=key,
    )


def model_spec(model_key, *inputs, outputs_count=1):
    return StageSpec(
        kind=STAGE_MODEL,
        tag=f"Model '{model_key}'",
        inputs=list(inputs),
        outputs_count=outputs_count,
        model_key=model_key,
    )


def method(name, input_names, output_names, stages, outputs):
    return MethodSpec(
        name=name,
        input_names=list(input_names),
        output_names=list(output_names),
        stages=list(stages),
        outputs=list(outputs),
    )


class FakeGraph:
    def __init__(self, function):
        self.function = function
        self.calls = []

    def run(self, inputs):
        self.calls.append([np.array(value) for value in inputs])
        return self.function(*inputs)


class FakeLoadedModel:
    """The attributes of LoadedModel that ModelExecutor reads."""

    def __init__(self, batch_size, infos, function):
        self.spec = ModelSpec(model_key="fake.mindir", model_files=("fake.mindir",), model_format="MindIR")
        self.subgraphs = [FakeGraph(function)]
        self.batch_size = batch_size
        self._infos = infos

    def instance_inputs(self, subgraph):
        return self._infos
