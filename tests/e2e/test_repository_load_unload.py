"""Model control end to end: in-process, server.load_servable / unload_servable, KServe v2's repository
load/unload over REST and gRPC, bad input, and a version switch with no failed request under load; and
serving_server.py --model_control poll following version folders."""

import os
import shutil
import signal
import threading
import time

import grpc
import pytest
import requests
from serving_process import SERVABLES, free_port, start_server, wait_until

from mindspore_serving import server
from mindspore_serving.proto import grpc_predict_v2_pb2 as v2
from mindspore_serving.proto import grpc_predict_v2_pb2_grpc as v2_grpc

INFER = {
    "inputs": [
        {"name": "x1", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]},
        {"name": "x2", "datatype": "FP32", "shape": [2, 2], "data": [1, 1, 1, 1]},
    ]
}


def copy_add(repository, versions=(1,)):
    """`add` under `repository`, with the exported model in each of `versions`."""
    target = os.path.join(repository, "add")
    os.makedirs(target, exist_ok=True)
    shutil.copy(os.path.join(SERVABLES, "add", "servable_config.py"), target)
    for version in versions:
        add_version(repository, version)
    return target


def add_version(repository, version):
    shutil.copytree(os.path.join(SERVABLES, "add", "1"), os.path.join(repository, "add", str(version)))


@pytest.fixture
def serving(tmp_path, monkeypatch):
    """`add` version 1 served from a scratch repository, REST and gRPC on free ports; always stopped."""
    monkeypatch.chdir(tmp_path)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    repository = str(tmp_path / "repository")
    copy_add(repository)
    rest, grpc_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    try:
        server.master.context.set_model_control("explicit")
        server.start_servables(server.ServableStartConfig(repository, "add", device_ids=0))
        server.start_restful_server(rest)
        server.start_grpc_server(grpc_addr)
        yield repository, f"http://{rest}", grpc_addr
    finally:
        server.stop()
        server.master.context.set_model_control("none")
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def infer(base, version=""):
    path = f"/v2/models/add.add_common{'/versions/' + version if version else ''}/infer"
    return requests.post(base + path, json=INFER, timeout=30)


def index(base):
    return sorted((m["name"], m["version"]) for m in requests.post(base + "/v2/repository/index", timeout=5).json())


def test_bad_input_leaves_serving_untouched(serving):
    repository, base, grpc_addr = serving
    os.makedirs(os.path.join(repository, "empty"))  # no servable_config.py
    broken = copy_add(repository, versions=())
    os.makedirs(os.path.join(broken, "3"))  # a version without its model
    answers = {
        "missing": requests.post(base + "/v2/repository/models/missing/load", timeout=30),
        "empty": requests.post(base + "/v2/repository/models/empty/load", timeout=30),
        "no model": requests.post(
            base + "/v2/repository/models/add/load", json={"parameters": {"version": 3}}, timeout=60
        ),
        "bad version": requests.post(
            base + "/v2/repository/models/add/load", json={"parameters": {"version": "x"}}, timeout=30
        ),
        "bad body": requests.post(base + "/v2/repository/models/add/load", data=b"{", timeout=30),
        "unload missing": requests.post(base + "/v2/repository/models/missing/unload", timeout=30),
        "unload version": requests.post(
            base + "/v2/repository/models/add/unload", json={"parameters": {"version": 7}}, timeout=30
        ),
    }
    statuses = {what: reply.status_code for what, reply in answers.items()}
    assert statuses == {
        "missing": 404,
        "empty": 400,
        "no model": 400,
        "bad version": 400,
        "bad body": 400,
        "unload missing": 400,
        "unload version": 400,
    }, {k: r.text for k, r in answers.items()}
    assert "not in the servable directory" in answers["missing"].json()["error"]
    assert "servable_config.py" in answers["empty"].json()["error"]
    assert "Fail to start workers" in answers["no model"].json()["error"]
    assert "not loaded" in answers["unload missing"].json()["error"]
    with grpc.insecure_channel(grpc_addr) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        for call, request, code in (
            (stub.RepositoryModelLoad, v2.RepositoryModelLoadRequest(model_name="missing"), grpc.StatusCode.NOT_FOUND),
            (
                stub.RepositoryModelLoad,
                v2.RepositoryModelLoadRequest(model_name="../add"),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            (
                stub.RepositoryModelUnload,
                v2.RepositoryModelUnloadRequest(model_name="nothing"),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
        ):
            with pytest.raises(grpc.RpcError) as failure:
                call(request, timeout=30)
            assert failure.value.code() == code, failure.value.details()
    with pytest.raises(RuntimeError, match="not loaded"):
        server.unload_servable("nothing")
    with pytest.raises(RuntimeError, match="Fail to start workers"):
        server.load_servable(server.ServableStartConfig(repository, "add", device_ids=0, version_number=3))
    reply = infer(base)
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [2, 3, 4, 5]
    assert index(base) == [("add.add_cast", "1"), ("add.add_common", "1")]
    assert requests.get(base + "/ready", timeout=5).status_code == 200


class ClientsUnderLoad:
    """Four clients that loop v2 infer requests on add.add_common until stopped: the versions that answered, and
    every failure."""

    def __init__(self, base):
        self.base, self.seen, self.failures, self.stop = base, [], [], threading.Event()
        self.threads = [threading.Thread(target=self._client) for _ in range(4)]

    def _client(self):
        with requests.Session() as session:
            while not self.stop.is_set():
                reply = session.post(self.base + "/v2/models/add.add_common/infer", json=INFER, timeout=30)
                if reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [2, 3, 4, 5]:
                    self.seen.append(reply.json()["model_version"])
                else:
                    self.failures.append((reply.status_code, reply.text))

    def more(self, count):
        """Waits until `count` more answers came (or a failure)."""
        target = len(self.seen) + count
        while len(self.seen) < target and not self.failures:
            threading.Event().wait(0.02)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def test_version_switch_under_load_fails_no_request(serving):
    repository, base, grpc_addr = serving
    add_version(repository, 2)
    with ClientsUnderLoad(base) as load:
        reply = requests.post(base + "/v2/repository/models/add/load", json={"parameters": {"version": 2}}, timeout=120)
        assert reply.status_code == 200, reply.text
        before_unload = len(load.seen)
        with grpc.insecure_channel(grpc_addr) as channel:
            stub = v2_grpc.GRPCInferenceServiceStub(channel)
            stub.RepositoryModelUnload(
                v2.RepositoryModelUnloadRequest(
                    model_name="add", parameters={"version": v2.ModelRepositoryParameter(int64_param=1)}
                ),
                timeout=60,
            )
        load.more(20)
    assert not load.failures, load.failures[:3]
    assert load.seen[0] == "1" and load.seen[-1] == "2" and before_unload > 0, (load.seen[:3], load.seen[-3:])
    assert index(base) == [("add.add_cast", "2"), ("add.add_common", "2")]
    assert infer(base, "1").status_code == 404


def test_python_api_reload_and_unload(serving):
    repository, base, _ = serving
    server.load_servable(server.ServableStartConfig(repository, "add", device_ids=0, version_number=1))  # a reload
    assert index(base) == [("add.add_cast", "1"), ("add.add_common", "1")]
    workers = requests.get(base + "/ready", timeout=5).json()["servables"]["add"]["workers"]
    assert [w["key"] for w in workers] == ["add/v1/device0/g1"], workers
    assert infer(base).status_code == 200
    server.unload_servable("add")
    assert index(base) == []
    assert infer(base).status_code == 404
    reply = requests.post(base + "/v2/repository/models/add/load", timeout=120)  # the newest version: 1
    assert reply.status_code == 200, reply.text
    assert infer(base).json()["outputs"][0]["data"] == [2, 3, 4, 5]


def test_poll_mode_follows_version_folders(tmp_path):
    repository = str(tmp_path / "repository")
    copy_add(repository)
    proc, _, rest = start_server(
        tmp_path,
        servables=(),
        env={"GLOG_v": "1"},
        extra_args=("--servable_directory", repository, "--model_control", "poll"),
    )
    base = f"http://{rest}"
    try:
        assert index(base) == [("add.add_cast", "1"), ("add.add_common", "1")]
        refused = requests.post(base + "/v2/repository/models/add/unload", timeout=30)  # the directory decides
        assert refused.status_code == 403 and "model control is off" in refused.json()["error"], refused.text
        staging = os.path.join(repository, "add", "staging")  # not a version: renamed into place at once
        shutil.copytree(os.path.join(SERVABLES, "add", "1"), staging)
        with ClientsUnderLoad(base) as load:  # the switch fails no request
            load.more(10)
            added = time.monotonic()
            os.rename(staging, os.path.join(repository, "add", "2"))
            proc.wait_for("model control: loading servable add version 2", timeout=2)
            assert time.monotonic() - added < 2
            wait_until(lambda: index(base) == [("add.add_cast", "2"), ("add.add_common", "2")], 60, "version 2 alone")
            load.more(20)
        assert not load.failures, load.failures[:3]
        assert load.seen[0] == "1" and load.seen[-1] == "2", (load.seen[:3], load.seen[-3:])
        assert infer(base).json()["model_version"] == "2"
        shutil.rmtree(os.path.join(repository, "add", "2"))  # latest:1 falls back to version 1
        wait_until(lambda: index(base) == [("add.add_cast", "1"), ("add.add_common", "1")], 60, "version 1 again")
        shutil.rmtree(os.path.join(repository, "add"))
        wait_until(lambda: index(base) == [], 60, "nothing served")
    finally:
        proc.close()
