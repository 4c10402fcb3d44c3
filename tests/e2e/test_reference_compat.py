"""MindSpore Serving behaviours end to end, with the server API in this process.

* a model exported with `enc_key` serves with `ServableStartConfig(dec_key=...)`, and the key is in no command
  line, log or file; a wrong key fails start_servables with MindSpore's reason;
* several servables share device 0 (CPU);
* a model input of the wrong size or type gets MindSpore Serving's message over gRPC and REST;
* while a killed worker restarts, a client gets success or "Grpc Error, (14, 'unavailable')", nothing else.

One server start serves every test but the wrong-key one, which runs first, before it.
"""

import base64
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import requests
from serving_process import ROOT, SERVABLES, free_port

from mindspore_serving import server
from mindspore_serving.client import Client

KEY = secrets.token_hex(8).encode()  # 16 printable bytes, new on each run
X = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)

_EXPORT = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import export_model
import mindspore as ms
export_model._set_context()
x = ms.Tensor(np.ones([2, 2], np.float32))
ms.export(export_model._build_net(), x, x, file_name=sys.argv[2], file_format="MINDIR",
          enc_key=bytes.fromhex(sys.stdin.read().strip()), enc_mode="AES-GCM")
"""


@pytest.fixture(scope="module")
def encrypted(tmp_path_factory):
    """servables/add as `add_enc`, with its model exported encrypted with KEY (in a child: this process is the
    master, which never loads MindSpore); returns the servable directory."""
    directory = tmp_path_factory.mktemp("servables")
    servable = directory / "add_enc"
    (servable / "1").mkdir(parents=True)
    shutil.copy(os.path.join(SERVABLES, "add", "servable_config.py"), servable)
    shutil.copytree(os.path.join(SERVABLES, "add", "warmup"), servable / "warmup")
    subprocess.run(
        [sys.executable, "-c", _EXPORT, os.path.join(SERVABLES, "add"), str(servable / "1" / "tensor_add")],
        input=KEY.hex(),
        text=True,
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=300,
    )
    return str(directory)


class _InProcessServer:
    """start_servables and the front ends in this process, from a scratch directory; stop() restores it all."""

    def __init__(self, cwd):
        self.cwd = str(cwd)
        self._old_cwd = os.getcwd()
        self._handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        os.chdir(self.cwd)

    def stop(self):
        try:
            server.stop()
        finally:
            os.chdir(self._old_cwd)
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)


def test_a_wrong_key_fails_start_with_mindspore_s_reason(encrypted, tmp_path):
    run = _InProcessServer(tmp_path)
    try:
        with pytest.raises(RuntimeError) as info:
            server.start_servables(
                server.ServableStartConfig(encrypted, "add_enc", device_ids=0, dec_key=b"0" * 16, dec_mode="AES-GCM")
            )
    finally:
        run.stop()
    assert str(info.value) == (
        f"Fail to start workers: {{servable name:add_enc, device id:0, <Raise failed: Load model failed, servable "
        f"directory: "
        f"'{encrypted}', servable name: 'add_enc', model file: '[tensor_add.mindir]', version number 1,model "
        f"context: {{}}, load error details: Load MindIR failed. The file may be encrypted and decrypt failed, you can "
        f"check whether the values of the arguments 'dec_key' and 'dec_mode' are the same as when exported MindIR "
        f"file, or check the file integrity.>}}"
    )


@pytest.fixture(scope="module")
def shared(encrypted, tmp_path_factory):
    """The encrypted servable, `add` and `add_sub`, all on device 0, behind gRPC and REST."""
    run = _InProcessServer(tmp_path_factory.mktemp("serving"))
    old_level = os.environ.get("MS_SUBMODULE_LOG_v")
    os.environ["MS_SUBMODULE_LOG_v"] = "{SERVING:0}"  # the workers log everything: the key must still not show
    try:
        server.start_servables(
            [
                server.ServableStartConfig(encrypted, "add_enc", device_ids=0, dec_key=KEY, dec_mode="AES-GCM"),
                server.ServableStartConfig(SERVABLES, "add", device_ids=0),
                server.ServableStartConfig(SERVABLES, "add_sub", device_ids=0),
            ]
        )
        if old_level is None:
            del os.environ["MS_SUBMODULE_LOG_v"]
        else:
            os.environ["MS_SUBMODULE_LOG_v"] = old_level
        grpc_addr, rest_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        server.start_grpc_server(grpc_addr)
        server.start_restful_server(rest_addr)
        yield run.cwd, grpc_addr, f"http://{rest_addr}"
    finally:
        run.stop()


def workers():
    """The workers of the in-process server: this process's own children (a server process of another module,
    such as the session's LLM server, has its workers below it)."""
    return [
        p for p in psutil.Process().children(recursive=False) if any("start_worker" in part for part in p.cmdline())
    ]


def test_encrypted_model_round_trip(shared):
    _, grpc_addr, url = shared
    result = Client(grpc_addr, "add_enc", "add_common").infer({"x1": X, "x2": X})
    np.testing.assert_array_equal(result[0]["y"], X * 2)
    result = Client(grpc_addr, "add_enc", "add_cast").infer({"x1": X.astype(np.int32), "x2": X})
    np.testing.assert_array_equal(result[0]["y"], X * 2)
    reply = requests.post(
        f"{url}/model/add_enc:add_common", json={"instances": [{"x1": X.tolist(), "x2": X.tolist()}]}, timeout=60
    ).json()
    assert reply == {"instances": [{"y": (X * 2).tolist()}]}


def test_the_key_is_in_no_command_line_log_or_file(shared):
    cwd, _, _ = shared
    forms = [KEY, KEY.hex().encode(), KEY.hex().upper().encode()]
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, check=True).stdout
    assert "add_enc" in ps.decode() and not [form for form in forms if form in ps]
    for worker in workers():
        assert not [form for form in forms if form in " ".join(worker.cmdline()).encode()]
    files = [os.path.join(root, name) for root, _, names in os.walk(cwd) for name in names]
    logs = [path for path in files if path.endswith(".log")]
    assert os.path.join(cwd, "serving_logs", "log_add_enc_device0_version1.log") in logs
    for path in files:
        if os.path.isfile(path):
            with open(path, "rb") as stream:
                content = stream.read()
            assert not [form for form in forms if form in content], path
    with open(os.path.join(cwd, "serving_logs", "log_add_enc_device0_version1.log"), "rb") as stream:
        assert b"[INFO]" in stream.read()  # the worker did log below the default level (WARNING)
    config = server.ServableStartConfig(SERVABLES, "add", dec_key=KEY)
    assert KEY.decode() not in repr(config) and KEY.hex() not in repr(config)


def test_several_servables_on_one_device(shared):
    _, grpc_addr, _ = shared
    assert (
        sorted(part for worker in workers() for part in worker.cmdline() if part.startswith("--device_id="))
        == ["--device_id=0"] * 3
    )
    np.testing.assert_array_equal(Client(grpc_addr, "add", "add_common").infer({"x1": X, "x2": X})[0]["y"], X * 2)
    result = Client(grpc_addr, "add_sub", "add_sub_only_model").infer({"x1": X, "x2": X, "x3": X})
    np.testing.assert_array_equal(result[0]["y"], X)


@pytest.mark.parametrize(
    "array, text",
    [
        (np.ones((2, 2), np.bool_), "Given model input 0 size 4 not match the size 16 defined in model"),
        (np.ones((3, 3), np.bool_), "Given model input 0 size 9 not match the size 16 defined in model"),
        (
            np.ones((4, 4), np.bool_),
            "Given model input 0 data type kMSI_Bool not match the data type kMSI_Float32 defined in model",
        ),
    ],
)
def test_a_bool_array_for_a_float_model_gets_the_model_stage_message(shared, array, text):
    _, grpc_addr, url = shared
    assert Client(grpc_addr, "add", "add_common").infer({"x1": array, "x2": X}) == {"error": text}
    reply = requests.post(
        f"{url}/model/add:add_common", json={"instances": [{"x1": array.tolist(), "x2": X.tolist()}]}, timeout=60
    )
    assert reply.status_code == 200 and reply.json() == {"error_msg": text}
    b64 = {"b64": base64.b64encode(array.tobytes()).decode(), "type": "bool", "shape": list(array.shape)}
    reply = requests.post(
        f"{url}/model/add:add_common", json={"instances": [{"x1": b64, "x2": X.tolist()}]}, timeout=60
    )
    assert reply.json() == {"error_msg": text}


@pytest.mark.parametrize("shape", [[], [1]])
def test_a_b64_bytes_scalar_reaches_the_model_stage(shared, shape):
    _, _, url = shared
    value = {"b64": base64.b64encode(b"abc").decode(), "shape": shape}
    reply = requests.post(
        f"{url}/model/add:add_common", json={"instances": [{"x1": value, "x2": X.tolist()}]}, timeout=60
    )
    assert reply.json() == {"error_msg": "Given model input 0 size 3 not match the size 16 defined in model"}


def test_while_a_killed_worker_restarts_clients_get_unavailable_or_success(shared):
    """Last: it kills add_sub's worker. MindSpore Serving's clients see "Grpc Error, (14, 'unavailable')" while no
    worker serves; here the worker comes back (restarted), and nothing else is ever answered."""
    _, grpc_addr, _ = shared
    (worker,) = [w for w in workers() if "--servable_name=add_sub" in w.cmdline()]
    client = Client(grpc_addr, "add_sub", "add_sub_only_model")
    worker.kill()  # not reaped here: the master's monitor does that
    answers = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        result = client.infer({"x1": X, "x2": X, "x3": X})
        if isinstance(result, list):
            np.testing.assert_array_equal(result[0]["y"], X)
            break
        answers.append(result["error"])
        time.sleep(0.05)  # ok-sleep: polling a restarting worker with a deadline
    else:
        raise AssertionError(f"add_sub did not come back: {answers[-3:]}")
    assert answers, "the restart was not seen"
    assert all(text.startswith("Grpc Error, (14, 'unavailable')") for text in answers), set(answers)
