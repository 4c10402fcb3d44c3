"""End to end: serving_server.py with the bundled servables, real workers, gRPC and RESTful calls."""

import base64
import glob
import os

import numpy as np
import pytest
import requests
from serving_process import SERVABLES, start_server

from mindspore_serving.client import Client

IMAGES = sorted(glob.glob(os.path.join(SERVABLES, "lenet", "images", "*.png")))


def label_of(path):
    return os.path.basename(path).split("_")[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    proc, grpc_addr, rest_addr = start_server(
        tmp_path_factory.mktemp("classic"), servables=("add", "add_sub", "matmul", "lenet")
    )
    try:
        yield proc, grpc_addr, f"http://{rest_addr}"
    finally:
        proc.close()


def test_add_common_numbers(served):
    _, grpc_addr, _ = served
    x1 = np.random.rand(2, 2).astype(np.float32)
    x2 = np.random.rand(2, 2).astype(np.float32)
    result = Client(grpc_addr, "add", "add_common").infer([{"x1": x1, "x2": x2}] * 3)
    assert len(result) == 3
    for item in result:
        np.testing.assert_allclose(item["y"], x1 + x2, rtol=1e-6)


def test_add_cast_accepts_int32(served):
    _, grpc_addr, _ = served
    x1 = np.arange(4, dtype=np.int32).reshape(2, 2)
    result = Client(grpc_addr, "add", "add_cast").infer({"x1": x1, "x2": x1})
    np.testing.assert_array_equal(result[0]["y"], (x1 * 2).astype(np.float32))
    assert result[0]["y"].dtype == np.float32


def test_mixed_good_and_bad_instances(served):
    _, grpc_addr, _ = served
    good = np.ones((2, 2), np.float32)
    bad_dtype = np.ones((2, 2), np.int32)
    bad_size = np.ones((3, 2), np.float32)
    result = Client(grpc_addr, "add", "add_common").infer(
        [
            {"x1": good, "x2": good},
            {"x1": bad_dtype, "x2": good},
            {"x1": good, "x2": bad_size},
            {"x1": good, "x2": good},
        ]
    )
    np.testing.assert_array_equal(result[0]["y"], good * 2)
    assert "data type kMSI_Int32 not match the data type kMSI_Float32" in result[1]["error"]
    assert "size 24 not match the size 16" in result[2]["error"]
    np.testing.assert_array_equal(result[3]["y"], good * 2)


def test_missing_input_and_unknown_method(served):
    _, grpc_addr, _ = served
    x = np.ones((2, 2), np.float32)
    result = Client(grpc_addr, "add", "add_common").infer({"x1": x})
    assert (
        result == {"error": "Cannot find input x2 in instance input , servable add, method add_common"}
        or "Cannot find input x2" in result["error"]
    )
    result = Client(grpc_addr, "add", "no_such_method").infer({"x1": x, "x2": x})
    assert "method is not available" in result["error"]
    result = Client(grpc_addr, "no_such_servable", "m").infer({"x1": x})
    assert "servable is not available" in result["error"]
    result = Client(grpc_addr, "add", "add_common", version_number=7).infer({"x1": x, "x2": x})
    assert "servable is not available" in result["error"]


def test_add_sub_pipelines(served):
    _, grpc_addr, _ = served
    x1, x2, x3 = (np.random.rand(2, 2).astype(np.float32) for _ in range(3))
    only = Client(grpc_addr, "add_sub", "add_sub_only_model").infer({"x1": x1, "x2": x2, "x3": x3})
    np.testing.assert_allclose(only[0]["y"], x1 + x2 - x3, rtol=1e-5)
    complex_ = Client(grpc_addr, "add_sub", "add_sub_complex").infer([{"x1": x1, "x2": x2, "x3": x3}] * 2)
    for item in complex_:
        np.testing.assert_allclose(item["y"], 2 * ((x1 + 1) + x2 - x3), rtol=1e-5)


def test_matmul_subgraphs(served):
    _, grpc_addr, _ = served
    weights = np.load(os.path.join(SERVABLES, "matmul", "1", "weights.npz"))
    x1 = np.random.rand(128, 96).astype(np.float32)
    x2 = np.random.rand(8, 96).astype(np.float32)
    result = Client(grpc_addr, "matmul", "predict").infer({"x1": x1, "x2": x2})
    np.testing.assert_allclose(result[0]["y1"], x1 @ weights["w0"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(result[0]["y2"], x2 @ weights["w1"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["classify_top1", "classify_top1_batch"])
def test_lenet_three_instances_through_batch_two(served, method):
    _, grpc_addr, _ = served
    paths = IMAGES[:3]
    instances = [{"image": open(path, "rb").read()} for path in paths]
    result = Client(grpc_addr, "lenet", method).infer(instances)
    assert len(result) == 3
    assert [item["label"] for item in result] == [label_of(path) for path in paths]


def test_lenet_accuracy_over_bundled_images(served):
    _, grpc_addr, _ = served
    result = Client(grpc_addr, "lenet", "classify_top1").infer([{"image": open(p, "rb").read()} for p in IMAGES])
    correct = sum(item["label"] == label_of(path) for item, path in zip(result, IMAGES))
    assert correct >= 0.8 * len(IMAGES)


def test_stage_that_raises_fails_only_its_instance(served):
    _, grpc_addr, _ = served
    good = open(IMAGES[0], "rb").read()
    result = Client(grpc_addr, "lenet", "classify_top1").infer(
        [{"image": good}, {"image": b"not a png"}, {"image": good}]
    )
    assert result[0]["label"] == label_of(IMAGES[0])
    assert (
        "Call Function 'lenet.preprocess' Failed, method: 'classify_top1', stage index(begin with 1): 1"
        in result[1]["error"]
    )
    assert "<_io.BytesIO object>" in result[1]["error"] and " at 0x" not in result[1]["error"]  # PIL's repr, cut
    assert result[2]["label"] == label_of(IMAGES[0])


def test_async_inference(served):
    _, grpc_addr, _ = served
    x = np.ones((2, 2), np.float32)
    client = Client(grpc_addr, "add", "add_common")
    futures = [client.infer_async({"x1": x * i, "x2": x}) for i in range(8)]
    for i, future in enumerate(futures):
        np.testing.assert_array_equal(future.result()[0]["y"], x * i + x)


def test_restful_every_servable(served):
    _, _, url = served
    reply = requests.post(
        f"{url}/model/add:add_common",
        json={"instances": [{"x1": [[1.0, 2.0], [3.0, 4.0]], "x2": [[1.0, 1.0], [1.0, 1.0]]}]},
    ).json()
    assert reply == {"instances": [{"y": [[2.0, 3.0], [4.0, 5.0]]}]}
    reply = requests.post(
        f"{url}/model/add/version/1:add_cast", json={"instances": {"x1": [[1, 2], [3, 4]], "x2": [[1, 1], [1, 1]]}}
    ).json()
    assert reply == {"instances": [{"y": [[2.0, 3.0], [4.0, 5.0]]}]}
    reply = requests.post(
        f"{url}/model/add_sub:add_sub_only_model",
        json={
            "instances": [
                {"x1": [[1.0, 2.0], [3.0, 4.0]], "x2": [[1.0, 1.0], [1.0, 1.0]], "x3": [[2.0, 2.0], [2.0, 2.0]]}
            ]
        },
    ).json()
    assert reply == {"instances": [{"y": [[0.0, 1.0], [2.0, 3.0]]}]}
    x1 = np.ones((128, 96), np.float32)
    x2 = np.ones((8, 96), np.float32)
    reply = requests.post(
        f"{url}/model/matmul:predict",
        json={
            "instances": [
                {
                    "x1": {"b64": base64.b64encode(x1.tobytes()).decode(), "type": "fp32", "shape": [128, 96]},
                    "x2": {"b64": base64.b64encode(x2.tobytes()).decode(), "type": "fp32", "shape": [8, 96]},
                }
            ]
        },
    ).json()
    weights = np.load(os.path.join(SERVABLES, "matmul", "1", "weights.npz"))
    np.testing.assert_allclose(np.array(reply["instances"][0]["y1"]), x1 @ weights["w0"], rtol=1e-4, atol=1e-4)
    images = [{"image": {"b64": base64.b64encode(open(p, "rb").read()).decode()}} for p in IMAGES[:3]]
    reply = requests.post(f"{url}/model/lenet:classify_top1", json={"instances": images}).json()
    assert [item["label"] for item in reply["instances"]] == [label_of(p) for p in IMAGES[:3]]


def test_restful_errors_keep_server_serving(served):
    _, _, url = served
    assert (
        requests.post(f"{url}/model/add:add_common", data=b"{not json")
        .json()["error_msg"]
        .startswith("Illegal JSON format.")
    )
    assert requests.post(f"{url}/model/nope:add_common", json={"instances": [{"x1": 1}]}).json() == {
        "error_msg": "Request servable(nope) method(add_common) , servable is not available"
    }
    reply = requests.post(f"{url}/model/add:add_common", json={"instances": [{"x1": [[1.0]], "x2": [[1.0]]}]}).json()
    assert "not match the size 16 defined in model" in reply["error_msg"]
    reply = requests.post(f"{url}/model/add:add_common", json={"instances": [{"x1": {"b64": "abc"}}]}).json()
    assert "is illegal b64 encode string" in reply["error_msg"]
    reply = requests.get(f"{url}/model/add:add_common").json()
    assert reply == {"error_msg": "http message only support POST right now"}
    ok = requests.post(
        f"{url}/model/add:add_common",
        json={"instances": [{"x1": [[1.0, 2.0], [3.0, 4.0]], "x2": [[1.0, 1.0], [1.0, 1.0]]}]},
    ).json()
    assert ok == {"instances": [{"y": [[2.0, 3.0], [4.0, 5.0]]}]}


def test_openapi_page_documents_routes(served):
    _, _, url = served
    schema = requests.get(f"{url}/openapi.json").json()
    assert "/model/{servable_name}:{method_name}" in schema["paths"]
    assert requests.get(f"{url}/docs").status_code == 200
