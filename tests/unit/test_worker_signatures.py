"""What a worker registers about a method's tensors (worker/signatures.py), from fake loaded models."""

from types import SimpleNamespace

import numpy as np

from mindspore_serving.proto import ms_service_pb2 as ms
from mindspore_serving.spec.servable import STAGE_FUNCTION, STAGE_MODEL, MethodSpec, StageSpec, TensorRef
from mindspore_serving.worker.model_backend import TensorInfo
from mindspore_serving.worker.signatures import method_signature


class FakeModel:
    def __init__(self, inputs, outputs, with_batch_dim):
        self.spec = SimpleNamespace(with_batch_dim=with_batch_dim)
        self.subgraphs = [SimpleNamespace(outputs=outputs)]
        self._inputs = inputs

    def instance_inputs(self, subgraph):
        return self._inputs


def test_model_fed_inputs_and_model_made_outputs_are_known_python_ones_are_not():
    model = FakeModel(
        [TensorInfo((3,), np.dtype(np.int32)), TensorInfo((), np.dtype(np.float32))],
        [TensorInfo((4, 10), np.dtype(np.float32))],
        with_batch_dim=True,
    )
    method = MethodSpec(
        name="m",
        input_names=["a", "b", "c"],
        output_names=["score", "label"],
        stages=[
            StageSpec(STAGE_FUNCTION, "pre", [TensorRef(0, 2)], 1),
            StageSpec(STAGE_MODEL, "net", [TensorRef(0, 0), TensorRef(0, 1)], 1, model_key="net"),
            StageSpec(STAGE_FUNCTION, "post", [TensorRef(2, 0)], 1),
        ],
        outputs=[TensorRef(2, 0), TensorRef(3, 0)],
    )
    inputs, outputs, batched = method_signature(method, {"net": model})
    assert batched
    assert [(s.name, s.known, s.dtype, list(s.shape)) for s in inputs] == [
        ("a", True, ms.MS_INT32, [3]),
        ("b", True, ms.MS_FLOAT32, []),
        ("c", False, ms.MS_UNKNOWN, []),
    ]
    assert [(s.name, s.known, list(s.shape)) for s in outputs] == [("score", True, [10]), ("label", False, [])]


def test_without_models_everything_is_unknown_and_unbatched():
    method = MethodSpec(
        name="m",
        input_names=["a"],
        output_names=["y"],
        stages=[StageSpec(STAGE_MODEL, "net", [TensorRef(0, 0)], 1, model_key="remote")],
        outputs=[TensorRef(1, 0)],
    )
    inputs, outputs, batched = method_signature(method, {})
    assert not batched and not inputs[0].known and not outputs[0].known
