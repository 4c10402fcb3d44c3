"""Names of the files a server makes in its working directory: unix sockets and per-worker logs."""
import os
import stat

import pytest

from mindspore_serving import log
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


def test_the_socket_directory_is_private(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir(ipc.SOCKET_DIR, 0o755)
    os.chmod(ipc.SOCKET_DIR, 0o755)  # one made by an earlier server, open to others: tightened
    ipc.master_address()
    assert stat.S_IMODE(os.lstat(ipc.SOCKET_DIR).st_mode) == 0o700
    os.rmdir(ipc.SOCKET_DIR)
    os.symlink(str(tmp_path / "elsewhere"), ipc.SOCKET_DIR)
    with pytest.raises(RuntimeError, match="is not a directory"):
        ipc.master_address()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_socket_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir(ipc.SOCKET_DIR, 0o700)
    os.chown(ipc.SOCKET_DIR, 4242, 4242)
    with pytest.raises(RuntimeError, match=r"belongs to another user \(uid 4242\)"):
        ipc.worker_address("add", "device1")


def test_log_files_are_owner_only(tmp_path):
    path = tmp_path / "w.log"
    path.write_text("old\n")
    os.chmod(path, 0o644)
    with log.open_private(str(path), "a") as stream:
        stream.write("new\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.read_text() == "old\nnew\n"
    with log.open_private(str(tmp_path / "fresh.log"), "w") as stream:
        stream.write("x")
    assert stat.S_IMODE(os.stat(tmp_path / "fresh.log").st_mode) == 0o600
