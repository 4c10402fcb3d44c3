"""The log variables in a real server: the master and its worker follow GLOG_v and each writes its own file."""

import os
import re

import numpy as np
import psutil
from serving_process import start_server

from mindspore_serving.client import Client

HEADER = re.compile(
    r"^\[(DEBUG|INFO|WARNING|ERROR)\] SERVING\((\d+):(\d+),MainProcess\):"
    r"\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d\.\d{3}\.\d{3} \[([^\]]+):(\d+)\] (.*)$"
)
X = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)


def records(text, pid):
    """(level, path, message) of the header lines of process `pid` in `text`."""
    found = []
    for line in text.splitlines():
        match = HEADER.match(line)
        if match and int(match.group(2)) == pid:
            found.append((match.group(1), match.group(4), match.group(6)))
    return found


def test_master_and_worker_follow_glog_v_and_write_their_own_files(tmp_path):
    log_dir = tmp_path / "glog"
    log_dir.mkdir()
    env = {"GLOG_v": "1", "GLOG_logtostderr": "0", "GLOG_log_dir": str(log_dir), "GLOG_stderrthreshold": "1"}
    proc, grpc_addr, _ = start_server(tmp_path, servables=("add",), rest=False, env=env)
    try:
        master_pid = proc.proc.pid
        (worker,) = [p for p in psutil.Process(master_pid).children() if "start_worker" in " ".join(p.cmdline())]
        client = Client(grpc_addr, "add", "add_common")
        for _ in range(2):
            np.testing.assert_array_equal(client.infer({"x1": X, "x2": X})[0]["y"], X * 2)

        # GLOG_stderrthreshold=1: INFO reaches the master's output and the worker's log in serving_logs too
        master = records(proc.output(), master_pid)
        assert ("INFO", "mindspore_serving/master/control_service.py") in {(lvl, path) for lvl, path, _ in master}
        registered = re.compile(
            rf"Register success: worker address: unix:unix_socket_files/{master_pid}_\w+/"
            rf"serving_worker_add_device0_{worker.pid},"
        )
        assert any(level == "INFO" and registered.match(msg) for level, _, msg in master)
        worker_log = (tmp_path / "serving_logs" / "log_add_device0_version1.log").read_text()
        costs = [
            msg
            for level, path, msg in records(worker_log, worker.pid)
            if level == "INFO" and path == "mindspore_serving/worker/service.py"
        ]
        assert len(costs) == 2
        # MindSpore Serving's line, then the public request's id (x-request-id of its reply)
        cost = re.compile(r"Method add_common WorkerRequestHandle Time Cost # \d+\.\d+ ms -+ \[request [0-9a-f]{32}\]")
        assert all(cost.fullmatch(msg) for msg in costs)
        # MindSpore Serving's start-up lines: printed whatever GLOG_v says, and logged at INFO
        messages = {msg for level, _, msg in master if level == "INFO"}
        assert f"Serving gRPC server start success, listening on {grpc_addr}" in messages
        assert any(msg.startswith("Master server start success, listening on unix:") for msg in messages)
        assert f"Serving: Serving gRPC server start success, listening on {grpc_addr}" in proc.output()
        started = [line for line in worker_log.splitlines() if "Start servable success" in line]
        assert len(started) == 2 and started[1].startswith("Serving: Start servable success, servable directory: ")
        assert records(started[0], worker.pid)[0][2] == started[1]  # INFO, then printed
        assert "Serving: Worker gRPC server start success, listening on unix:" in worker_log
        cores = len(os.sched_getaffinity(worker.pid))
        threads = {
            msg for _, path, msg in records(worker_log, worker.pid) if path == "mindspore_serving/worker/cpu_threads.py"
        }
        assert f"servable add: MindSpore CPU kernel threads {cores} (the cores this worker may use)" in threads

        # GLOG_logtostderr=0: one mindspore_serving.log.<pid> per process in GLOG_log_dir, at GLOG_v's level
        own = sorted(name for name in os.listdir(log_dir) if name.startswith("mindspore_serving.log."))
        assert own == sorted([f"mindspore_serving.log.{master_pid}", f"mindspore_serving.log.{worker.pid}"])
        master_file = (log_dir / f"mindspore_serving.log.{master_pid}").read_text()
        worker_file = (log_dir / f"mindspore_serving.log.{worker.pid}").read_text()
        assert any("Register success" in msg for _, _, msg in records(master_file, master_pid))
        assert len([msg for _, _, msg in records(worker_file, worker.pid) if "WorkerRequestHandle" in msg]) == 2
    finally:
        proc.close()
