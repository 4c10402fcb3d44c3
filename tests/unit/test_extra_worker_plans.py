"""Extra workers (num_parallel_workers) as the master plans them: which start, their names, when they are skipped,
and which workers keep the server alive."""

import os
import sys
from types import SimpleNamespace

import pytest

from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master import worker_processes
from mindspore_serving.master.worker_processes import (
    EXTRA_WORKER_MODULE,
    WORKER_MODULE,
    WorkerProcess,
    WorkerProcesses,
    device_owners_gone,
)
from mindspore_serving.server import ServableStartConfig
from mindspore_serving.server._server import _plans
from mindspore_serving.worker.extra_worker import ExtraWorker, loads_models_itself, parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVABLES = os.path.join(ROOT, "servables")


def plans_of(**kwargs):
    return _plans([ServableStartConfig(SERVABLES, "add", version_number=1, **kwargs)])


def test_extra_workers_are_those_beyond_the_device_ids():
    plans = plans_of(device_ids=0, num_parallel_workers=3)
    assert [p.key for p in plans] == ["add/v1/device0", "add/v1/extra0", "add/v1/extra1"]
    assert [p.log_path for p in plans] == [
        os.path.join("serving_logs", name)
        for name in ("log_add_device0_version1.log", "log_add_extra0_version1.log", "log_add_extra1_version1.log")
    ]
    assert [p.owns_device for p in plans] == [True, False, False]
    command = plans[2].command("unix:m")
    assert command[:3] == [sys.executable, "-m", EXTRA_WORKER_MODULE] and "--extra_index=1" in command
    assert not [arg for arg in command if arg.startswith("--device_id")]
    assert plans[0].command("unix:m")[2] == WORKER_MODULE and "--device_id=0" in plans[0].command("unix:m")
    assert [p.key for p in plans_of(device_ids=(0, 1), num_parallel_workers=2)] == ["add/v1/device0", "add/v1/device1"]
    assert plans[1].where == "extra:0" and plans[0].where == "device id:0"
    # as MindSpore Serving's "Fail to start workers: {...}" names them
    assert plans[1].failure_label == "servable:add, version:1, extra:0"
    assert plans[0].failure_label == "servable name:add, device id:0"
    assert plans[1].device_label == "extra0" and plans[0].device_label == "0"


def test_without_device_ids_the_extra_workers_are_the_servable_and_own_a_device():
    plans = plans_of()  # num_parallel_workers becomes 1
    assert [p.key for p in plans] == ["add/v1/extra0"]
    assert plans[0].device_ids_empty and plans[0].owns_device
    assert "--device_ids_empty" in plans[0].command("unix:m")
    assert len(plans_of(num_parallel_workers=3)) == 3


def test_extra_worker_socket_names():
    pid = os.getpid()
    assert (
        ipc.worker_address("sockets/1_abcdefgh", "add", "version1_extra0")
        == f"unix:sockets/1_abcdefgh/serving_worker_add_version1_extra0_{pid}"
    )
    address = ipc.worker_address("sockets/1_abcdefgh", "n" * 80, "version1_extra0")
    assert address.startswith("unix:sockets/1_abcdefgh/serving_worker_nnn") and "___" in address
    assert address.endswith(f"_version1_extra0_{pid}") and len(address) <= 90


def test_the_extra_worker_loads_models_itself_only_on_cpu():
    assert loads_models_itself("none", device_ids_empty=True)
    assert loads_models_itself("CPU", device_ids_empty=False)
    assert not loads_models_itself("none", device_ids_empty=False)
    assert not loads_models_itself("gpu", device_ids_empty=True)
    args = parse_args(
        [
            "--servable_directory=/s",
            "--servable_name=add",
            "--version_number=2",
            "--extra_index=1",
            "--master_address=unix:m",
            "--worker_key=add/v2/extra1",
        ]
    )
    assert (args.device_id, args.device_ids_empty, args.extra_index) == (0, False, 1)
    assert ExtraWorker(args).device_label == "version2_extra1"


def worker(plan, running=True, registered=False, python_stages=True):
    process = SimpleNamespace(pid=1) if running else None
    item = WorkerProcess(plan, process=process, python_stages=python_stages, starts=1)
    if registered:
        item.registered.set()
    return item


def test_the_server_exits_when_no_worker_owning_a_device_runs():
    device, extra = plans_of(device_ids=0, num_parallel_workers=2)
    assert not device_owners_gone([worker(device), worker(extra)])
    assert device_owners_gone([worker(device, running=False), worker(extra)])  # an extra alone does not serve
    assert not device_owners_gone([worker(device), worker(extra, running=False)])  # it is restarted instead
    only_extras = plans_of(num_parallel_workers=2)
    assert not device_owners_gone([worker(only_extras[0], running=False), worker(only_extras[1])])
    assert device_owners_gone([worker(p, running=False) for p in only_extras])
    assert not device_owners_gone([])
    being_started = WorkerProcess(device)  # added, not spawned yet: no process, but not gone
    assert not device_owners_gone([being_started])


def test_no_extra_worker_for_a_servable_whose_device_workers_have_only_model_stages(monkeypatch):
    warnings = []
    monkeypatch.setattr(worker_processes.log, "warning", warnings.append)
    device, extra = plans_of(device_ids=0, num_parallel_workers=2)
    processes = WorkerProcesses("unix:m", on_death=lambda w: None, on_all_exited=lambda: None)
    processes.workers[device.key] = worker(device, registered=True, python_stages=True)
    assert processes._useful_extras([extra]) == [extra]
    processes.workers[device.key] = worker(device, registered=True, python_stages=False)
    assert processes._useful_extras([extra]) == []
    assert warnings == ["There is no need to startup additional worker processes, all stages are models, servable: add"]


@pytest.mark.parametrize("python_stages", [True, False])
def test_registration_tells_whether_a_servable_has_python_stages(python_stages):
    (device,) = plans_of(device_ids=0)
    processes = WorkerProcesses("unix:m", on_death=lambda w: None, on_all_exited=lambda: None)
    processes.workers[device.key] = worker(device)
    processes.mark_registered(device.key, python_stages)
    assert processes.workers[device.key].registered.is_set()
    assert processes.workers[device.key].python_stages is python_stages
