"""The distributed worker <-> rank agents boundary (distributed.proto), for `server.distributed`.

The worker serves `DistributedWorker` on the user's distributed_address (TCP: agents may run on other hosts);
`startup_agents` reads the config there, and each rank agent registers its address and tensor infos. The worker
then calls `RankAgent.Predict` on every rank of a stage; each call has RANK_PREDICT_TIMEOUT.

With MS_SERVING_DISTRIBUTED_SECRET set (the same on every host of the servable), both services want it as the
metadata `ms-serving-distributed-secret` of every call and refuse others with PERMISSION_DENIED. With the
MS_SERVING_DISTRIBUTED_TLS_* variables set (ipc.internal_tls), both sides speak mutual TLS. Build the servers with
`server()` and `listen()`, the channels with `channel()`.

Without the secret anyone who reaches a port may call it, so the peers also prove who they are with tokens that
only the registration handed out: each rank makes a call token and sends it in RegisterAgent, and the worker's
Predict and Exit calls to that rank carry it; the worker answers with a notice token for the rank, which the
rank passes to its starter on the start-up pipe (`ready_line`) and which AgentExit and AgentFailed carry. Only
AgentFailed of a starter none of whose ranks registered yet goes without one, while ranks still register.
`exposure_warning` says when a port is open beyond its host with neither the secret nor TLS.
"""

import collections
import hmac
import ipaddress
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Any

import grpc
import numpy as np

from mindspore_serving.common import tensor_codec
from mindspore_serving.ipc import internal_tls
from mindspore_serving.proto import distributed_pb2 as dpb

DISTRIBUTED_PROTOCOL_VERSION = 2
RANK_PREDICT_TIMEOUT = 10.0  # seconds the worker waits for one rank's result (as MindSpore Serving)
MAX_MSG_BYTES = 512 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MSG_BYTES), ("grpc.max_receive_message_length", MAX_MSG_BYTES)]

SECRET_ENV = "MS_SERVING_DISTRIBUTED_SECRET"
SECRET_METADATA = "ms-serving-distributed-secret"

READY_PREFIX = b"ready"  # a rank agent writes `ready_line` on its start-up pipe once it has registered
READY_LINE = READY_PREFIX + b"\n"  # a ready line without a notice token
FAILED_PREFIX = b"failed: "  # ... or this, followed by the reason and a newline


def new_token() -> str:
    """A call or notice token: 256 random bits in hex."""
    return secrets.token_hex(32)


def same_token(given: str, expected: str) -> bool:
    """Whether a token a call carries is the expected one (never for an empty one)."""
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


def ready_line(notice_token: str) -> bytes:
    return READY_PREFIX + b" " + notice_token.encode() + b"\n"


def read_ready_line(buffer: bytes) -> str | None:
    """The notice token of a complete ready line at the start of `buffer` ("" for READY_LINE); None otherwise."""
    line, newline, _ = buffer.partition(b"\n")
    if not newline or not (line == READY_PREFIX or line.startswith(READY_PREFIX + b" ")):
        return None
    return line[len(READY_PREFIX) + 1 :].decode(errors="replace")


def tensor_infos_to_proto(infos: Sequence[tuple[tuple, np.dtype]]) -> list[dpb.TensorInfo]:
    return [dpb.TensorInfo(shape=list(shape), dtype=tensor_codec.dtype_to_proto(dtype)) for shape, dtype in infos]


def tensor_infos_from_proto(infos: Iterable[dpb.TensorInfo]) -> list[tuple[tuple, np.dtype]]:
    return [(tuple(info.shape), tensor_codec.proto_to_dtype(info.dtype)) for info in infos]


def arrays_to_tensors(arrays: Sequence[np.ndarray], repeated_field: Any) -> None:
    """Appends `arrays` as Tensor messages to `repeated_field` (a message's repeated Tensor field)."""
    for array in arrays:
        tensor_codec.value_to_tensor(np.asarray(array, order="C"), repeated_field.add())


def tensors_to_arrays(tensors: Iterable[Any]) -> list[np.ndarray]:
    return [tensor_codec.tensor_to_value(tensor) for tensor in tensors]


def _secret() -> str | None:
    return os.environ.get(SECRET_ENV) or None


def _is_loopback(address: str) -> bool:
    """Whether a server's `host:port` (or `[v6]:port`, `unix:path`) listens on this host only."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def exposure_warning(address: str, who: str, exposed: str) -> str | None:
    """The warning to log when `who` listens on `address` beyond this host with neither the secret nor TLS set
    (`exposed`: what a stranger who reaches it can then do); None otherwise."""
    if _is_loopback(address) or _secret() is not None or internal_tls.from_env(internal_tls.DISTRIBUTED_PREFIX):
        return None
    return (
        f"{who} on {address} can be reached beyond this host, and neither {SECRET_ENV} nor "
        f"{'/'.join(internal_tls.variable_names(internal_tls.DISTRIBUTED_PREFIX))} is set: {exposed}. Set "
        f"{SECRET_ENV} to the same random value on every host of the servable, give each host a certificate "
        f"of one CA (those variables, or ssl_config=), or keep the address on a private network"
    )


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _SendSecret(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, secret: str) -> None:
        self._secret = secret

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: object
    ) -> Any:
        metadata = [*(details.metadata or ()), (SECRET_METADATA, self._secret)]
        return continuation(
            _CallDetails(
                details.method,
                details.timeout,
                metadata,
                details.credentials,
                getattr(details, "wait_for_ready", None),
                getattr(details, "compression", None),
            ),
            request,
        )


def _refuse(_request: object, context: grpc.ServicerContext) -> None:
    context.abort(
        grpc.StatusCode.PERMISSION_DENIED,
        f"the call does not carry this servable's {SECRET_ENV} (metadata {SECRET_METADATA})",
    )


class _WantSecret(grpc.ServerInterceptor):
    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()
        self._refusal = grpc.unary_unary_rpc_method_handler(_refuse)

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        for key, value in details.invocation_metadata or ():
            if key == SECRET_METADATA and hmac.compare_digest(str(value).encode(), self._secret):
                return continuation(details)
        return self._refusal


def channel(address: str) -> grpc.Channel:
    """A channel to a DistributedWorker or RankAgent service; it sends the secret when one is set."""
    plain = internal_tls.open_channel(address, CHANNEL_OPTIONS, internal_tls.from_env(internal_tls.DISTRIBUTED_PREFIX))
    secret = _secret()
    return plain if secret is None else grpc.intercept_channel(plain, _SendSecret(secret))


def server(executor: Executor) -> grpc.Server:
    """A server for the DistributedWorker or RankAgent service; it wants the secret when one is set."""
    secret = _secret()
    return grpc.server(executor, options=CHANNEL_OPTIONS, interceptors=() if secret is None else (_WantSecret(secret),))


def listen(server_: grpc.Server, address: str) -> int:
    """Adds `address` to a server of `server()`: with mutual TLS when the MS_SERVING_DISTRIBUTED_TLS_* variables are
    set. Returns the port (0: it cannot listen there)."""
    return internal_tls.add_port(server_, address, internal_tls.from_env(internal_tls.DISTRIBUTED_PREFIX))
