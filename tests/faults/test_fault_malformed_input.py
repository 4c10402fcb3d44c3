"""A malformed-input sweep against a real server: every bad request gets its answer at once, with the right code
and MindSpore Serving's shape and text, and the server serves good requests afterwards.

RESTful answers of the classic route are HTTP 200 with `{"error_msg": ...}`, as MindSpore Serving answers every
error there; gRPC answers are OK replies with `error_msg`, except a request that is not a PredictRequest at all
(INVALID_ARGUMENT) and one over the message limit (RESOURCE_EXHAUSTED, gRPC's own).
"""

import grpc
import numpy as np
import pytest
import requests
from serving_process import start_server

from mindspore_serving.client import Client
from mindspore_serving.proto import ms_service_pb2 as pb

TIMEOUT_S = 10.0  # no bad request may make the server wait
X = [[1.0, 2.0], [3.0, 4.0]]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, grpc_addr, rest_addr = start_server(
        tmp_path_factory.mktemp("malformed"), servables=("add",), extra_args=["--grace", "1"]
    )
    try:
        yield grpc_addr, f"http://{rest_addr}"
    finally:
        proc.close()


REST_CASES = [
    ("add:add_common", b"not json", "Illegal JSON format."),
    (
        "add:add_common",
        b'{"instances":[{"x1":[[1,2],[3,4]],"x2":[[1,2],[3,4]]}]}',
        "Given model input 0 data type kMSI_Int32 not match the data type kMSI_Float32 defined in model",
    ),
    (
        "add:add_common",
        b'{"instances":[{"x1":[[1.0,2.0]],"x2":[[1.0,2.0]]}]}',
        "Given model input 0 size 8 not match the size 16 defined in model",
    ),
    ("add:add_common", b'{"instances":"x"}', "Parser request failed, instances no key mode is not supported"),
    ("add:add_common", b'{"instances":[]}', "Parser request failed, instances value is array type, but no value"),
    ("add:add_common", b"[" * 5000 + b"]" * 5000, "Illegal JSON format.depth limit exceeded"),
    ("add:add_common", b'{"instances":[{"x1":[[1.0,2.0],[3.0,4.0]]}]}', "Cannot find input x2 in instance input"),
    (
        "nope:add_common",
        b'{"instances":[{"x1":1}]}',
        "Request servable(nope) method(add_common) , servable is not available",
    ),
    ("add:nope", b'{"instances":[{"x1":1}]}', "Request servable(add) method(nope) , method is not available"),
    (
        "add/version/7:add_common",
        b'{"instances":[{"x1":1}]}',
        "Request servable(add) method(add_common)  version(7) , servable is not available",
    ),
]


@pytest.mark.parametrize(
    "target,body,message",
    REST_CASES,
    ids=[
        "bad-json",
        "dtype",
        "shape",
        "no-key",
        "empty",
        "deep-nesting",
        "missing-input",
        "unknown-servable",
        "unknown-method",
        "unknown-version",
    ],
)
def test_a_bad_restful_request_gets_mindspore_s_error(server, target, body, message):
    _, rest = server
    reply = requests.post(f"{rest}/model/{target}", data=body, timeout=TIMEOUT_S)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/json")
    assert message in reply.json()["error_msg"]


def test_an_oversize_restful_body_is_refused_without_reading_it_all(server):
    _, rest = server
    reply = requests.post(f"{rest}/model/add:add_common", data=b"a" * (101 << 20), timeout=TIMEOUT_S * 3)
    assert reply.status_code == 200 and reply.json() == {"error_msg": "http message is bigger than 104857600"}


def test_bad_grpc_requests_get_their_code_and_the_server_serves_on(server):
    grpc_addr, rest = server
    with grpc.insecure_channel(grpc_addr) as channel:
        raw = channel.unary_unary("/mindspore.serving.proto.MSService/Predict")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff garbage", timeout=TIMEOUT_S)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        predict = channel.unary_unary(
            "/mindspore.serving.proto.MSService/Predict",
            request_serializer=pb.PredictRequest.SerializeToString,
            response_deserializer=pb.PredictReply.FromString,
        )
        empty = predict(
            pb.PredictRequest(servable_spec=pb.ServableSpec(name="add", method_name="add_common")), timeout=TIMEOUT_S
        )
        assert "Instances count of request cannot be 0" in empty.error_msg[0].error_msg.decode()
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x00" * (101 << 20), timeout=TIMEOUT_S * 3)
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    client = Client(grpc_addr, "add", "add_common")
    wrong = client.infer({"x1": np.ones((2, 2), np.int32), "x2": np.ones((2, 2), np.int32)})
    assert "data type kMSI_Int32 not match" in wrong["error"]  # the request's only instance: a global error
    unknown = Client(grpc_addr, "nope", "add_common").infer({"x1": np.float32(1)})
    assert unknown["error"].endswith("servable is not available")
    good = client.infer({"x1": np.array(X, np.float32), "x2": np.array(X, np.float32)})
    np.testing.assert_array_equal(good[0]["y"], np.array(X) * 2)
    assert requests.post(
        f"{rest}/model/add:add_common", json={"instances": [{"x1": X, "x2": X}]}, timeout=TIMEOUT_S
    ).json()["instances"][0]["y"] == [[2.0, 4.0], [6.0, 8.0]]
