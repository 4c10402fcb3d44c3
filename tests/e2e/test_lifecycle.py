"""Process lifecycle end to end: worker death and restart, SIGTERM, start-up failures."""

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
from serving_process import ROOT, ServingProcess, free_port, start_server, wait_until

from mindspore_serving.client import Client

TEST_SERVABLES = os.path.join(ROOT, "tests", "servables")


def workers_of(proc):
    return [
        p
        for p in psutil.Process(proc.proc.pid).children(recursive=True)
        if any("start_worker" in part for part in p.cmdline())
    ]


def test_killed_worker_fails_in_flight_requests_and_is_restarted(tmp_path):
    marker = tmp_path / "stage_started"
    proc, grpc_addr, _ = start_server(
        tmp_path,
        servables=("slow",),
        rest=False,
        extra_args=["--servable_directory", TEST_SERVABLES],
        env={"GLOG_v": "1", "SLOW_STAGE_STARTED": str(marker)},
    )
    try:
        (worker,) = workers_of(proc)
        client = Client(grpc_addr, "slow", "sleep")
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(client.infer, {"seconds": np.float32(30)}) for _ in range(4)]
            # the worker is inside the slow stage (it runs the requests one after another): they are in flight
            wait_until(marker.exists, 60, "the slow stage started")
            started = time.monotonic()
            worker.kill()
            results = [future.result(timeout=15) for future in futures]
        assert time.monotonic() - started < 10
        for result in results:
            text = result["error"] if isinstance(result, dict) else result[0]["error"]
            assert "not available" in text
        proc.wait_for("Register success", count=2, timeout=120)
        (new_worker,) = workers_of(proc)
        assert new_worker.pid != worker.pid
        result = client.infer({"seconds": np.float32(0)})
        assert result[0]["y"].item() == 0.0
    finally:
        proc.close()


def test_sigterm_stops_server_and_workers(tmp_path):
    proc, grpc_addr, rest_addr = start_server(tmp_path, servables=("add",))
    workers = workers_of(proc)
    assert workers
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait_exit(30) == 0
    for worker in workers:
        wait_until(lambda w=worker: not w.is_running() or w.status() == psutil.STATUS_ZOMBIE, 15, "worker exit")
    out = proc.output()
    assert "refused" not in out  # the workers' exit notices are heard while the master stops
    # MindSpore Serving's lines: the signal, then each worker asked to exit (SIGINT)
    assert re.search(r"\[WARNING\] SERVING\(.*\] Serving server begin to exit: receive exit signal\n", out)
    assert f"Send signal 2 to worker, servable name: add, version: 1, device id: 0, pid: {workers[0].pid}\n" in out
    proc.close()


def test_master_killed_workers_follow(tmp_path):
    proc, _, _ = start_server(tmp_path, servables=("add",), rest=False)
    workers = workers_of(proc)
    proc.proc.kill()
    proc.proc.wait()
    for worker in workers:
        wait_until(lambda w=worker: not w.is_running() or w.status() == psutil.STATUS_ZOMBIE, 15, "orphan exit")
    proc.close()


def test_broken_servable_fails_start_with_reason(tmp_path):
    args = [
        os.path.join(ROOT, "serving_server.py"),
        "--grpc",
        f"127.0.0.1:{free_port()}",
        "--rest",
        "",
        "--servables",
        "broken",
        "--servable_directory",
        TEST_SERVABLES,
    ]
    proc = ServingProcess(args, str(tmp_path))
    try:
        code = proc.wait_exit(120)
        out = proc.output()
        assert code != 0
        reason = "<import broken.servable_config failed, this servable is broken on purpose>"
        assert f"Fail to start workers: {{servable name:broken, device id:0, {reason}}}" in out
        # MindSpore Serving's two ERROR lines of the master
        assert re.search(
            rf"\[ERROR\] SERVING\(.*\] Worker notify failed, worker pid: \d+, error reported: "
            rf"<{{servable name:broken, device id:0, {re.escape(reason)}}}>",
            out,
        )
        assert re.search(
            r"\[ERROR\] SERVING\(.*\] Notify worker start-up error, servable name: broken, version: 0, "
            r"device id: 0, worker pid: \d+",
            out,
        )
    finally:
        proc.close()


def test_sigterm_lets_requests_in_flight_finish(tmp_path):
    marker = tmp_path / "stage_started"
    proc, grpc_addr, _ = start_server(
        tmp_path,
        servables=("slow",),
        rest=False,
        extra_args=["--servable_directory", TEST_SERVABLES],
        env={"SLOW_STAGE_STARTED": str(marker)},
    )
    try:
        client = Client(grpc_addr, "slow", "sleep")
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(client.infer, {"seconds": np.float32(1.5)})
            wait_until(marker.exists, 60, "the slow stage started")  # the request is in flight in the worker
            proc.proc.send_signal(signal.SIGTERM)
            result = future.result(timeout=30)
        assert result[0]["y"].item() == 1.5
        assert proc.wait_exit(30) == 0
    finally:
        proc.close()
