"""The client's conversions between Python values and the public gRPC messages (no network).

Requests: numpy arrays and numpy scalars keep their dtype and shape; str -> MS_STRING and bytes -> MS_BYTES
with dims [1]; Python bool/int/float -> `np.array((v,))` (shape (1,), bool/int64/float64). Replies: a list
of per-instance dicts (`{"error": msg}` for a failed instance), or the dict `{"error": msg}` for a global
error. Numbers come back as read-only numpy arrays (0-d for scalars), MS_STRING as str, MS_BYTES as bytes.
"""

import numpy as np

from mindspore_serving.common import tensor_codec
from mindspore_serving.proto import ms_service_pb2 as pb

_CLIENT_STRING_DIMS = (1,)


def _array_tensor(array: np.ndarray, tensor: pb.Tensor) -> pb.Tensor:
    try:
        return tensor_codec.value_to_tensor(array, tensor)
    except TypeError:
        raise RuntimeError(f"Unknown data type {array.dtype}") from None


def create_tensor(value, tensor: pb.Tensor) -> pb.Tensor:
    """Fills `tensor` from one input value, with the reference client's rules and RuntimeError texts."""
    if isinstance(value, (np.ndarray, np.number, np.bool_)):
        return _array_tensor(np.asarray(value), tensor)
    if isinstance(value, (str, bytes)):
        return tensor_codec.value_to_tensor(value, tensor, _CLIENT_STRING_DIMS)
    if isinstance(value, (bool, int, float)):
        return _array_tensor(np.array((value,)), tensor)
    raise RuntimeError(f"Not support value type {type(value)}")


def create_instance(instance: dict, instance_pb: pb.Instance) -> pb.Instance:
    for name, value in instance.items():
        create_tensor(value, instance_pb.items[name])
    return instance_pb


def create_request(instances, servable_name: str, method_name: str, version_number: int) -> pb.PredictRequest:
    """A PredictRequest for one dict or a list/tuple of dicts; RuntimeError "instance should be a map"."""
    if not isinstance(instances, (tuple, list)):
        instances = (instances,)
    request = pb.PredictRequest()
    request.servable_spec.name = servable_name
    request.servable_spec.method_name = method_name
    request.servable_spec.version_number = version_number
    for instance in instances:
        if not isinstance(instance, dict):
            raise RuntimeError("instance should be a map")
        create_instance(instance, request.instances.add())
    return request


def parse_reply(reply: pb.PredictReply):
    """A list of per-instance dicts (`{"error": msg}` when failed), or `{"error": msg}` for a global error."""
    results = tensor_codec.reply_to_results(reply, copy=False)
    if not isinstance(results, list):
        return {"error": results.message}
    return [{"error": result.message} if tensor_codec.is_error(result) else result for result in results]


def rpc_error_result(error) -> dict:
    """`{"error": "Grpc Error, (14, 'unavailable'), <details>"}` for a grpc.RpcError."""
    code = error.code()
    return {"error": f"Grpc Error, {code.value if code is not None else None}, {error.details()}"}
