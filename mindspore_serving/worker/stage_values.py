"""Values passed between stages: what a stage may return and how model inputs are checked."""

from collections.abc import Sequence

import numpy as np

from mindspore_serving.common.tensor_codec import scalar_to_array
from mindspore_serving.worker.model_backend import TensorInfo, kmsi_name


def to_stage_value(value):
    """Normalises one stage output: numpy arrays (contiguous), str and bytes pass; scalars become 0-d arrays."""
    if isinstance(value, np.ndarray):
        return np.asarray(value, order="C")
    if isinstance(value, (str, bytes)):
        return value
    array = scalar_to_array(value)
    if array is not None:
        return array
    if hasattr(value, "asnumpy"):
        return np.asarray(value.asnumpy(), order="C")
    raise TypeError(
        f"output type {type(value).__name__} is not supported, expect numpy array, "
        f"numpy scalar, bool, int, float, str, bytes or mindspore Tensor"
    )


def normalize_outputs(result, outputs_count: int) -> tuple:
    """One instance's outputs of a stage as a tuple of `outputs_count` values."""
    if outputs_count == 1:
        if isinstance(result, tuple) and len(result) == 1:
            result = result[0]
        return (to_stage_value(result),)
    if not isinstance(result, (tuple, list)):
        raise RuntimeError(f"the number of outputs is 1, not equal to outputs_count {outputs_count}")
    if len(result) != outputs_count:
        raise RuntimeError(f"the number of outputs is {len(result)}, not equal to outputs_count {outputs_count}")
    return tuple(to_stage_value(item) for item in result)


def to_model_input(value):
    """Stage values fed to a model: bytes travel as uint8 arrays."""
    if isinstance(value, (bytes, bytearray)):
        return np.frombuffer(value, np.uint8)
    return value


def check_model_inputs(values: Sequence, infos: Sequence[TensorInfo]) -> str | None:
    """The first reason why one instance's values cannot feed the model, or None."""
    if len(values) != len(infos):
        return f"The inputs count {len(values)} is not equal to the inputs count {len(infos)} of the model"
    for index, (value, info) in enumerate(zip(values, infos)):
        if not isinstance(value, np.ndarray):
            return (
                f"Given model input {index} data type {kmsi_name(value)} not match the data type "
                f"{kmsi_name(info.dtype)} defined in model"
            )
        if info.is_static and value.nbytes != info.nbytes:
            return f"Given model input {index} size {value.nbytes} not match the size {info.nbytes} defined in model"
        if value.dtype != info.dtype:
            return (
                f"Given model input {index} data type {kmsi_name(value.dtype)} not match the data type "
                f"{kmsi_name(info.dtype)} defined in model"
            )
    return None


def shape_to_model(values: Sequence[np.ndarray], infos: Sequence[TensorInfo]) -> tuple[np.ndarray, ...]:
    """Reshapes checked inputs to the model's shapes (only the byte size is compared, as in MindSpore Serving)."""
    return tuple(value.reshape(info.shape) if info.is_static else value for value, info in zip(values, infos))
