"""`--api_key`: the secured server (secured_server.py: add and the tiny LLM, two front ends, so that the front-end
process is checked too) wants the key on every route and RPC but the probes. Without it or with a wrong one,
each protocol answers 401 in its own shape (gRPC UNAUTHENTICATED); with it, the real clients work unchanged: ours
with `api_key=`, `openai` with `api_key=`, huggingface_hub with `token=`, plain HTTP with `Authorization: Bearer`
or `x-api-key`."""

import os

import grpc
import numpy as np
import pytest
import requests
from client_venv import require_clients, run_check
from grpc_health.v1 import health_pb2, health_pb2_grpc
from secured_server import ADD_BODY, ADMIN, ADMIN_KEY, KEY, PROMPT, TRIES, X
from serving_process import SERVABLES

from mindspore_serving.client import Client
from mindspore_serving.proto import grpc_predict_v2_pb2 as kserve_pb2
from mindspore_serving.proto import grpc_predict_v2_pb2_grpc as kserve_grpc
from mindspore_serving.proto import ms_service_pb2


@pytest.mark.parametrize(
    "path, body, shape",
    [
        ("/model/add:add_common", ADD_BODY, lambda body: set(body) == {"error_msg"}),
        ("/v2/models/add.add_common/infer", {"inputs": []}, lambda body: set(body) == {"error"}),
        (
            "/v1/completions",
            {"model": "llama_tiny", "prompt": PROMPT},
            lambda body: (
                body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"
            ),
        ),
        ("/generate", {"inputs": PROMPT}, lambda body: body["error_type"] == "unauthenticated"),
    ],
)
def test_rest_without_the_key_gets_401_in_its_protocols_shape(server, path, body, shape):
    _, url = server
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": KEY}):
        for _ in range(TRIES // 2):
            reply = requests.post(url + path, json=body, headers=headers, timeout=30)
            assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer", reply.text
            assert shape(reply.json()), reply.text
            assert KEY not in reply.text


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/llama_tiny", "/info", "/v2", "/v2/models/add.add_common"])
def test_metadata_needs_the_key_too(server, path):
    _, url = server
    assert requests.get(url + path, timeout=30).status_code == 401
    assert requests.get(url + path, headers={"x-api-key": KEY}, timeout=30).status_code == 200


@pytest.mark.parametrize("path", ["/docs", "/openapi.json", "/v2/repository/index"])
def test_the_restricted_groups_need_their_own_key(server, path):
    """--restricted_api model-repository,admin=ADMIN_KEY: the server's key is not enough there, nor is theirs
    anywhere else."""
    _, url = server
    method = requests.post if path.startswith("/v2/repository") else requests.get
    for _ in range(TRIES // 2):
        for headers in ({}, {"x-api-key": KEY}):
            reply = method(url + path, headers=headers, timeout=30)
            assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer", reply.text
        assert method(url + path, headers=ADMIN, timeout=30).status_code == 200
    assert requests.post(url + "/model/add:add_common", json=ADD_BODY, headers=ADMIN, timeout=30).status_code == 401


def test_the_opened_metrics_group_needs_no_key(server):
    _, url = server
    for _ in range(TRIES // 2):
        reply = requests.get(url + "/metrics", timeout=30)
        assert reply.status_code == 200 and "mindspore_serving" in reply.text


def test_ready_shows_worker_details_to_the_admin_key_only(server):
    _, url = server
    for _ in range(TRIES // 2):
        for headers in ({}, {"x-api-key": KEY}):
            body = requests.get(url + "/ready", headers=headers, timeout=30).json()
            assert "workers" not in body["servables"]["add"] and "pid" not in str(body), body
        body = requests.get(url + "/ready", headers=ADMIN, timeout=30).json()
        assert body["servables"]["add"]["workers"][0]["pid"] > 0, body


def test_probes_are_open(server):
    grpc_addr, url = server
    for path in ("/health", "/ready", "/v2/health/live", "/v2/health/ready", "/v2/models/add.add_common/ready"):
        assert requests.get(url + path, timeout=10).status_code == 200, path
    with grpc.insecure_channel(grpc_addr) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert (
            kserve_grpc.GRPCInferenceServiceStub(channel).ServerReady(kserve_pb2.ServerReadyRequest(), timeout=10).ready
        )


def test_rest_with_the_key(server):
    _, url = server
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"}, {"X-API-Key": KEY}):
        for _ in range(TRIES):
            reply = requests.post(url + "/model/add:add_common", json=ADD_BODY, headers=headers, timeout=30)
            assert reply.json() == {"instances": [{"y": (X * 2).tolist()}]}


def test_grpc_client_with_and_without_the_key(server):
    grpc_addr, _ = server
    for _ in range(TRIES):
        assert (
            Client(grpc_addr, "add", "add_common")
            .infer({"x1": X, "x2": X})["error"]
            .startswith("Grpc Error, (16, 'unauthenticated')")
        )
        assert (
            Client(grpc_addr, "add", "add_common", api_key="wrong").infer({"x1": X, "x2": X})["error"]
            == "Grpc Error, (16, 'unauthenticated'), Unauthorized: the API key is not valid"
        )
        result = Client(grpc_addr, "add", "add_common", api_key=KEY).infer({"x1": X, "x2": X})
        np.testing.assert_array_equal(result[0]["y"], X * 2)
    assert (
        "error"
        in list(
            Client(grpc_addr, "llama_tiny", "generate").infer_stream({"prompt": PROMPT, "max_new_tokens": np.int32(2)})
        )[-1]
    )
    streamed = list(
        Client(grpc_addr, "llama_tiny", "generate", api_key=KEY).infer_stream(
            {"prompt": PROMPT, "max_new_tokens": np.int32(2), "ignore_eos": np.bool_(True)}
        )
    )
    assert streamed[-1].get("finished"), streamed[-1]


def test_kserve_grpc_needs_the_key_as_metadata(server):
    grpc_addr, _ = server
    request = kserve_pb2.ModelInferRequest(model_name="add.add_common")
    for name in ("x1", "x2"):
        request.inputs.add(name=name, datatype="FP32", shape=[2, 2]).contents.fp32_contents.extend([1, 2, 3, 4])
    with grpc.insecure_channel(grpc_addr) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = stub.ModelInfer(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=30)
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [2, 4, 6, 8]


def test_openai_and_huggingface_clients(server):
    openai = pytest.importorskip("openai")
    huggingface_hub = pytest.importorskip("huggingface_hub")
    _, url = server
    with openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60) as client:
        completion = client.completions.create(model="llama_tiny", prompt=PROMPT, max_tokens=3, temperature=0)
        assert completion.usage.completion_tokens == 3
    with openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0, timeout=60) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    text = huggingface_hub.InferenceClient(model=url, token=KEY, timeout=60).text_generation(
        PROMPT, max_new_tokens=3, return_full_text=False
    )
    assert isinstance(text, str) and text
    with pytest.raises(Exception) as info:  # huggingface_hub words a TGI error_type it does not know as UnknownError
        huggingface_hub.InferenceClient(model=url, token="wrong", timeout=60).text_generation(PROMPT, max_new_tokens=3)
    http_error = info.value if isinstance(info.value, huggingface_hub.errors.HfHubHTTPError) else info.value.__cause__
    assert http_error.response.status_code == 401 and "API key is not valid" in str(info.value)


def test_triton_clients_with_headers(server, tmp_path):
    grpc_addr, url = server
    require_clients()
    run_check(
        "triton_checks.py",
        "--http",
        url[len("http://") :],
        "--grpc",
        grpc_addr,
        "--api_key",
        KEY,
        "--images",
        os.path.join(SERVABLES, "lenet", "images"),
        "api_key",
        cwd=str(tmp_path),
    )


def test_model_control_is_off_by_default(server):
    """Started without --model_control explicit, no client can load or unload, with the key or not, on either
    front end; the servable keeps serving."""
    grpc_addr, url = server
    for action in ("load", "unload") * (TRIES // 2):
        reply = requests.post(f"{url}/v2/repository/models/add/{action}", headers=ADMIN, timeout=30)
        assert reply.status_code == 403 and "model control is off" in reply.json()["error"], reply.text
        reply = requests.post(f"{url}/v2/repository/models/add/{action}", headers={"x-api-key": KEY}, timeout=30)
        assert reply.status_code == 401, reply.text
    with grpc.insecure_channel(grpc_addr) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = kserve_pb2.RepositoryModelUnloadRequest(model_name="add")
        for key, code in ((KEY, grpc.StatusCode.UNAUTHENTICATED), (ADMIN_KEY, grpc.StatusCode.PERMISSION_DENIED)):
            with pytest.raises(grpc.RpcError) as failure:
                stub.RepositoryModelUnload(request, timeout=30, metadata=(("authorization", f"Bearer {key}"),))
            assert failure.value.code() == code, failure.value.details()
    reply = requests.post(url + "/model/add:add_common", json=ADD_BODY, headers={"x-api-key": KEY}, timeout=30)
    assert reply.json()["instances"][0]["y"] == (X + X).tolist(), reply.text


def _rpcs():
    """(path, request, server-streaming) of every RPC of the public port but the probes."""
    probes = {"ServerLive", "ServerReady", "ModelReady"}
    rpcs = []
    for module in (kserve_pb2, ms_service_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if method.name not in probes:
                    request = getattr(module, method.input_type.name)()
                    rpcs.append((f"/{service.full_name}/{method.name}", request, method.server_streaming))
    return rpcs


@pytest.mark.parametrize("path, request_message, streaming", _rpcs(), ids=[rpc[0] for rpc in _rpcs()])
def test_every_rpc_but_the_probes_needs_the_key(server, path, request_message, streaming):
    grpc_addr, _ = server
    # the model-repository group wants the admin key: the main key does not open it either
    keys = [None, "wrong"] + ([KEY] if "/Repository" in path else [])
    with grpc.insecure_channel(grpc_addr) as channel:
        kind = channel.unary_stream if streaming else channel.unary_unary
        call = kind(
            path, request_serializer=type(request_message).SerializeToString, response_deserializer=lambda data: data
        )
        for key in keys:
            metadata = None if key is None else (("authorization", f"Bearer {key}"),)
            with pytest.raises(grpc.RpcError) as info:
                reply = call(request_message, metadata=metadata, timeout=30)
                if streaming:
                    list(reply)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, (key, info.value)
