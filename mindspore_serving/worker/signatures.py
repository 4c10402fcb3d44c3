"""What a worker tells the master about each method's inputs and outputs: per instance, the dtype and shape
that the MindIR declares for those that meet a model stage directly (the master answers KServe v2 metadata
with them and checks v2 requests against them, without MindSpore), and whether the method's model has a
batch dimension.

An input that goes first to a Python stage, or an output that a Python stage makes, has no declared type:
it is sent as unknown (any dtype and shape).
"""

from mindspore_serving import log
from mindspore_serving.common.tensor_codec import dtype_to_proto
from mindspore_serving.proto import internal_pb2
from mindspore_serving.spec.servable import STAGE_MODEL, MethodSpec, TensorRef


def _known(name: str, info) -> "internal_pb2.TensorSignature":
    if info is None:
        return internal_pb2.TensorSignature(name=name)
    try:
        dtype = dtype_to_proto(info.dtype)
    except TypeError:
        return internal_pb2.TensorSignature(name=name)
    return internal_pb2.TensorSignature(name=name, dtype=dtype, shape=[int(d) for d in info.shape], known=True)


def _input_info(models, method: MethodSpec, index: int):
    """The instance TensorInfo of method input `index` when its first consumer is a model stage, else None."""
    ref = TensorRef(0, index)
    for stage in method.stages:
        if ref not in stage.inputs:
            continue
        if stage.kind != STAGE_MODEL:
            return None
        model = models[stage.model_key]
        return model.instance_inputs(stage.subgraph)[stage.inputs.index(ref)]
    return None


def _output_info(models, method: MethodSpec, ref: TensorRef):
    """The instance TensorInfo of a method output made by a model stage, else None."""
    if ref.stage_index == 0:
        return _input_info(models, method, ref.output_index)
    stage = method.stages[ref.stage_index - 1]
    if stage.kind != STAGE_MODEL:
        return None
    model = models[stage.model_key]
    info = model.subgraphs[stage.subgraph].outputs[ref.output_index]
    if model.spec.with_batch_dim:
        return type(info)(tuple(info.shape[1:]), info.dtype)
    return info


def input_infos(method: MethodSpec, models) -> list[object | None]:
    """The instance TensorInfo of each method input that goes straight to a model stage, None for the others
    (or when the models cannot tell)."""
    infos = []
    for index in range(len(method.input_names)):
        try:
            infos.append(_input_info(models, method, index))
        except Exception as err:  # pylint: disable=broad-except
            log.info(f"method {method.name}: no signature for input {index}: {err}")
            infos.append(None)
    return infos


def method_signature(method: MethodSpec, models) -> tuple[list, list, bool]:
    """(input TensorSignatures, output TensorSignatures, batched) of a method of a servable whose loaded models
    are `models` (model key -> LoadedModel). Anything the models cannot tell (e.g. a distributed servable's
    remote graphs) is unknown."""
    batched = any(
        stage.kind == STAGE_MODEL and stage.model_key in models and models[stage.model_key].spec.with_batch_dim
        for stage in method.stages
    )

    def safely(find, *args) -> object | None:
        try:
            return find(models, method, *args)
        except Exception as err:  # pylint: disable=broad-except
            log.info(f"method {method.name}: no signature for {args}: {err}")
            return None

    inputs = [_known(name, safely(_input_info, index)) for index, name in enumerate(method.input_names)]
    outputs = [_known(name, safely(_output_info, ref)) for name, ref in zip(method.output_names, method.outputs)]
    outputs += [internal_pb2.TensorSignature(name=name) for name in method.output_names[len(outputs) :]]
    return inputs, outputs, batched
