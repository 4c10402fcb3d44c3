"""The files a server makes in its working directory: its runtime directory of unix sockets, and per-worker logs."""

import os
import stat

import pytest

from mindspore_serving import log
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master.worker_processes import WorkerPlan


def plan(name, **kwargs):
    return WorkerPlan(
        servable_directory="/s",
        servable_name=name,
        version_number=2,
        device_type=None,
        device_id=1,
        dec_key=None,
        dec_mode="AES-GCM",
        **kwargs,
    )


def test_the_master_makes_a_runtime_directory_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pid = os.getpid()
    first, second = ipc.master_address(), ipc.master_address()
    directory = ipc.runtime_directory_of(first)
    assert first == f"unix:{directory}/serving_master_{pid}" and directory != ipc.runtime_directory_of(second)
    parent, name = os.path.split(directory)
    assert parent == "unix_socket_files" and name.startswith(f"{pid}_")
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(ipc.SOCKET_DIR).st_mode) == 0o700
    assert ipc.worker_address(directory, "add", "device1") == f"unix:{directory}/serving_worker_add_device1_{pid}"
    ipc.remove_runtime_directory(first)
    assert sorted(os.listdir(ipc.SOCKET_DIR)) == [os.path.basename(ipc.runtime_directory_of(second))]


def test_a_long_address_keeps_its_directory_and_the_ends_of_its_name():
    directory = "unix_socket_files/4194304_abcdefgh"  # as long as a runtime directory gets
    name = "n" * 40 + "m" * 40
    address = ipc.worker_address(directory, name, "device1")
    assert len(address) <= 90 and address.startswith(f"unix:{directory}/serving_worker_nnn")
    assert address.endswith(f"mmm_device1_{os.getpid()}") and "___" in address
    assert len(ipc.socket_path(ipc.predict_address(address)).encode()) < 107  # AF_UNIX's limit
    fits = "a" * (90 - len(f"unix:{directory}/serving_worker__device1_{os.getpid()}"))
    assert (
        ipc.worker_address(directory, fits, "device1")
        == f"unix:{directory}/serving_worker_{fits}_device1_{os.getpid()}"
    )


def test_a_starting_master_removes_what_killed_servers_left(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs(f"{ipc.SOCKET_DIR}/999999999_deadbeef")  # a pid that runs nothing
    (tmp_path / ipc.SOCKET_DIR / "999999999_deadbeef" / "serving_master_999999999").write_text("")
    live = ipc.runtime_directory_of(ipc.master_address())  # this process runs: kept
    os.makedirs(f"{ipc.SOCKET_DIR}/unrelated")
    ipc.master_address()
    names = os.listdir(ipc.SOCKET_DIR)
    assert "999999999_deadbeef" not in names and os.path.basename(live) in names and "unrelated" in names


def test_a_child_refuses_a_runtime_directory_that_is_not_private(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    address = ipc.master_address()
    directory = ipc.runtime_directory_of(address)
    os.chmod(directory, 0o755)
    assert ipc.runtime_directory_of(address) == directory  # its own: tightened
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    os.rmdir(directory)
    with pytest.raises(RuntimeError, match="cannot open the directory"):
        ipc.runtime_directory_of(address)  # gone: never made again by a child
    os.symlink(str(tmp_path), directory)
    with pytest.raises(RuntimeError, match="is not a directory"):
        ipc.runtime_directory_of(address)


def test_worker_log_files():
    assert plan("add").log_path == os.path.join("serving_logs", "log_add_device1_version2.log")
    assert plan("dist", rank_table_json_file="r.json").log_path == os.path.join(
        "serving_logs", "log_dist_distributed.log"
    )
    assert plan("add", extra_index=0).log_path == os.path.join("serving_logs", "log_add_extra0_version2.log")


def test_the_socket_directory_is_private(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir(ipc.SOCKET_DIR, 0o755)
    os.chmod(ipc.SOCKET_DIR, 0o755)  # one made by an earlier server, open to others: tightened
    ipc.remove_runtime_directory(ipc.master_address())
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
        ipc.master_address()


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
    os.symlink(tmp_path / "fresh.log", tmp_path / "link.log")
    with pytest.raises(OSError):
        log.open_private(str(tmp_path / "link.log"), "a")  # never written through a link
    assert (tmp_path / "fresh.log").read_text() == "x"


def test_the_log_directory_is_private(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("serving_logs", 0o755)
    os.chmod("serving_logs", 0o755)
    assert ipc.private_directory("serving_logs") == "serving_logs"
    assert stat.S_IMODE(os.lstat("serving_logs").st_mode) == 0o700
    os.rmdir("serving_logs")
    os.symlink(str(tmp_path / "elsewhere"), "serving_logs")
    with pytest.raises(RuntimeError, match="is not a directory"):
        ipc.private_directory("serving_logs")


def test_a_rotated_log_file_is_never_open_to_others(tmp_path, monkeypatch):
    path = str(tmp_path / "w.log")
    handler = log._RotatingFile(path, maxBytes=10, backupCount=2, delay=True)  # pylint: disable=protected-access
    modes, chmod = [], os.chmod

    def recording_chmod(target, mode):  # the mode each file had before: never open to others, not for a moment
        modes.append(os.stat(target).st_mode)
        chmod(target, mode)

    monkeypatch.setattr(log.os, "chmod", recording_chmod)
    old_umask = os.umask(0o022)
    try:
        for _ in range(2):
            handler.doRollover()
    finally:
        os.umask(old_umask)
        handler.close()
    assert modes and all(stat.S_IMODE(mode) & 0o077 == 0 for mode in modes), [oct(m) for m in modes]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path + ".1").st_mode) == 0o400
