"""num_parallel_workers end to end: extra worker processes beside the device workers, with real MindIR models.

One server for the module (GLOG_v=1):
* add_sub and matmul: device_ids=0, num_parallel_workers=2: a device worker and one extra worker each; the extra
  workers call the device workers' models through the master (add_sub: model stages; matmul: Model.call);
* add_only (add's model, only a model stage, bound to one core by its model context): no extra worker, a warning;
* add without device_ids: one extra worker that loads the model on CPU itself.
"""

import os
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
from serving_process import ROOT, SERVABLES, ServingProcess, free_port, wait_until

from mindspore_serving.client import Client
from mindspore_serving.ipc import shm_tensors

EXTRA_MODULE = "mindspore_serving.worker.start_extra_worker"
DEVICE_MODULE = "mindspore_serving.worker.start_worker"
SCRIPT = """import sys
from mindspore_serving import server
bundled, local = sys.argv[2], sys.argv[3]
server.start_servables([server.ServableStartConfig(bundled, "add_sub", device_ids=0, num_parallel_workers=2),
                        server.ServableStartConfig(bundled, "matmul", device_ids=0, num_parallel_workers=2),
                        server.ServableStartConfig(local, "add_only", device_ids=0, num_parallel_workers=2),
                        server.ServableStartConfig(bundled, "add")])
server.start_grpc_server(sys.argv[1])
"""
ADD_ONLY = """from mindspore_serving.server import register

tensor_add = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False,
                                    context=register.Context(thread_affinity_core_list=[{core}]))


@register.register_method(output_names=["y"])
def add_common(x1, x2):
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    return y
"""
X = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
CORE = min(os.sched_getaffinity(0))
HANDLED = "WorkerRequestHandle Time Cost # "


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    """(process, gRPC address, working directory) of the server, stopped at the end of the module."""
    cwd = tmp_path_factory.mktemp("parallel_workers")
    local = cwd / "servables"
    os.makedirs(local / "add_only" / "1")
    (local / "add_only" / "servable_config.py").write_text(ADD_ONLY.format(core=CORE))
    shutil.copy(os.path.join(SERVABLES, "add", "1", "tensor_add.mindir"), local / "add_only" / "1")
    (cwd / "server.py").write_text(SCRIPT)
    grpc_addr = f"127.0.0.1:{free_port()}"
    proc = ServingProcess(
        [str(cwd / "server.py"), grpc_addr, SERVABLES, str(local)],
        str(cwd),
        env={"GLOG_v": "1", "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))},
    )
    try:
        proc.wait_for("gRPC server start success")
        yield proc, grpc_addr, cwd
    finally:
        proc.close()


def workers(proc, module, servable=None):
    found = []
    for child in psutil.Process(proc.proc.pid).children(recursive=True):
        try:
            cmdline = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if module in cmdline and (servable is None or f"--servable_name={servable}" in cmdline):
            found.append(child)
    return found


def log_of(cwd, name):
    with open(cwd / "serving_logs" / name, errors="replace") as stream:
        return stream.read()


def loads_mindspore(process) -> bool:
    return any(f"{os.sep}mindspore{os.sep}" in item.path for item in process.memory_maps())


def blocks_of(proc):
    prefix = shm_tensors.block_prefix(proc.proc.pid)
    return [name for name in os.listdir(shm_tensors.SHM_DIR) if name.startswith(prefix)]


def test_extra_workers_start_beside_the_device_workers_except_for_model_only_servables(serving):
    proc, _, cwd = serving
    extras = {name: workers(proc, EXTRA_MODULE, name) for name in ("add_sub", "matmul", "add_only", "add")}
    assert {name: len(found) for name, found in extras.items()} == {"add_sub": 1, "matmul": 1, "add_only": 0, "add": 1}
    assert len(workers(proc, DEVICE_MODULE)) == 3  # add_sub, matmul, add_only
    assert not workers(proc, DEVICE_MODULE, "add")
    logs = os.listdir(cwd / "serving_logs")
    for name in ("add_sub", "matmul", "add"):
        assert f"log_{name}_extra0_version1.log" in logs
    assert "log_add_only_extra0_version1.log" not in logs and "log_add_device0_version1.log" not in logs
    pid = extras["add_sub"][0].pid
    (runtime,) = os.listdir(cwd / "unix_socket_files")  # the server's runtime directory
    assert f"serving_worker_add_sub_version1_extra0_{pid}" in os.listdir(cwd / "unix_socket_files" / runtime)
    assert (
        "There is no need to startup additional worker processes, all stages are models, servable: add_only"
        in proc.output()
    )
    # an extra worker that calls the device worker's models needs no MindSpore; one without device ids loads it
    assert not loads_mindspore(extras["add_sub"][0]) and not loads_mindspore(extras["matmul"][0])
    assert loads_mindspore(extras["add"][0])


def test_concurrent_requests_are_answered_by_device_and_extra_workers(serving):
    proc, grpc_addr, cwd = serving
    weights = np.load(os.path.join(SERVABLES, "matmul", "1", "weights.npz"))

    def add_sub(i):
        x1 = X * i
        result = Client(grpc_addr, "add_sub", "add_sub_complex").infer([{"x1": x1, "x2": X, "x3": X}] * 2)
        return all(np.array_equal(item["y"], 2 * (x1 + 1)) for item in result)

    def matmul(i):
        rng = np.random.default_rng(i)
        x1, x2 = rng.random((128, 96), np.float32), rng.random((8, 96), np.float32)  # 48 KiB through shared memory
        (result,) = Client(grpc_addr, "matmul", "predict").infer({"x1": x1, "x2": x2})
        return np.allclose(result["y1"], x1 @ weights["w0"], rtol=1e-4, atol=1e-4) and np.allclose(
            result["y2"], x2 @ weights["w1"], rtol=1e-4, atol=1e-4
        )

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(add_sub, range(24)))
        assert all(pool.map(matmul, range(12)))
    for name in ("add_sub_device0", "add_sub_extra0"):
        assert "Method add_sub_complex " + HANDLED in log_of(cwd, f"log_{name}_version1.log"), name
    assert "Method predict " + HANDLED in log_of(cwd, "log_matmul_extra0_version1.log")
    for name, model in (("add_sub", "tensor_add.mindir"), ("matmul", "matmul_0.mindir;matmul_1.mindir")):
        extra_log = log_of(cwd, f"log_{name}_extra0_version1.log")
        assert (
            f"model {model} subgraph 0 runs in a worker owning it; the tensors of its calls travel in shared "
            f"memory" in extra_log
        )
    assert blocks_of(proc) == []


def test_model_only_servable_and_the_servable_without_device_ids_serve(serving):
    proc, grpc_addr, cwd = serving
    (result,) = Client(grpc_addr, "add_only", "add_common").infer({"x1": X, "x2": X})
    np.testing.assert_array_equal(result["y"], X * 2)
    (result,) = Client(grpc_addr, "add", "add_cast").infer({"x1": X.astype(np.int32), "x2": X})
    np.testing.assert_array_equal(result["y"], X * 2)
    assert "Method add_cast " + HANDLED in log_of(cwd, "log_add_extra0_version1.log")


def test_a_worker_settles_its_graphs_before_it_registers(serving):
    _, _, cwd = serving
    log = log_of(cwd, "log_add_only_device0_version1.log")
    settled, registered = log.find(" graph 0 settled: 50 calls on zeros in "), log.find("Start servable success")
    assert 0 <= settled < registered, log[-3000:]


def test_a_model_context_binds_its_worker_and_every_thread_of_it_to_its_cores(serving):
    proc, grpc_addr, cwd = serving
    (worker,) = workers(proc, DEVICE_MODULE, "add_only")
    affinities = {os.sched_getaffinity(thread.id) == {CORE} for thread in worker.threads()}
    assert affinities == {True}, f"every thread of the add_only worker, MindSpore's included, runs on core {CORE}"
    log = log_of(cwd, "log_add_only_device0_version1.log")
    assert (
        f"servable add_only: worker bound to CPU core(s) [{CORE}] (register.Context(thread_affinity_core_list))" in log
    )
    assert "servable add_only: MindSpore CPU kernel threads 1 (the cores this worker may use)" in log
    (result,) = Client(grpc_addr, "add_only", "add_common").infer({"x1": X, "x2": X})
    np.testing.assert_array_equal(result["y"], X * 2)


def test_a_killed_extra_worker_is_restarted_and_the_server_keeps_serving(serving):
    proc, grpc_addr, _ = serving
    (extra,) = workers(proc, EXTRA_MODULE, "add_sub")
    registered = proc.output().count("Register success")
    extra.kill()
    proc.wait_for("Register success", count=registered + 1, timeout=120)
    wait_until(
        lambda: [p.pid for p in workers(proc, EXTRA_MODULE, "add_sub")] not in ([], [extra.pid]),
        30,
        "a new extra worker",
    )
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda i: Client(grpc_addr, "add_sub", "add_sub_complex").infer({"x1": X, "x2": X, "x3": X}), range(8)
            )
        )
    assert all(np.array_equal(result[0]["y"], 2 * (X + 1)) for result in results), results


def test_sigterm_stops_every_worker_and_leaves_no_shared_memory(serving):
    proc, _, cwd = serving
    children = psutil.Process(proc.proc.pid).children(recursive=True)
    master_pid = proc.proc.pid
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait_exit(60) == 0
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not [
        name for name in os.listdir(shm_tensors.SHM_DIR) if name.startswith(shm_tensors.block_prefix(master_pid))
    ]
    assert not os.listdir(cwd / "unix_socket_files")  # the server removed its runtime directory
