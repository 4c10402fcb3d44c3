"""Names of the files a server makes in its working directory: unix sockets and per-worker logs."""
import os

from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master.worker_processes import WorkerPlan


def plan(name, **kwargs):
    return WorkerPlan(servable_directory="/s", servable_name=name, version_number=2, device_type=None, device_id=1,
                      dec_key=None, dec_mode="AES-GCM", **kwargs)


def test_socket_addresses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pid = os.getpid()
    assert ipc.master_address() == f"unix:unix_socket_files/serving_master_{pid}"
    assert ipc.worker_address("add", "device1") == f"unix:unix_socket_files/serving_worker_add_device1_{pid}"
    assert ipc.worker_address("add", "distributed") == f"unix:unix_socket_files/serving_worker_add_distributed_{pid}"
    assert (tmp_path / "unix_socket_files").is_dir()


def test_an_address_over_90_characters_keeps_its_first_and_last_40(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "n" * 40 + "m" * 40
    full = f"unix:unix_socket_files/serving_worker_{name}_device1_{os.getpid()}"
    assert len(full) > 90
    address = ipc.worker_address(name, "device1")
    assert address == full[:40] + "___" + full[-40:] and len(address) == 83
    assert address.startswith("unix:unix_socket_files/serving_worker_")
    fits = "a" * (90 - len(full) + len(name))
    assert ipc.worker_address(fits, "device1") == f"unix:unix_socket_files/serving_worker_{fits}_device1_{os.getpid()}"


def test_worker_log_files():
    assert plan("add").log_path == os.path.join("serving_logs", "log_add_device1_version2.log")
    assert plan("dist", rank_table_json_file="r.json").log_path == os.path.join("serving_logs",
                                                                                  "log_dist_distributed.log")
    assert plan("add", extra_index=0).log_path == os.path.join("serving_logs", "log_add_extra0_version2.log")
