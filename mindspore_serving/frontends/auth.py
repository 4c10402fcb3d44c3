"""API-key authentication of the public front ends (`--api_key`, `server.master.context.set_api_key`).

With a key set every REST route and every RPC needs it, except the health probes, which load balancers and Kubernetes
call without credentials: REST `/health`, `/ready`, `/v2/health/live|ready` and `/v2/models/<m>[/versions/<v>]/ready`;
gRPC `grpc.health.v1.Health` and KServe's `ServerLive`, `ServerReady` and `ModelReady`; and the API groups opened or
given keys of their own (api_groups.py). REST takes `Authorization: Bearer <key>` (what the OpenAI and Hugging Face
clients send) or `x-api-key: <key>`; gRPC the metadata `authorization: Bearer <key>` (MindSpore Serving's
`Client(api_key=...)`, tritonclient's `headers=`). Keys are compared in constant time. A request without the key gets
401 in its protocol's error shape (frontends/errors.py) with `WWW-Authenticate: Bearer`, an RPC UNAUTHENTICATED; the
reply never says what the key is, only that it is missing or wrong."""

import hmac
import ipaddress
from collections.abc import Iterable

import grpc

from mindspore_serving.common import errors

MISSING = "Unauthorized: this server needs an API key (Authorization: Bearer <key>)"
WRONG = "Unauthorized: the API key is not valid"


class ApiKey:
    def __init__(self, key: str):
        if not key:
            raise ValueError("an API key must not be empty")
        self._key = key.encode()

    def check_http(self, headers: Iterable[tuple[bytes, bytes]]) -> errors.Unauthenticated | None:
        """None when the request's headers carry the key, else the error to answer with."""
        given = None
        for name, value in headers:
            name = name.lower()
            if name == b"authorization":
                given = _bearer(value)
            elif name == b"x-api-key" and given is None:
                given = value.strip()
        return self._verdict(given)

    def check_grpc(self, metadata) -> errors.Unauthenticated | None:
        given = None
        for name, value in metadata or ():
            if name.lower() == "authorization":
                given = _bearer(value.encode() if isinstance(value, str) else value)
        return self._verdict(given)

    def _verdict(self, given: bytes | None) -> errors.Unauthenticated | None:
        if given is not None and hmac.compare_digest(given, self._key):
            return None
        return errors.Unauthenticated(MISSING if given is None else WRONG)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bearer(value: bytes) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` value; None for another scheme."""
    scheme, _, token = value.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Ends every RPC without the key its group needs with UNAUTHENTICATED, before its handler runs;
    `access.check_grpc(method, metadata)` says (api_groups.Access)."""

    def __init__(self, access):
        self.access = access

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        failure = self.access.check_grpc(handler_call_details.method, handler_call_details.invocation_metadata)
        if failure is None:
            return handler
        return _refusing(handler, failure.message)


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only ends the call with UNAUTHENTICATED."""

    async def unary(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pylint: disable=unreachable

    options = dict(request_deserializer=None, response_serializer=None)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **options)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **options)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **options)
    return grpc.stream_stream_rpc_method_handler(streaming, **options)
