"""mindspore_serving.client: conversions without a server, then infer/infer_async against an in-process
fake MSService."""

import os
import shutil
import tempfile
from concurrent import futures

import grpc
import numpy as np
import pytest

from mindspore_serving.client import Client, SSLConfig, convert
from mindspore_serving.common import errors
from mindspore_serving.common import tensor_codec as tc
from mindspore_serving.frontends import replies
from mindspore_serving.proto import ms_service_pb2 as pb
from mindspore_serving.proto import ms_service_pb2_grpc as pb_grpc

NEVER_CONNECTED = "127.0.0.1:1"  # argument validation only: these clients never connect

ALL_DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


def request_of(instances):
    return convert.create_request(instances, "add", "add_common", 3)


# ---------------------------------------------------------------------------------------- conversions


def test_request_spec_and_single_dict():
    request = request_of({"x": np.ones(2, np.float32)})
    assert (request.servable_spec.name, request.servable_spec.method_name, request.servable_spec.version_number) == (
        "add",
        "add_common",
        3,
    )
    assert len(request.instances) == 1
    assert len(request_of(({"x": 1}, {"x": 2})).instances) == 2


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_numpy_values_keep_dtype_and_shape(dtype):
    value = np.arange(6).astype(dtype).reshape(2, 3)
    tensor = request_of([{"x": value}]).instances[0].items["x"]
    assert tensor.dtype == tc.dtype_to_proto(dtype) and list(tensor.shape.dims) == [2, 3]
    assert tensor.data == value.tobytes()
    scalar = request_of([{"x": value.reshape(-1)[1]}]).instances[0].items["x"]  # numpy scalar
    assert scalar.dtype == tc.dtype_to_proto(dtype) and list(scalar.shape.dims) == []


@pytest.mark.parametrize("value,dtype", [(True, np.bool_), (3, np.int64), (-2.5, np.float64)])
def test_python_scalars_become_shape_1_arrays(value, dtype):
    tensor = request_of([{"x": value}]).instances[0].items["x"]
    assert list(tensor.shape.dims) == [1] and tensor.dtype == tc.dtype_to_proto(dtype)
    np.testing.assert_array_equal(tc.tensor_to_value(tensor), np.array((value,), dtype))


def test_str_and_bytes_have_dims_1():
    tensor = request_of([{"x": "héllo"}]).instances[0].items["x"]
    assert tensor.dtype == pb.MS_STRING and list(tensor.shape.dims) == [1]
    assert list(tensor.bytes_val) == ["héllo".encode()]
    tensor = request_of([{"x": b"\x00\x01"}]).instances[0].items["x"]
    assert tensor.dtype == pb.MS_BYTES and list(tensor.shape.dims) == [1] and list(tensor.bytes_val) == [b"\x00\x01"]


def test_conversion_errors():
    with pytest.raises(RuntimeError, match="^instance should be a map$"):
        request_of([{"x": 1}, [1]])
    with pytest.raises(RuntimeError, match="^Not support value type <class 'list'>$"):
        request_of({"x": [1, 2]})
    with pytest.raises(RuntimeError, match="^Not support value type <class 'NoneType'>$"):
        request_of({"x": None})
    with pytest.raises(RuntimeError, match="^Unknown data type <U3$"):
        request_of({"x": np.array(["abc"])})
    with pytest.raises(RuntimeError, match="^Unknown data type complex128$"):
        request_of({"x": np.array([1j])})
    with pytest.raises(RuntimeError, match="^Unknown data type object$"):
        request_of({"x": 2**70})


def reply_of(results, spec=None):
    """The master's reply to per-instance dicts or ServingErrors, or to one ServingError for the request."""
    spec = spec if spec is not None else pb.ServableSpec()
    if isinstance(results, errors.ServingError):
        return replies.error_reply(spec, results)
    return replies.predict_reply(
        spec,
        [result if isinstance(result, errors.ServingError) else tc.instance_to_proto(result) for result in results],
    )


def _reply(results):
    return pb.PredictReply.FromString(reply_of(results).SerializeToString())


def test_parse_reply_values():
    results = convert.parse_reply(
        _reply([{"y": np.array([[1, 2]], np.int32), "s": "abc", "b": b"\x01", "z": np.array(2.5, np.float32)}])
    )
    assert isinstance(results, list) and len(results) == 1
    item = results[0]
    assert item["y"].dtype == np.int32 and item["y"].tolist() == [[1, 2]]
    assert item["s"] == "abc" and item["b"] == b"\x01"
    assert item["z"].shape == () and item["z"] == 2.5


def test_parse_reply_errors():
    assert convert.parse_reply(_reply(errors.ServableUnavailable("servable is not available"))) == {
        "error": "servable is not available"
    }
    assert convert.parse_reply(_reply([errors.Failed("x"), errors.Failed("x")])) == {"error": "x"}
    results = convert.parse_reply(_reply([{"y": np.ones(1)}, errors.InvalidInputs("bad")]))
    assert results[1] == {"error": "bad"} and results[0]["y"].tolist() == [1.0]


def test_client_argument_checks():
    with pytest.raises(RuntimeError, match="^Parameter 'address' should be str, but actually <class 'int'>$"):
        Client(5500, "add", "m")
    with pytest.raises(RuntimeError, match="^Parameter 'servable_name' should not be empty str$"):
        Client(NEVER_CONNECTED, "", "m")
    with pytest.raises(RuntimeError, match="^Parameter 'method_name' should be str"):
        Client(NEVER_CONNECTED, "add", None)
    with pytest.raises(RuntimeError, match="^Parameter 'version_number' should be >= 0$"):
        Client(NEVER_CONNECTED, "add", "m", version_number=-1)
    with pytest.raises(RuntimeError, match="^Parameter 'version_number' should be int, but actually <class 'str'>$"):
        Client(NEVER_CONNECTED, "add", "m", version_number="1")
    assert Client(NEVER_CONNECTED, "add", "m", version_number=True).version_number == 1  # as MindSpore Serving's
    with pytest.raises(RuntimeError, match="^The type of ssl_config should be type of SSLConfig$"):
        Client(NEVER_CONNECTED, "add", "m", ssl_config="x")
    with pytest.raises(RuntimeError, match="^Parameter 'certificate' should not be empty str$"):
        SSLConfig(certificate="")


def test_ssl_config_needs_certificate_and_key_together(tmp_path):
    cert = tmp_path / "cert.pem"
    cert.write_bytes(b"not really a certificate")
    with pytest.raises(RuntimeError, match="^The certificate and private_key should be passed at the same time$"):
        Client(NEVER_CONNECTED, "add", "m", ssl_config=SSLConfig(certificate=str(cert)))
    with pytest.raises(RuntimeError, match="^The certificate and private_key should be passed at the same time$"):
        Client(NEVER_CONNECTED, "add", "m", ssl_config=SSLConfig(private_key=str(cert)))
    client = Client(NEVER_CONNECTED, "add", "m", ssl_config=SSLConfig(custom_ca=str(cert)))
    client.close()


# ------------------------------------------------------------------------------------ in-process server


class FakeMSService(pb_grpc.MSServiceServicer):
    """Echoes the inputs, or answers according to the method name."""

    def Predict(self, request, context):
        method = request.servable_spec.method_name
        instances = tc.proto_to_instances(request.instances)
        if method == "global_error":
            return reply_of(
                errors.ServableUnavailable(
                    f"Request servable({request.servable_spec.name}) method({method}) , servable is not available"
                )
            )
        if method == "fail_odd":
            results = [
                errors.InvalidInputs(f"instance {i} failed") if i % 2 else instance
                for i, instance in enumerate(instances)
            ]
            return reply_of(results)
        if method == "fail_all_same":
            return reply_of([errors.Failed("Preprocess Failed") for _ in instances])
        if method == "abort":
            context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
        results = [
            dict(instance, version=np.array(request.servable_spec.version_number, np.int64)) for instance in instances
        ]
        return reply_of(results, request.servable_spec)


@pytest.fixture(scope="module")
def server():
    unix_dir = tempfile.mkdtemp(prefix="msc")
    unix_address = "unix:" + os.path.join(unix_dir, "s.sock")
    grpc_server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.max_receive_message_length", 1024 * 1024)]
    )
    pb_grpc.add_MSServiceServicer_to_server(FakeMSService(), grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.add_insecure_port(unix_address)
    grpc_server.start()
    try:
        yield f"127.0.0.1:{port}", unix_address
    finally:
        grpc_server.stop(None).wait()
        shutil.rmtree(unix_dir, ignore_errors=True)


def test_infer_round_trip(server):
    address, _ = server
    with Client(address, "add", "echo", version_number=2) as client:
        instances = [
            {
                "f": np.arange(4, dtype=np.float16).reshape(2, 2),
                "s": "abc",
                "b": b"\x00\xff",
                "i": 7,
                "x": 1.5,
                "t": True,
            },
            {"f": np.zeros((0, 3), np.float32), "s": "", "b": b"", "i": -1, "x": 0.0, "t": False},
        ]
        result = client.infer(instances)
    assert isinstance(result, list) and len(result) == 2
    first = result[0]
    assert first["f"].dtype == np.float16 and first["f"].tolist() == [[0, 1], [2, 3]]
    assert first["s"] == "abc" and first["b"] == b"\x00\xff"
    assert first["i"].dtype == np.int64 and first["i"].shape == (1,) and first["i"][0] == 7
    assert first["x"].dtype == np.float64 and first["x"].tolist() == [1.5]
    assert first["t"].dtype == np.bool_ and first["t"].tolist() == [True]
    assert first["version"].shape == () and first["version"] == 2
    assert result[1]["f"].shape == (0, 3) and result[1]["s"] == "" and result[1]["b"] == b""


def test_infer_single_dict(server):
    address, _ = server
    with Client(address, "add", "echo") as client:
        result = client.infer({"x": np.float32(3.0)})
    assert len(result) == 1 and result[0]["x"] == 3.0 and result[0]["x"].dtype == np.float32


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_infer_every_dtype(server, dtype):
    address, _ = server
    value = (np.arange(6) % 3).astype(dtype).reshape(3, 2)
    with Client(address, "add", "echo") as client:
        result = client.infer([{"x": value}])
    assert result[0]["x"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(result[0]["x"], value)


def test_infer_async(server):
    address, _ = server
    with Client(address, "add", "echo") as client:
        pending = [client.infer_async({"x": np.array([i], np.int32)}) for i in range(4)]
        results = [future.result() for future in pending]
        assert [r[0]["x"].tolist() for r in results] == [[0], [1], [2], [3]]
        assert Client(address, "add", "global_error").infer_async({"x": 1}).result() == {
            "error": "Request servable(add) method(global_error) , servable is not available"
        }


def test_global_and_per_instance_errors(server):
    address, _ = server
    assert Client(address, "add", "global_error").infer([{"x": 1}, {"x": 2}]) == {
        "error": "Request servable(add) method(global_error) , servable is not available"
    }
    assert Client(address, "add", "fail_all_same").infer([{"x": 1}, {"x": 2}]) == {"error": "Preprocess Failed"}
    result = Client(address, "add", "fail_odd").infer([{"x": 1}, {"x": 2}, {"x": 3}])
    assert isinstance(result, list) and result[1] == {"error": "instance 1 failed"}
    assert result[0]["x"].tolist() == [1] and result[2]["x"].tolist() == [3]


def test_rpc_errors(server):
    address, _ = server
    result = Client(address, "add", "abort").infer({"x": 1})
    assert result == {"error": "Grpc Error, (14, 'unavailable'), going away"}
    assert Client(address, "add", "abort").infer_async({"x": 1}).result() == result
    too_big = {"x": np.zeros(2 * 1024 * 1024, np.uint8)}  # the server accepts 1 MiB
    result = Client(address, "add", "echo").infer(too_big)
    assert result["error"].startswith("Grpc Error, (8, 'resource exhausted')")


def test_unix_socket_address(server):
    _, unix_address = server
    with Client(unix_address, "add", "echo") as client:
        assert client.infer({"s": "unix"})[0]["s"] == "unix"
