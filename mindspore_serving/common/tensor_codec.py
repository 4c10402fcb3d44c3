"""Instances <-> the public gRPC messages (the checks of a request's instances are in instance_checks.py).

An *instance* is a `dict[str, value]`; a value is a numpy array (numeric or bool, any shape, 0-d for
scalars), a Python `str` (MS_STRING) or `bytes` (MS_BYTES). On the wire (`ms_service.proto`):
- numbers: `Tensor.data` holds the raw little-endian C-order bytes, `shape.dims` the shape;
- str/bytes: one element of `Tensor.bytes_val` (str as UTF-8), dims `[]` (or `[1]` from clients).
All functions here are pure: no I/O, no globals besides constant tables.
"""

import math
from collections.abc import Iterable, Sequence
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt

from mindspore_serving.common import errors
from mindspore_serving.proto import ms_service_pb2 as pb

# (numpy dtype, proto DataType)
_NUMERIC = (
    (np.dtype(np.bool_), pb.MS_BOOL),
    (np.dtype(np.int8), pb.MS_INT8),
    (np.dtype(np.uint8), pb.MS_UINT8),
    (np.dtype(np.int16), pb.MS_INT16),
    (np.dtype(np.uint16), pb.MS_UINT16),
    (np.dtype(np.int32), pb.MS_INT32),
    (np.dtype(np.uint32), pb.MS_UINT32),
    (np.dtype(np.int64), pb.MS_INT64),
    (np.dtype(np.uint64), pb.MS_UINT64),
    (np.dtype(np.float16), pb.MS_FLOAT16),
    (np.dtype(np.float32), pb.MS_FLOAT32),
    (np.dtype(np.float64), pb.MS_FLOAT64),
)
NUMPY_TO_PROTO: dict[np.dtype, int] = dict(_NUMERIC)
PROTO_TO_NUMPY: dict[int, np.dtype] = {code: dtype for dtype, code in _NUMERIC}
STRING_TYPES = (pb.MS_STRING, pb.MS_BYTES)

_UTF8_ERRORS = "surrogateescape"  # str <-> bytes round-trips even for invalid UTF-8


# ----------------------------------------------------------------------------------------------- dtypes


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


def dtype_to_proto(dtype: npt.DTypeLike) -> int:
    """The DataType of a numeric/bool numpy dtype; TypeError "Unknown data type <dtype>" otherwise."""
    dtype = np.dtype(dtype)
    code = NUMPY_TO_PROTO.get(_native(dtype))
    if code is None:
        raise TypeError(f"Unknown data type {dtype}")
    return code


def proto_to_dtype(code: int) -> np.dtype:
    """The numpy dtype of a numeric/bool DataType; ValueError for MS_STRING, MS_BYTES and unknown values."""
    dtype = PROTO_TO_NUMPY.get(int(code))
    if dtype is None:
        raise ValueError(f"DataType {proto_type_name(code)} has no numpy dtype")
    return dtype


def proto_type_name(code: int) -> str:
    """`MS_FLOAT32` etc., `MS_UNKNOWN` for values outside the enum."""
    try:
        name: str = pb.DataType.Name(int(code))
    except ValueError:
        return "MS_UNKNOWN"
    return name


class ShapedStr(str):
    """A str that arrived with a shape other than [] or [1] (e.g. REST `[["a"]]`). It is still a str;
    `dims` keeps the shape so the master's input check rejects it with MindSpore Serving's text."""

    dims: tuple[int, ...]

    def __new__(cls, value: str, dims: Sequence[int]) -> "ShapedStr":
        obj = super().__new__(cls, value)
        obj.dims = tuple(int(d) for d in dims)
        return obj


class ShapedBytes(bytes):
    """The bytes counterpart of ShapedStr."""

    dims: tuple[int, ...]

    def __new__(cls, value: bytes, dims: Sequence[int]) -> "ShapedBytes":
        obj = super().__new__(cls, value)
        obj.dims = tuple(int(d) for d in dims)
        return obj


def format_shape(dims: Iterable[int]) -> str:
    """A shape as MindSpore Serving prints it: `[1, 2]`, `[]`."""
    return "[" + ", ".join(str(int(d)) for d in dims) + "]"


# ------------------------------------------------------------------------------------- value <-> tensor


def scalar_to_array(value: object) -> np.ndarray | None:
    """A numpy scalar, or a Python bool, int or float (as bool, int64, float64), as a 0-d array; None for any
    other value."""
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, bool):
        return np.array(value, np.bool_)
    if isinstance(value, int):
        return np.array(value, np.int64)
    if isinstance(value, float):
        return np.array(value, np.float64)
    return None


def _as_array(value: object) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    array = scalar_to_array(value)
    if array is None:
        raise TypeError(f"Not support value type {type(value)}")
    return array


def value_to_tensor(value: Any, tensor: pb.Tensor | None = None, string_dims: Sequence[int] = ()) -> pb.Tensor:
    """Writes one instance value into `tensor` (a new Tensor when None) and returns it.

    Numbers keep their dtype and shape; str/bytes become one `bytes_val` element with dims `string_dims`
    (`()` inside the server, `(1,)` as the client sends them; a ShapedStr/ShapedBytes keeps its own dims).
    Python bool/int/float and numpy scalars
    become 0-d arrays. TypeError for anything else, e.g. "Unknown data type <U3" for numpy str arrays."""
    if tensor is None:
        tensor = pb.Tensor()
    else:
        tensor.Clear()
    if isinstance(value, str):
        tensor.dtype = pb.MS_STRING
        tensor.shape.dims.extend(getattr(value, "dims", string_dims))
        tensor.bytes_val.append(value.encode("utf-8", _UTF8_ERRORS))
        return tensor
    if isinstance(value, (bytes, bytearray, memoryview)):
        tensor.dtype = pb.MS_BYTES
        tensor.shape.dims.extend(getattr(value, "dims", string_dims))
        tensor.bytes_val.append(bytes(value))
        return tensor
    array = value if type(value) is np.ndarray else _as_array(value)
    code = NUMPY_TO_PROTO.get(array.dtype)
    if code is None or array.dtype.byteorder == ">":  # NUMPY_TO_PROTO holds native dtypes only
        code = dtype_to_proto(array.dtype)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
    tensor.dtype = code
    tensor.shape.dims.extend(array.shape)
    tensor.data = array.tobytes()
    return tensor


# DataType -> (native dtype, little-endian dtype, itemsize, whether the host is little-endian for it)
_DECODE = {
    code: (dtype, dtype.newbyteorder("<"), dtype.itemsize, dtype.newbyteorder("<") == dtype)
    for code, dtype in PROTO_TO_NUMPY.items()
}


def tensor_to_value(tensor: pb.Tensor, copy: bool = True) -> Any:
    """The instance value of a checked Tensor.

    MS_STRING/MS_BYTES with one element give a str/bytes (a list when there are several); numbers give
    a numpy array of shape `dims`, writable when `copy`, else a read-only view of the message's bytes.
    ValueError when the data size does not match the shape, or for shared-memory tensors."""
    code = tensor.dtype
    decode = _DECODE.get(code)
    if decode is None:
        if code in STRING_TYPES:
            items = (
                [item.decode("utf-8", _UTF8_ERRORS) for item in tensor.bytes_val]
                if code == pb.MS_STRING
                else list(tensor.bytes_val)
            )
            return items[0] if len(items) == 1 else items
        if tensor.WhichOneof("tensor_data") == "shm_data":
            raise ValueError("Tensor with shared memory data is not supported")
        raise ValueError(f"DataType {proto_type_name(code)} has no numpy dtype")
    dtype, little, itemsize, native = decode
    data = tensor.data
    if not data and tensor.WhichOneof("tensor_data") == "shm_data":
        raise ValueError("Tensor with shared memory data is not supported")
    dims = tensor.shape.dims[:]
    if math.prod(dims) * itemsize != len(data) or (dims and min(dims) < 0):
        raise ValueError(f"Tensor check failed: input data size {len(data)} invalid")
    array = np.frombuffer(data, little).reshape(dims)
    if not native:  # big-endian host
        return array.astype(dtype)
    return array.copy() if copy else array


def instance_to_proto(
    instance: dict, instance_pb: pb.Instance | None = None, string_dims: Sequence[int] = ()
) -> pb.Instance:
    if instance_pb is None:
        instance_pb = pb.Instance()
    for name, value in instance.items():
        value_to_tensor(value, instance_pb.items[name], string_dims)
    return instance_pb


def proto_to_instance(instance_pb: pb.Instance, copy: bool = True) -> dict:
    return {name: tensor_to_value(tensor, copy) for name, tensor in instance_pb.items.items()}


def instances_to_proto(instances: Sequence[dict], repeated_field: Any, string_dims: Sequence[int] = ()) -> Any:
    """Appends one `Instance` per dict to a repeated Instance field (e.g. `request.instances`)."""
    for instance in instances:
        instance_to_proto(instance, repeated_field.add(), string_dims)
    return repeated_field


def proto_to_instances(repeated_field: Iterable[pb.Instance], copy: bool = True) -> list[dict]:
    return [proto_to_instance(instance_pb, copy) for instance_pb in repeated_field]


# ------------------------------------------------------------------------------------------- replies


def is_error(result: object) -> TypeGuard[errors.ServingError]:
    """Whether an entry of reply_to_results' list is an error (an instance's values are a dict)."""
    return not isinstance(result, dict)


def error_msg(error: errors.ServingError, empty_text: str = "") -> pb.ErrorMsg:
    """The public ErrorMsg of `error`; `empty_text` stands in for an empty message."""
    text = errors.client_text(error.message or empty_text).encode("utf-8", _UTF8_ERRORS)
    return pb.ErrorMsg(error_code=error.code, error_msg=text)


def reply_to_results(
    reply: pb.PredictReply, copy: bool = False
) -> errors.ServingError | list[dict | errors.ServingError]:
    """A reply read back (the front ends build it: frontends/replies.py): a ServingError for a global error,
    else a list with one dict or ServingError per instance. RuntimeError when the error count is not 0, 1 or the
    instance count."""
    error_count = len(reply.error_msg)
    if error_count == 1 and reply.error_msg[0].error_code != errors.OK:
        error_pb = reply.error_msg[0]
        return errors.make_error(error_pb.error_code, error_pb.error_msg.decode("utf-8", "replace"))
    instance_count = len(reply.instances)
    if error_count not in (0, instance_count):
        raise RuntimeError(f"error msg result size {error_count} not be 0, 1 or length of instances {instance_count}")
    results: list[dict | errors.ServingError] = []
    for index, instance_pb in enumerate(reply.instances):
        error_pb = reply.error_msg[index] if error_count else None
        if error_pb is not None and error_pb.error_code != errors.OK:
            results.append(errors.make_error(error_pb.error_code, error_pb.error_msg.decode("utf-8", "replace")))
        else:
            results.append(proto_to_instance(instance_pb, copy))
    return results
