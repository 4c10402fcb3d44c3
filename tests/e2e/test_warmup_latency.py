"""Warm-up end to end: a copy of `lenet` started with and without its warmup/ folder. The worker logs the
warm-up per method before it registers, and the first request succeeds either way; the first-request
latencies are printed (measured, never asserted: see docs/servables.md, "Warm-up")."""

import glob
import os
import shutil
import time

from serving_process import SERVABLES, start_server

from mindspore_serving.client import Client

IMAGE = os.path.join(SERVABLES, "lenet", "images", "digit_7_0.png")


def copy_lenet(directory, with_warmup):
    ignore = shutil.ignore_patterns("images", "*.ckpt", *(() if with_warmup else ("warmup",)))
    shutil.copytree(os.path.join(SERVABLES, "lenet"), os.path.join(directory, "lenet"), ignore=ignore)
    return str(directory)


def first_requests(tmp_path, with_warmup):
    """(worker log, seconds of the first request, seconds of the second) of a fresh server."""
    servables = copy_lenet(tmp_path / "servables", with_warmup)
    proc, grpc_addr, _ = start_server(
        tmp_path, servables=("lenet",), rest=False, extra_args=["--servable_directory", servables], env={"GLOG_v": "1"}
    )
    try:
        with open(IMAGE, "rb") as stream:
            image = stream.read()
        client = Client(grpc_addr, "lenet", "classify_top1")
        timings = []
        for _ in range(2):
            started = time.perf_counter()
            result = client.infer({"image": image})
            timings.append(time.perf_counter() - started)
            assert result == [{"label": "7"}], result
        (log_path,) = glob.glob(str(tmp_path / "serving_logs" / "log_lenet_*.log"))
        with open(log_path, encoding="utf-8", errors="replace") as stream:
            return stream.read(), timings[0], timings[1]
    finally:
        proc.close()


def test_warmup_runs_before_the_worker_is_ready_and_first_requests_succeed(tmp_path):
    cold_log, cold_first, cold_second = first_requests(tmp_path / "cold", with_warmup=False)
    warm_log, warm_first, warm_second = first_requests(tmp_path / "warm", with_warmup=True)
    assert "warm-up of method" not in cold_log
    for method in ("classify_top1", "classify_top1_batch"):
        assert f"warm-up of method {method}: 2 instances in" in warm_log
    # the warm-up ran before the worker told the master it started
    assert warm_log.index("warm-up of method classify_top1:") < warm_log.index("Start servable success")
    print(
        f"\nlenet classify_top1 first request: without warm-up {cold_first * 1000:.1f} ms "
        f"(second {cold_second * 1000:.1f} ms), with warm-up {warm_first * 1000:.1f} ms "
        f"(second {warm_second * 1000:.1f} ms)"
    )
