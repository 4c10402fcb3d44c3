"""The distributed worker <-> rank agents boundary (distributed.proto), for `server.distributed`.

The worker serves `DistributedWorker` on the user's distributed_address (TCP: agents may run on other hosts);
`startup_agents` reads the config there, and each rank agent registers its address and tensor infos. The worker
then calls `RankAgent.Predict` on every rank of a stage; each call has RANK_PREDICT_TIMEOUT.

With MS_SERVING_DISTRIBUTED_SECRET set (the same on every host of the servable), both services want it as the
metadata `ms-serving-distributed-secret` of every call and refuse others with PERMISSION_DENIED. With the
MS_SERVING_DISTRIBUTED_TLS_* variables set (ipc.internal_tls), both sides speak mutual TLS. Build the servers with
`server()` and `listen()`, the channels with `channel()`.
"""
import collections
import hmac
import os
from typing import List, Optional, Sequence, Tuple

import grpc
import numpy as np

from mindspore_serving.common import tensor_codec
from mindspore_serving.ipc import internal_tls
from mindspore_serving.proto import distributed_pb2 as dpb

DISTRIBUTED_PROTOCOL_VERSION = 1
RANK_PREDICT_TIMEOUT = 10.0   # seconds the worker waits for one rank's result (as MindSpore Serving)
MAX_MSG_BYTES = 512 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MSG_BYTES),
                   ("grpc.max_receive_message_length", MAX_MSG_BYTES)]

SECRET_ENV = "MS_SERVING_DISTRIBUTED_SECRET"
SECRET_METADATA = "ms-serving-distributed-secret"

READY_LINE = b"ready\n"       # a rank agent writes it on its start-up pipe once it has registered
FAILED_PREFIX = b"failed: "   # ... or this, followed by the reason and a newline


def tensor_infos_to_proto(infos: Sequence[Tuple[tuple, np.dtype]]) -> List[dpb.TensorInfo]:
    return [dpb.TensorInfo(shape=list(shape), dtype=tensor_codec.dtype_to_proto(dtype)) for shape, dtype in infos]


def tensor_infos_from_proto(infos) -> List[Tuple[tuple, np.dtype]]:
    return [(tuple(info.shape), tensor_codec.proto_to_dtype(info.dtype)) for info in infos]


def arrays_to_tensors(arrays: Sequence[np.ndarray], repeated_field):
    for array in arrays:
        tensor_codec.value_to_tensor(np.ascontiguousarray(array), repeated_field.add())


def tensors_to_arrays(tensors) -> List[np.ndarray]:
    return [tensor_codec.tensor_to_value(tensor) for tensor in tensors]


def _secret() -> Optional[str]:
    return os.environ.get(SECRET_ENV) or None


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                             "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _SendSecret(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, secret: str):
        self._secret = secret

    def intercept_unary_unary(self, continuation, details, request):
        metadata = [*(details.metadata or ()), (SECRET_METADATA, self._secret)]
        return continuation(_CallDetails(details.method, details.timeout, metadata, details.credentials,
                                         getattr(details, "wait_for_ready", None),
                                         getattr(details, "compression", None)), request)


def _refuse(_request, context):
    context.abort(grpc.StatusCode.PERMISSION_DENIED,
                  f"the call does not carry this servable's {SECRET_ENV} (metadata {SECRET_METADATA})")


class _WantSecret(grpc.ServerInterceptor):
    def __init__(self, secret: str):
        self._secret = secret.encode()
        self._refusal = grpc.unary_unary_rpc_method_handler(_refuse)

    def intercept_service(self, continuation, details):
        for key, value in details.invocation_metadata or ():
            if key == SECRET_METADATA and hmac.compare_digest(str(value).encode(), self._secret):
                return continuation(details)
        return self._refusal


def channel(address: str) -> grpc.Channel:
    """A channel to a DistributedWorker or RankAgent service; it sends the secret when one is set."""
    plain = internal_tls.open_channel(address, CHANNEL_OPTIONS, internal_tls.from_env(internal_tls.DISTRIBUTED_PREFIX))
    secret = _secret()
    return plain if secret is None else grpc.intercept_channel(plain, _SendSecret(secret))


def server(executor) -> grpc.Server:
    """A server for the DistributedWorker or RankAgent service; it wants the secret when one is set."""
    secret = _secret()
    return grpc.server(executor, options=CHANNEL_OPTIONS, interceptors=() if secret is None else (_WantSecret(secret),))


def listen(server_: grpc.Server, address: str) -> int:
    """Adds `address` to a server of `server()`: with mutual TLS when the MS_SERVING_DISTRIBUTED_TLS_* variables are
    set. Returns the port (0: it cannot listen there)."""
    return internal_tls.add_port(server_, address, internal_tls.from_env(internal_tls.DISTRIBUTED_PREFIX))
