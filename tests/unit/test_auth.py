"""API-key checks (frontends/auth.py): which headers and metadata carry the key, what a missing or wrong one
answers in each protocol, and that the probes stay open."""

import asyncio
import os
import re
import subprocess
import sys

import grpc
import pytest

from mindspore_serving.common import errors
from mindspore_serving.frontends.api_groups import GROUPS, Access, grpc_group, http_group
from mindspore_serving.frontends.auth import MISSING, WRONG, ApiKey, ApiKeyInterceptor
from mindspore_serving.frontends.errors import Protocol, grpc_error, http_error, http_error_headers

KEY = ApiKey("k3y")


@pytest.mark.parametrize(
    "headers, failure",
    [
        ([(b"authorization", b"Bearer k3y")], None),
        ([(b"Authorization", b"bearer  k3y ")], None),
        ([(b"x-api-key", b"k3y")], None),
        ([(b"x-api-key", b"wrong"), (b"authorization", b"Bearer k3y")], None),
        ([], MISSING),
        ([(b"authorization", b"k3y")], MISSING),  # no scheme
        ([(b"authorization", b"Basic azN5")], MISSING),
        ([(b"authorization", b"Bearer k3")], WRONG),
        ([(b"x-api-key", b"k3y2")], WRONG),
    ],
)
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

    return handler, asyncio.run(
        ApiKeyInterceptor(Access("k3y")).intercept_service(continuation, Details(method, metadata))
    )


@pytest.mark.parametrize(
    "method",
    [
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/inference.GRPCInferenceService/ServerReady",
        "/inference.GRPCInferenceService/ModelReady",
    ],
)
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


@pytest.mark.parametrize(
    "method, path, group",
    [
        ("GET", "/health", "health"),
        ("GET", "/ready", "health"),
        ("GET", "/v2/health/live", "health"),
        ("GET", "/v2/models/add/versions/1/ready", "health"),
        ("GET", "/v2", "metadata"),
        ("GET", "/v2/models/add.add_common", "metadata"),
        ("GET", "/v2/models/add/versions/2", "metadata"),
        ("GET", "/v1/models", "metadata"),
        ("GET", "/v1/models/llama_tiny", "metadata"),
        ("GET", "/info", "metadata"),
        ("GET", "/metrics", "metrics"),
        ("POST", "/v2/repository/index", "model-repository"),
        ("POST", "/v2/repository/models/add/load", "model-repository"),
        ("GET", "/docs", "admin"),
        ("GET", "/openapi.json", "admin"),
        ("POST", "/model/add:add_common", "inference"),
        ("POST", "/v2/models/add/infer", "inference"),
        ("POST", "/v1/completions", "inference"),
        ("POST", "/generate", "inference"),
        ("POST", "/v1/models", "inference"),
    ],
)
def test_http_groups(method, path, group):
    assert http_group(method, path) == group


@pytest.mark.parametrize(
    "rpc, group",
    [
        ("/grpc.health.v1.Health/Watch", "health"),
        ("/inference.GRPCInferenceService/ServerLive", "health"),
        ("/inference.GRPCInferenceService/ModelMetadata", "metadata"),
        ("/inference.GRPCInferenceService/ModelStatistics", "metrics"),
        ("/inference.GRPCInferenceService/RepositoryModelUnload", "model-repository"),
        ("/inference.GRPCInferenceService/ModelInfer", "inference"),
        ("/mindspore.serving.proto.MSService/PredictStream", "inference"),
    ],
)
def test_grpc_groups(rpc, group):
    assert grpc_group(rpc) == group


def _bearer_of(key):
    return [(b"authorization", b"Bearer " + key.encode())]


def test_restricted_groups_need_their_own_key_and_opened_ones_none():
    access = Access("main", restricted={"model-repository": "admin", "admin": "admin"}, opened=["metrics"])
    assert access.check_http("POST", "/model/add:add_common", _bearer_of("main")) is None
    assert access.check_http("POST", "/model/add:add_common", _bearer_of("admin")).message == WRONG
    assert access.check_http("POST", "/v2/repository/models/add/load", _bearer_of("main")).message == WRONG
    assert access.check_http("POST", "/v2/repository/models/add/load", _bearer_of("admin")) is None
    assert access.check_http("GET", "/metrics", []) is None and access.check_http("GET", "/health", []) is None
    assert access.check_grpc("/inference.GRPCInferenceService/RepositoryIndex", (("authorization", "Bearer main"),))
    assert access.check_grpc("/inference.GRPCInferenceService/ModelStatistics", ()) is None
    assert access.is_operator({"headers": _bearer_of("admin")})
    assert not access.is_operator({"headers": _bearer_of("main"), "client": ("127.0.0.1", 1)})


def test_without_any_key_only_a_restricted_group_is_guarded():
    assert not Access().guarded
    access = Access(restricted={"health": "probe-key"})
    assert access.guarded and access.check_http("GET", "/ready", []).message == MISSING
    assert access.check_http("POST", "/model/add:add_common", []) is None
    assert Access().is_operator({"client": ("127.0.0.1", 5)}) and not Access().is_operator({"client": ("10.0.0.1", 5)})
    assert Access(opened=["admin"]).is_operator({"client": ("10.0.0.1", 5)})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(opened=["nope"]), "open_api: unknown API group 'nope'; the groups are " + ", ".join(GROUPS)),
        (dict(restricted={"infer": "k"}), "restricted_api: unknown API group 'infer'"),
        (dict(restricted={"metrics": "k"}, opened=["metrics"]), "metrics cannot be both restricted and open"),
    ],
)
def test_bad_group_settings(kwargs, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        Access("k", **kwargs)


def test_the_key_comes_from_the_environment_a_file_or_the_call(tmp_path, monkeypatch):
    code = "from mindspore_serving.master import master; print(master.get_api_key())"
    env = {**os.environ, "MS_SERVING_API_KEY": "from-env"}
    assert (
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()
        == "from-env"
    )
    from mindspore_serving.master import master  # pylint: disable=import-outside-toplevel
    from mindspore_serving.server.master import context  # pylint: disable=import-outside-toplevel

    monkeypatch.setitem(master._settings, "api_key", None)  # pylint: disable=protected-access
    key_file = tmp_path / "key"
    key_file.write_text("from-file\nignored\n")
    context.set_api_key(key_file=str(key_file))
    assert master.get_api_key() == "from-file"
    context.set_api_key("from-call")
    assert master.get_api_key() == "from-call"
    key_file.write_text("\n")
    for kwargs, message in [
        ({"key_file": str(key_file)}, "is empty"),
        ({"key_file": str(tmp_path / "none")}, "read the API key from"),
        ({"key": " spaced "}, "without surrounding spaces"),
        ({"key": "a", "key_file": str(key_file)}, "cannot both be set"),
    ]:
        with pytest.raises(RuntimeError, match=message):
            context.set_api_key(**kwargs)
    assert master.get_api_key() == "from-call"
