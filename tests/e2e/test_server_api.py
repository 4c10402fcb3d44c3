"""The server API in-process: restart after stop(), unix sockets, TLS, limits, address errors, generated clients."""

import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import requests
from certificates import make_certs
from serving_process import ROOT, SERVABLES, free_port

from mindspore_serving import server
from mindspore_serving.client import Client
from mindspore_serving.client import SSLConfig as ClientSSLConfig
from mindspore_serving.master.master import get_master

TEST_SERVABLES = os.path.join(ROOT, "tests", "servables")
X = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)


@pytest.fixture
def serving(tmp_path, monkeypatch):
    """Runs the server API in this process, from a scratch directory, and always stops it."""
    monkeypatch.chdir(tmp_path)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield server
    finally:
        server.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def add_config(**kwargs):
    return server.ServableStartConfig(servable_directory=SERVABLES, servable_name="add", device_ids=0, **kwargs)


def test_restart_after_stop_on_same_ports(serving):
    grpc_addr, rest_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    for _ in range(2):
        serving.start_servables(add_config())
        serving.start_grpc_server(grpc_addr)
        serving.start_restful_server(rest_addr)
        result = Client(grpc_addr, "add", "add_common").infer({"x1": X, "x2": X})
        np.testing.assert_array_equal(result[0]["y"], X * 2)
        reply = requests.post(
            f"http://{rest_addr}/model/add:add_common", json={"instances": [{"x1": X.tolist(), "x2": X.tolist()}]}
        ).json()
        assert reply == {"instances": [{"y": (X * 2).tolist()}]}
        serving.stop()


def test_front_end_errors_stop_the_server_as_mindspore_serving_does(serving):
    serving.start_servables(add_config())
    address = f"127.0.0.1:{free_port()}"
    serving.start_grpc_server(address)
    with pytest.raises(RuntimeError, match="^Raise failed: Serving Error: Serving gRPC server is already running$"):
        serving.start_grpc_server(f"127.0.0.1:{free_port()}")
    # the failure stopped the whole server, the gRPC server started before included
    assert "unavailable" in Client(address, "add", "add_common").infer({"x1": X, "x2": X})["error"]
    with pytest.raises(RuntimeError, match="RESTful server does not support binding to unix domain socket"):
        serving.start_restful_server("unix:/tmp/x")
    with pytest.raises(RuntimeError, match="is out of legal range"):
        serving.start_restful_server(f"127.0.0.1:{65535 + 1}")  # one past the largest port: never bound
    with pytest.raises(RuntimeError, match="is illegal"):
        serving.start_restful_server("127.0.0.1")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(RuntimeError, match="RESTful server start failed, bind to the socket address"):
            serving.start_restful_server(f"127.0.0.1:{held.getsockname()[1]}")
    with pytest.raises(RuntimeError, match="The type of ssl_config should be class of SSLConfig"):
        serving.start_restful_server(f"127.0.0.1:{free_port()}", ssl_config="x")
    # the arguments' own checks raise their text alone (MindSpore Serving checks them in Python), and stop too
    serving.start_servables(add_config())
    with pytest.raises(RuntimeError, match=r"^Parameter 'max_msg_mb_size' should be in range \[1,512\]$"):
        serving.start_grpc_server(f"127.0.0.1:{free_port()}", max_msg_mb_size=0)
    assert get_master(create=False) is None


def test_start_servables_reports_worker_failure(serving):
    config = server.ServableStartConfig(servable_directory=TEST_SERVABLES, servable_name="broken", device_ids=0)
    with pytest.raises(
        RuntimeError,
        match=r"Fail to start workers: \{servable name:broken, device id:0, <"
        r"import broken.servable_config failed",
    ):
        serving.start_servables(config)


def test_missing_version_fails_start(serving):
    with pytest.raises(
        RuntimeError, match="There is no specified version directory of models, specified version number: 9"
    ):
        serving.start_servables(add_config(version_number=9))


def test_unix_socket_grpc(serving, tmp_path):
    serving.start_servables(add_config())
    address = f"unix:{tmp_path}/serving.sock"
    serving.start_grpc_server(address)
    result = Client(address, "add", "add_common").infer({"x1": X, "x2": X})
    np.testing.assert_array_equal(result[0]["y"], X * 2)


def test_python_stage_errors_stay_per_instance(serving):
    serving.start_servables(
        server.ServableStartConfig(servable_directory=TEST_SERVABLES, servable_name="faulty", device_ids=0)
    )
    address = f"127.0.0.1:{free_port()}"
    serving.start_grpc_server(address)
    ok, bad = np.array([1.0], np.float32), np.array([-1.0], np.float32)
    result = Client(address, "faulty", "double_positive").infer([{"x": ok}, {"x": bad}, {"x": ok}])
    assert result[0]["y"] == 2.0 and result[2]["y"] == 2.0
    assert (
        "Call Function 'faulty.check_positive' Failed, method: 'double_positive', stage index(begin with 1): 1, "
        "error msg: negative input" in result[1]["error"]
    )
    result = Client(address, "faulty", "wrong_count").infer([{"x": ok}])
    assert "not equal to outputs_count 2" in result["error"]
    result = Client(address, "faulty", "square_batch").infer([{"x": ok * 3}, {"x": ok * 4}])
    assert [r["y"].item() for r in result] == [9.0, 16.0]
    result = Client(address, "faulty", "echo").infer({"text": "hello", "data": b"\x00\x01"})
    assert result[0] == {"text": "hello", "data": b"\x00\x01"}


def test_max_enqueued_requests(serving):
    from mindspore_serving.server.master import context

    serving.start_servables(
        server.ServableStartConfig(servable_directory=TEST_SERVABLES, servable_name="slow", device_ids=0)
    )
    address = f"127.0.0.1:{free_port()}"
    serving.start_grpc_server(address)
    context.set_max_enqueued_requests(1)
    try:
        client = Client(address, "slow", "sleep")
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(client.infer, {"seconds": np.float32(2)})
            dispatcher = get_master(create=False).dispatcher
            deadline = time.monotonic() + 10
            while dispatcher.enqueued < 1 and time.monotonic() < deadline:
                time.sleep(0.01)  # ok-sleep: polling the master's queue with a deadline
            second = client.infer({"seconds": np.float32(0)})
            assert second == {"error": "Serving Error: enqueued requests count exceeds the limit 1"}
            assert first.result()[0]["y"].item() == 2.0
    finally:
        context.set_max_enqueued_requests(10000)


def test_message_size_limits(serving):
    serving.start_servables(add_config())
    grpc_addr, rest_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    serving.start_grpc_server(grpc_addr, max_msg_mb_size=1)
    serving.start_restful_server(rest_addr, max_msg_mb_size=1)
    big = np.zeros((600, 600), np.float32)
    result = Client(grpc_addr, "add", "add_common").infer({"x1": big, "x2": big})
    assert result["error"].startswith("Grpc Error, (8, 'resource exhausted')")
    body = b'{"instances": [{"x1": [' + b"1.0," * 400000 + b"1.0]}]}"
    reply = requests.post(f"http://{rest_addr}/model/add:add_common", data=body).json()
    assert reply == {"error_msg": "http message is bigger than 1048576"}
    assert Client(grpc_addr, "add", "add_common").infer({"x1": X, "x2": X})[0]["y"].tolist() == (X * 2).tolist()


def test_tls_grpc_and_restful_with_client_verification(serving, tmp_path):
    certs = make_certs(str(tmp_path))
    ssl_config = server.SSLConfig(
        certificate=certs["server.crt"], private_key=certs["server.key"], custom_ca=certs["ca.crt"], verify_client=True
    )
    grpc_addr, rest_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key\n")
    bad_key = server.SSLConfig(certificate=certs["server.crt"], private_key=str(garbage))
    with pytest.raises(RuntimeError) as info:
        serving.start_restful_server(rest_addr, ssl_config=bad_key)
    assert str(info.value) == f"Raise failed: Serving Error: load private_key from {garbage} failed"
    for key in (str(garbage), certs["server.crt"]):  # MindSpore Serving's gRPC server reports any bad key so
        with pytest.raises(RuntimeError) as info:
            serving.start_grpc_server(grpc_addr, ssl_config=server.SSLConfig(certs["server.crt"], key))
        assert (
            str(info.value) == f"Raise failed: Serving Error: Serving gRPC server start failed, create server "
            f"failed, address {grpc_addr}"
        )
    serving.start_servables(add_config())  # each failure above stopped the server
    serving.start_grpc_server(grpc_addr, ssl_config=ssl_config)
    serving.start_restful_server(rest_addr, ssl_config=ssl_config)
    client_ssl = ClientSSLConfig(
        certificate=certs["client.crt"], private_key=certs["client.key"], custom_ca=certs["ca.crt"]
    )
    result = Client(grpc_addr, "add", "add_common", ssl_config=client_ssl).infer({"x1": X, "x2": X})
    np.testing.assert_array_equal(result[0]["y"], X * 2)
    no_cert = Client(grpc_addr, "add", "add_common", ssl_config=ClientSSLConfig(custom_ca=certs["ca.crt"]))
    assert "Grpc Error" in no_cert.infer({"x1": X, "x2": X})["error"]
    reply = requests.post(
        f"https://{rest_addr}/model/add:add_common",
        verify=certs["ca.crt"],
        cert=(certs["client.crt"], certs["client.key"]),
        json={"instances": [{"x1": X.tolist(), "x2": X.tolist()}]},
    ).json()
    assert reply == {"instances": [{"y": (X * 2).tolist()}]}
    # the server refuses the handshake; depending on timing the client sees an SSL error or a dropped connection
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        requests.post(f"https://{rest_addr}/model/add:add_common", verify=certs["ca.crt"], json={"instances": []})


def test_client_generated_from_proto(serving, tmp_path):
    """A client built from ms_service.proto alone, in a separate step, talks to the server unchanged."""
    proto_dir = os.path.join(ROOT, "mindspore_serving", "proto")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            os.path.join(proto_dir, "ms_service.proto"),
        ],
        check=True,
    )
    sys.path.insert(0, str(tmp_path))
    try:
        pb2 = importlib.import_module("ms_service_pb2")
        pb2_grpc = importlib.import_module("ms_service_pb2_grpc")
    finally:
        sys.path.remove(str(tmp_path))
    serving.start_servables(add_config())
    address = f"127.0.0.1:{free_port()}"
    serving.start_grpc_server(address)
    request = pb2.PredictRequest(servable_spec=pb2.ServableSpec(name="add", method_name="add_common"))
    instance = request.instances.add()
    for name in ("x1", "x2"):
        tensor = instance.items[name]
        tensor.shape.dims.extend([2, 2])
        tensor.dtype = pb2.MS_FLOAT32
        tensor.data = X.tobytes()
    with grpc.insecure_channel(address) as channel:
        reply = pb2_grpc.MSServiceStub(channel).Predict(request)
    assert len(reply.error_msg) == 0
    y = np.frombuffer(reply.instances[0].items["y"].data, np.float32).reshape(2, 2)
    np.testing.assert_array_equal(y, X * 2)
    sys.modules.pop("ms_service_pb2", None)
    sys.modules.pop("ms_service_pb2_grpc", None)
