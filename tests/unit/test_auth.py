"""API-key checks (frontends/auth.py): which headers and metadata carry the key, what a missing or wrong one
answers in each protocol, and that the probes stay open."""
import asyncio

import grpc
import pytest

from mindspore_serving.common import errors
from mindspore_serving.frontends.auth import MISSING, WRONG, ApiKey, ApiKeyInterceptor
from mindspore_serving.frontends.errors import Protocol, grpc_error, http_error, http_error_headers

KEY = ApiKey("k3y")


@pytest.mark.parametrize("headers, failure", [
    ([(b"authorization", b"Bearer k3y")], None),
    ([(b"Authorization", b"bearer  k3y ")], None),
    ([(b"x-api-key", b"k3y")], None),
    ([(b"x-api-key", b"wrong"), (b"authorization", b"Bearer k3y")], None),
    ([], MISSING),
    ([(b"authorization", b"k3y")], MISSING),           # no scheme
    ([(b"authorization", b"Basic azN5")], MISSING),
    ([(b"authorization", b"Bearer k3")], WRONG),
    ([(b"x-api-key", b"k3y2")], WRONG),
])
def test_http_headers(headers, failure):
    result = KEY.check_http(headers)
    assert (result.message if result else None) == failure


def test_grpc_metadata():
    assert KEY.check_grpc((("authorization", "Bearer k3y"),)) is None
    assert KEY.check_grpc(None).message == MISSING
    assert KEY.check_grpc((("authorization", "Bearer nope"),)).message == WRONG
    with pytest.raises(ValueError):
        ApiKey("")


def test_each_protocol_answers_401_and_grpc_unauthenticated():
    error = errors.Unauthenticated(MISSING)
    assert http_error(Protocol.MINDSPORE, error) == (401, {"error_msg": MISSING})
    assert http_error(Protocol.KSERVE, error) == (401, {"error": MISSING})
    assert http_error(Protocol.TGI, error) == (401, {"error": MISSING, "error_type": "unauthenticated"})
    status, body = http_error(Protocol.OPENAI, error)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert http_error_headers(error) == {"www-authenticate": "Bearer"}
    assert grpc_error(error)[0] is grpc.StatusCode.UNAUTHENTICATED


class Details:
    def __init__(self, method, metadata=()):
        self.method, self.invocation_metadata = method, metadata


class Context:
    async def abort(self, code, details):
        raise RuntimeError((code, details))


def intercepted(method, metadata=(), kind="unary_unary"):
    handler = getattr(grpc, f"{kind}_rpc_method_handler")(lambda request, context: "served")

    async def continuation(_details):
        return handler

    return handler, asyncio.run(ApiKeyInterceptor(KEY).intercept_service(continuation, Details(method, metadata)))


@pytest.mark.parametrize("method", ["/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch",
                                    "/inference.GRPCInferenceService/ServerReady",
                                    "/inference.GRPCInferenceService/ModelReady"])
def test_probes_need_no_key(method):
    handler, result = intercepted(method)
    assert result is handler


@pytest.mark.parametrize("kind", ["unary_unary", "unary_stream", "stream_unary", "stream_stream"])
def test_an_rpc_without_the_key_ends_unauthenticated_with_a_handler_of_its_shape(kind):
    handler, result = intercepted("/mindspore.serving.proto.MSService/Predict", kind=kind)
    assert result is not handler and getattr(result, kind) is not None
    behaviour = getattr(result, kind)

    async def call():
        outcome = behaviour(None, Context())
        if kind.endswith("stream"):
            async for _ in outcome:
                pass
        else:
            await outcome

    with pytest.raises(RuntimeError) as info:
        asyncio.run(call())
    assert info.value.args[0] == (grpc.StatusCode.UNAUTHENTICATED, MISSING)
    _, allowed = intercepted("/mindspore.serving.proto.MSService/Predict", (("authorization", "Bearer k3y"),), kind)
    assert getattr(allowed, kind)(None, None) == "served"
