"""num_parallel_workers benchmark: a servable whose Python pre-processing dominates, served by its device worker
alone and with an extra worker process beside it.

    .venv/bin/python bench/parallel_workers.py              # about 7 minutes
    .venv/bin/python bench/parallel_workers.py --rounds 1 --duration 5 --concurrency 4,16 --out /tmp/x.json

What it does, all on 127.0.0.1, every server started (and killed at the end, even on error) by this script:
1. exports bench/servables/py_heavy's model when missing (export_model.py: Dense(64, 16), batch dimension 8); its
   method runs ~5 ms of pure Python per instance before the model;
2. starts the servable with num_parallel_workers 0 and 2 (device_ids=0: the device worker alone; the device
   worker and one extra worker process), checks a reply from each, then --rounds times, alternating the servers,
   drives MSService.Predict with single-instance requests from --concurrency closed-loop gRPC clients (h2load,
   or the Python fallback of bench/loadgen.py) for --duration seconds after a warm-up;
3. records instances/s, latency, bad replies and the CPU each server process used (master, device worker, extra
   worker) per instance, prints a table and the ratio of instances/s (npw=2 over npw=0 in each round, and their
   median; the target on a 2-core machine is >= 1.7), and writes JSON (default bench/results/parallel_workers.json).

The machine's other load ("other" cores in the table) takes cores from the servers: each measurement waits (up to
--patience seconds) for it to fall below --quiet cores, and rounds spread what remains over both servers.

The Python stage holds the GIL: one process runs at most ~200 instances/s of it however many threads it has, and
the extra worker is what lets a second core do it. Its model calls go through the master to the device worker
(tensors in shared memory), which batches them with its own. Each worker gets two calls in flight from the master
(master/dispatcher.py), so that its stage thread runs one call's Python while the other's model call and answers
travel; with both workers busy the servers then use ~1.9 of the 2 cores. What the extra worker costs is CPU: the
model-call hop, and calls half as large (more calls per instance), add ~10% of CPU per instance.

A shared host also runs the same work at different speeds from minute to minute (the npw=0 device worker's CPU
per instance, ~5.3 ms on a quiet host, has varied from 5.1 to 8.9 ms between measurements of one run): only the
median over rounds means much.
"""

import argparse
import datetime
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, BENCH)

import loadgen  # noqa: E402  (bench/loadgen.py)
from classic import CpuMeter, Server, grpc_call  # noqa: E402  (bench/classic.py)
from run_output import log, note_other_load, write_report  # noqa: E402  (bench/run_output.py)
from serving_process import free_port  # noqa: E402  (tests/serving_process.py)

SERVABLE = "py_heavy"
SERVABLES = os.path.join(BENCH, "servables")
EXPORT = os.path.join(SERVABLES, SERVABLE, "export_model.py")
DEFAULT_OUT = os.path.join(BENCH, "results", "parallel_workers.json")
TARGET_RATIO = 1.7
SERVER_SCRIPT = """import sys
from mindspore_serving import server
device_type = None if sys.argv[4] == "none" else sys.argv[4]
server.start_servables(server.ServableStartConfig(sys.argv[2], "py_heavy", device_ids=0, device_type=device_type,
                                                  num_parallel_workers=int(sys.argv[3])))
server.start_grpc_server(sys.argv[1])
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each (default 2)")
    parser.add_argument(
        "--concurrency", default="8,16,32,64", help="comma-separated client counts (default 8,16,32,64)"
    )
    parser.add_argument("--workers", default="0,2", help="num_parallel_workers values (default 0,2)")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each server, alternating (default 3)")
    parser.add_argument("--loadgen", choices=("auto", "native", "python"), default="auto")
    parser.add_argument(
        "--quiet",
        type=float,
        default=0.2,
        help="before each measurement, wait until other processes use fewer cores (default 0.2)",
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=60.0,
        help="...for at most this many seconds, then measure anyway (default 60)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"JSON report (default {DEFAULT_OUT})")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' working directories")
    parser.add_argument(
        "--device_type",
        choices=("none", "cpu"),
        default="none",
        help="none (default): the extra worker's model calls go through the master to the device "
        "worker; cpu: as in MindSpore Serving, an extra worker on CPU loads the models itself",
    )
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    return args


def export_module():
    """bench/servables/py_heavy/export_model.py, under a private name (other bench servables' are export_model too)."""
    spec = importlib.util.spec_from_file_location("_bench_py_heavy_export", EXPORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ensure_model(export_model):
    if export_model.missing():
        log(f"exporting the bench model ({os.path.relpath(export_model.MODEL_PATH, ROOT)})")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        subprocess.run([sys.executable, EXPORT], check=True, stdout=subprocess.DEVNULL, env=env)


class ParallelServer(Server):
    """The servable on device 0 with `workers` num_parallel_workers, run by `script` (SERVER_SCRIPT)."""

    def __init__(self, script: str, workers: int, device_type: str = "none"):
        self.grpc = f"127.0.0.1:{free_port()}"
        super().__init__(
            f"npw{workers}",
            [script, self.grpc, SERVABLES, str(workers), device_type],
            ready_text="gRPC server start success",
            env={"PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))},
        )

    def role(self, proc: psutil.Process) -> str:
        """master, device worker or extra worker (the CPU meter's split of this server's CPU)."""
        role = super().role(proc)
        if role != "worker":
            return role
        try:
            return "extra worker" if "start_extra_worker" in " ".join(proc.cmdline()) else "device worker"
        except psutil.Error:
            return "gone"


def request_bytes() -> bytes:
    """A Predict request with one instance."""
    from mindspore_serving.client import convert  # pylint: disable=import-outside-toplevel

    return convert.create_request([{"x": bench_input()}], SERVABLE, "predict", 0).SerializeToString()


def bench_input() -> np.ndarray:
    return (np.arange(64, dtype=np.float32) - 32) / 16


def check_reply(address: str, request: bytes, export_model) -> bytes:
    from mindspore_serving.common.tensor_codec import reply_to_results  # pylint: disable=import-outside-toplevel

    reply = grpc_call(address, request)
    results = reply_to_results(reply, copy=True)
    expected = export_model.numpy_forward(2 * bench_input()[None, :])[0]
    if not isinstance(results, list) or not np.allclose(results[0]["y"], expected, rtol=1e-4, atol=1e-4):
        raise AssertionError(f"wrong {SERVABLE} result: {results}")
    return reply.SerializeToString()


def other_cores(servers, seconds: float = 1.0) -> float:
    """Cores busy over `seconds` outside the servers' processes (and this one)."""

    def server_cpu():
        return sum(server.cpu_seconds() for server in servers)

    busy0, server0, self0 = CpuMeter._busy(), server_cpu(), time.process_time()
    time.sleep(seconds)  # ok-sleep: a measurement window
    return max(0.0, CpuMeter._busy() - busy0 - (server_cpu() - server0) - (time.process_time() - self0)) / seconds


def wait_for_quiet(servers, limit: float, patience: float) -> float:
    """Waits (at most `patience` seconds) until other processes use less than `limit` cores; returns their last
    measured use. On a shared machine their load takes cores from the servers and distorts the comparison."""
    deadline = time.monotonic() + patience
    busy = other_cores(servers)
    while busy > limit and time.monotonic() < deadline:
        busy = other_cores(servers)
    return busy


def measure(server: ParallelServer, request: bytes, good: bytes, concurrency: int, args, workdir: str) -> dict:
    if args.warmup > 0:
        loadgen.run_grpc(server.grpc, request, good, concurrency, args.warmup, workdir, args.loadgen)
    with CpuMeter(server) as meter:
        result = loadgen.run_grpc(server.grpc, request, good, concurrency, args.duration, workdir, args.loadgen)
    row = result.to_dict()
    row.update(meter.summary(result.requests))
    row["instances_per_s"] = row["rps"]  # single-instance requests
    row["cpu_us_per_instance_by_role"] = (
        {role: round(value) for role, value in row["cpu_us_per_req_by_role"].items()} if result.requests else {}
    )
    return row


def table(rows: list[dict]) -> str:
    head = (
        f"{'round':>5} {'npw':>4} {'conc':>5} {'inst/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'bad':>4} "
        f"{'srv cores':>9} {'other':>6}  CPU us/instance by process"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        roles = ", ".join(f"{role} {value}" for role, value in sorted(row["cpu_us_per_instance_by_role"].items()))
        lines.append(
            f"{row['round']:>5} {row['num_parallel_workers']:>4} {row['concurrency']:>5} "
            f"{row['instances_per_s']:>8.1f} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['bad']:>4} "
            f"{row['server_cores']:>9.2f} {row['other_cores']:>6.2f}  {roles}"
        )
    return "\n".join(lines)


def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_exit)
    started = time.time()
    export_model = export_module()
    ensure_model(export_model)
    workdir = loadgen.scratch_dir()
    tools = "h2load" if args.loadgen != "python" and loadgen.have("h2load") else "python-grpc-aio"
    report = {
        "meta": {
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "load_generator": tools,
            "servable": f"bench/servables/{SERVABLE}",
            "device_type": args.device_type,
            "python_stage": "about 5 ms of pure Python per instance (servable_config.py ROUNDS)",
        },
        "results": [],
        "ratios": {},
    }
    request = request_bytes()
    script = os.path.join(workdir, "server.py")
    with open(script, "w") as stream:
        stream.write(SERVER_SCRIPT)
    servers: dict[int, ParallelServer] = {}
    try:
        for workers in args.workers:  # all started first: idle, one costs only its heartbeats while another runs
            servers[workers] = ParallelServer(script, workers, args.device_type)
        goods = {}
        for workers, server in servers.items():
            server.wait_ready(lambda server=server: check_reply(server.grpc, request, export_model))
            goods[workers] = check_reply(server.grpc, request, export_model)
            log(f"num_parallel_workers={workers}: {len(server.processes) - 1} worker process(es) ready")
        # rounds alternate the servers, so that a change in the machine's other load hits each of them alike
        for round_index in range(args.rounds):
            for concurrency in args.concurrency:
                for workers, server in servers.items():
                    before = wait_for_quiet(servers.values(), args.quiet, args.patience)
                    row = {
                        "round": round_index,
                        "num_parallel_workers": workers,
                        "other_cores_before": round(before, 2),
                    }
                    row.update(measure(server, request, goods[workers], concurrency, args, workdir))
                    report["results"].append(row)
                    log(
                        f"round {round_index} npw={workers} c={concurrency}: {row['instances_per_s']:.1f} "
                        f"instances/s, p50 {row['p50_ms']:.1f} ms, bad {row['bad']}, other cores "
                        f"{row['other_cores']}"
                    )
    finally:
        for workers, server in servers.items():
            server.stop(keep_dir=args.keep_logs)
            if args.keep_logs:
                log(f"logs of npw={workers}: {server.workdir}")
        shutil.rmtree(workdir, ignore_errors=True)

    rows = report["results"]
    base_workers = min(args.workers)
    for concurrency in args.concurrency:
        for workers in args.workers:
            if workers == base_workers:
                continue
            ratios = []
            for round_index in range(args.rounds):
                rate = {
                    row["num_parallel_workers"]: row["instances_per_s"]
                    for row in rows
                    if row["concurrency"] == concurrency and row["round"] == round_index
                }
                if rate.get(base_workers):
                    ratios.append(rate[workers] / rate[base_workers])
            if ratios:
                report["ratios"][f"npw{workers}/npw{base_workers} c={concurrency}"] = {
                    "median": round(statistics.median(ratios), 2),
                    "rounds": [round(r, 2) for r in ratios],
                }
    write_report(report, started, args.out, indent=2)
    print()
    print(table(rows))
    print()
    for name, ratio in report["ratios"].items():
        verdict = "meets" if ratio["median"] >= TARGET_RATIO else "misses"
        print(
            f"instances/s {name}: {ratio['median']:.2f}x, median of rounds {ratio['rounds']} ({verdict} the "
            f"{TARGET_RATIO}x target)"
        )
    note_other_load([row["other_cores"] for row in rows])
    log(f"wrote {args.out} (wall {report['meta']['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
