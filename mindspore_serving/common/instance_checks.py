"""The checks of a request's instances that master and worker share, in MindSpore Serving's words.

The master checks every tensor of an instance before it routes it (`check_instance` with `check_tensor`): a
malformed tensor never reaches a worker. The worker checks only that every declared input is there.
"""

import math
from collections.abc import Callable, Mapping, Sequence

from mindspore_serving.common.tensor_codec import PROTO_TO_NUMPY, STRING_TYPES, format_shape, proto_type_name
from mindspore_serving.proto import ms_service_pb2 as pb

_ITEM_SIZES = {code: dtype.itemsize for code, dtype in PROTO_TO_NUMPY.items()}


def check_tensor(tensor: pb.Tensor) -> str | None:
    """Why a request tensor is malformed (the `detail` text of MindSpore Serving), or None."""
    dims = tensor.shape.dims[:]  # a list; slicing is the fast way out of the repeated field
    if tensor.dtype in STRING_TYPES:
        if len(tensor.bytes_val) != 1:
            return "Instance tensor check failed: bytes or string type shape batch size can only be 1"
        if dims and dims != [1]:
            return (
                "Instance tensor check failed: bytes or string type input  shape can only be (1,) or empty, "
                f"but given shape is {format_shape(dims)}"
            )
        return None
    if dims and min(dims) <= 0:
        zero_dim = False
        for dim in dims:
            if dim < 0 or zero_dim:
                return f"Tensor check failed: input  shape {format_shape(dims)} invalid"
            zero_dim = zero_dim or dim == 0
    item_size = _ITEM_SIZES.get(tensor.dtype)
    if item_size is None:
        return f"Tensor check failed: input data type proto::{proto_type_name(tensor.dtype)} invalid"
    expected = math.prod(dims) * item_size
    size = len(tensor.data)
    if size == expected and size:  # data is set, so shm_data (the other member of the oneof) is not
        return None
    if tensor.WhichOneof("tensor_data") == "shm_data":
        if tensor.shm_data.data_size != expected:
            return (
                f"Tensor check failed: input shared memory data size {tensor.shm_data.data_size} "
                f"not equal to expected size {expected}"
            )
        return None
    if len(tensor.data) != expected:
        return f"Tensor check failed: input data size {len(tensor.data)} invalid"
    return None


def check_instance(
    items: Mapping[str, object],
    input_names: Sequence[str],
    servable_name: str,
    method_name: str,
    check_item: Callable[[object], str | None] | None = None,
) -> str | None:
    """Why an instance cannot enter a method (MindSpore Serving's text), or None.

    `items` maps input names to values (an Instance's `items`, or a decoded instance). The master passes
    `check_tensor` as `check_item` to refuse malformed tensors before routing; the worker checks only that
    every input is there, since what reaches it has passed the master's check. Items the method does not
    declare are ignored, as MindSpore Serving ignores them (its master looks up only the declared names)."""
    for name in input_names:
        if name not in items:
            return f"Cannot find input {name} in instance input , servable {servable_name}, method {method_name}"
        if check_item is not None:
            detail = check_item(items[name])
            if detail:
                return f"Instances input {name} check failed, detail: {detail}"
    return None
