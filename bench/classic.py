"""Classic-serving benchmark: our `add` servable over gRPC and REST against mosec and plain FastAPI, plus batching
efficiency on a model whose cost grows slowly with the batch size.

    .venv/bin/python bench/classic.py                 # full run, about 3-4 minutes
    .venv/bin/python bench/classic.py --quick         # about 1 minute
    .venv/bin/python bench/classic.py --skip-peers --concurrency 1,64 --duration 5 --out /tmp/x.json

What it does, all on 127.0.0.1, every server started (and killed at the end, even on error) by this script:
1. starts `serving_server.py --servables add` (ours), the mosec peer (bench/peers/mosec_add.py: one worker,
   max_batch_size 8, max_wait_time 5 ms), the FastAPI peer (bench/peers/fastapi_add.py: `async def` route,
   uvicorn + uvloop + httptools), `serving_server.py --servable_directory bench/servables --servables
   dense_batch` and the mosec dense peer (bench/peers/mosec_dense.py: the same MindIR through GraphCell, dynamic
   batching up to 64, max_wait_time 10 ms), and checks each one's answer;
2. for each concurrency, drives ours over REST and gRPC, mosec and FastAPI over REST for --duration seconds
   (closed loop: wrk for HTTP, h2load for gRPC; Python asyncio fallbacks, see bench/loadgen.py) and records
   requests/s, p50/p99 latency, bad replies and the CPU time the server used per request (master and worker
   apart); then the bare loop of the same `add` GraphCell in-process (bench/model_direct.py --model add), which
   ours is compared with (calls/s, and p50 latency over one call);
3. batching: the dense_batch model's own best throughput (its MindIR called in-process with full batches of
   64, bench/model_direct.py) on all cores and bound to one core, then ours (gRPC and REST) and the mosec peer
   (REST) at 64 clients with single-instance requests. Ours is compared with the whole-machine limit and with
   the limit on the cores its worker can use: all cores less those the master and the load generator used
   during the run, the limit there interpolated between the one-core and the all-core runs;
4. records the resident memory of each of our processes, prints tables and writes JSON (default
   bench/results/classic.json).

All processes share this machine's cores with the load generator (and with whatever else runs): the JSON records
the CPU used by others during each measurement ("other_cores") so noisy runs can be spotted.
Needs: wrk and nghttp2-client (apt-get install -y wrk nghttp2-client) for the native load generators, and
requirements-bench.txt (mosec) for the mosec peer.
"""

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Optional

import numpy as np
import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, BENCH)

import loadgen  # noqa: E402  (bench/loadgen.py)
from run_output import log, note_other_load, write_report  # noqa: E402  (bench/run_output.py)
from serving_process import ServingProcess, free_port  # noqa: E402  (tests/serving_process.py)

BENCH_SERVABLES = os.path.join(BENCH, "servables")
DENSE = "dense_batch"
DENSE_EXPORT = os.path.join(BENCH_SERVABLES, DENSE, "export_model.py")
DEFAULT_OUT = os.path.join(BENCH, "results", "classic.json")

X1 = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
X2 = np.array([[5.0, 6.0], [7.0, 8.0]], np.float32)
ADD_BODY = json.dumps({"instances": [{"x1": X1.tolist(), "x2": X2.tolist()}]}, separators=(",", ":")).encode()


# --------------------------------------------------------------------------------------------- servers


class Server:
    """A process tree started by the benchmark; stop() ends all of it (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        name: str,
        args: list[str],
        ready_text: str | None = None,
        env: dict | None = None,
        python: str | None = None,
    ):
        self.name = name
        self.workdir = tempfile.mkdtemp(prefix=f"ms_bench_{name}_")
        self.ready_text = ready_text
        args = [arg.replace("{workdir}", self.workdir) for arg in args]
        self.proc = ServingProcess(args, self.workdir, env, python)
        self.processes: list[psutil.Process] = []

    @property
    def pid(self) -> int:
        return self.proc.proc.pid

    def wait_ready(self, probe, timeout: float = 240.0):
        """Waits for the ready line (if any), then until `probe()` returns without raising."""
        deadline = time.monotonic() + timeout
        if self.ready_text:
            self.proc.wait_for(self.ready_text, timeout=timeout)
        last = None
        while time.monotonic() < deadline:
            if self.proc.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.proc.returncode}:\n{self.proc.output()[-3000:]}"
                )
            try:
                probe()
                self.refresh()
                return
            except Exception as err:  # not up yet
                last = err
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready in {timeout} s: {last}\n{self.proc.output()[-3000:]}")

    def refresh(self):
        self.proc.remember_children()
        try:
            root = psutil.Process(self.pid)
            self.processes = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            self.processes = []

    def cpu_seconds(self) -> float:
        return sum(self.cpu_by_role().values())

    def role(self, proc: psutil.Process) -> str:
        """master (the process this benchmark started), worker (a serving worker) or the process's name."""
        if proc.pid == self.pid:
            return "master"
        try:
            cmdline = " ".join(proc.cmdline())
            if "mindspore_serving.frontend_process" in cmdline:
                return "frontend"
            return "worker" if "mindspore_serving.worker" in cmdline else proc.name()
        except psutil.Error:
            return "gone"

    def cpu_by_role(self) -> dict[str, float]:
        seconds: dict[str, float] = {}
        for proc in self.processes:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            role = self.role(proc)
            seconds[role] = seconds.get(role, 0.0) + times.user + times.system
        return seconds

    def resident_mb(self) -> list[dict]:
        """Resident memory of each process of the tree now (MB), with its role and command."""
        found = []
        for proc in self.processes:
            try:
                rss_mb = round(proc.memory_info().rss / 2**20, 1)
                found.append(
                    {
                        "role": self.role(proc),
                        "pid": proc.pid,
                        "rss_mb": rss_mb,
                        "command": " ".join(proc.cmdline())[:160],
                    }
                )
            except psutil.Error:
                continue
        return found

    def stop(self, keep_dir: bool = False):
        self.proc.close(grace=8)  # SIGTERM, then SIGKILL of whatever of the tree is left
        if not keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class OurServer(Server):
    def __init__(
        self,
        name: str,
        servables: str,
        servable_directory: str | None = None,
        frontend_processes: int = 1,
        grpc_server: str | None = None,
    ):
        self.grpc = f"127.0.0.1:{free_port()}"
        self.rest = f"127.0.0.1:{free_port()}"
        self.frontend_processes = frontend_processes
        args = [
            os.path.join(ROOT, "serving_server.py"),
            "--grpc",
            self.grpc,
            "--rest",
            self.rest,
            "--servables",
            servables,
            "--frontend_processes",
            str(frontend_processes),
        ]
        if servable_directory:
            args += ["--servable_directory", servable_directory]
        # the gRPC port's server (frontends/grpc_server.py): h2grpc by default, grpcio's when asked
        env = {"MS_SERVING_GRPC_SERVER": grpc_server} if grpc_server else None
        super().__init__(name, args, ready_text="RESTful server start success", env=env)


ORIG_SETUP = os.path.join(BENCH, "peers", "orig_ms_setup.py")
ORIG_SERVE = os.path.join(BENCH, "peers", "orig_ms_serve.py")


def orig_python() -> str | None:
    """The python of the original MindSpore Serving's venv when bench/peers/orig_ms_setup.py built it, else None."""
    check = subprocess.run([sys.executable, ORIG_SETUP, "--check"], capture_output=True, text=True)
    return check.stdout.strip() if check.returncode == 0 else None


class OrigServer(Server):
    """The original MindSpore Serving 2.0.2 (bench/peers/orig_ms_serve.py) serving add and dense_batch; its C++
    master is the process started here, its workers (one per servable, running Lite) are the children."""

    def __init__(self, python: str):
        self.grpc = f"127.0.0.1:{free_port()}"
        self.rest = f"127.0.0.1:{free_port()}"
        super().__init__(
            "original",
            [
                ORIG_SERVE,
                "--grpc-port",
                self.grpc.split(":")[1],
                "--rest-port",
                self.rest.split(":")[1],
                "--run-dir",
                "{workdir}",
            ],
            ready_text="ORIG_MS_READY",
            python=python,
        )

    def role(self, proc: psutil.Process) -> str:
        return "master" if proc.pid == self.pid else "worker"


class HttpPeer(Server):
    def __init__(self, name: str, script: str, path: str, extra: list[str] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{path}"
        super().__init__(name, [os.path.join(BENCH, "peers", script), "--port", str(self.port), *extra])


def http_post(url: str, body: bytes, timeout: float = 10.0) -> bytes:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return reply.read()


def check_add_reply(data: bytes):
    reply = json.loads(data)
    y = np.asarray(reply["instances"][0]["y"], np.float32)
    if not np.allclose(y, X1 + X2):
        raise AssertionError(f"wrong add result: {data[:200]!r}")


# -------------------------------------------------------------------------------------------- requests


def add_grpc_request() -> bytes:
    from mindspore_serving.client import convert

    return convert.create_request([{"x1": X1, "x2": X2}], "add", "add_common", 0).SerializeToString()


def grpc_call(address: str, request: bytes):
    import grpc

    from mindspore_serving.proto import ms_service_pb2, ms_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = ms_service_pb2_grpc.MSServiceStub(channel)
        return stub.Predict(ms_service_pb2.PredictRequest.FromString(request), timeout=30)


def check_grpc_add(address: str, request: bytes) -> bytes:
    from mindspore_serving.common.tensor_codec import reply_to_results

    reply = grpc_call(address, request)
    results = reply_to_results(reply)
    if not isinstance(results, list) or not np.allclose(results[0]["y"], X1 + X2):
        raise AssertionError(f"wrong gRPC add result: {results}")
    return reply.SerializeToString()


def dense_input() -> np.ndarray:
    return np.random.default_rng(7).standard_normal(512).astype(np.float32)


def dense_requests():
    """(REST body, gRPC request bytes) with one instance of the dense_batch model."""
    from mindspore_serving.client import convert

    x = dense_input()
    body = json.dumps({"instances": [{"x": x.tolist()}]}, separators=(",", ":")).encode()
    grpc_request = convert.create_request([{"x": x}], DENSE, "predict", 0).SerializeToString()
    return body, grpc_request


def _check_dense(results):
    sys.path.insert(0, os.path.dirname(DENSE_EXPORT))
    import export_model

    expected = export_model.numpy_forward(dense_input()[None, :])[0]
    if not isinstance(results, list) or not np.allclose(results[0]["y"], expected, rtol=1e-3, atol=1e-3):
        raise AssertionError(f"wrong dense_batch result: {str(results)[:300]}")


def check_grpc_dense(address: str, request: bytes) -> bytes:
    from mindspore_serving.common.tensor_codec import reply_to_results

    reply = grpc_call(address, request)
    _check_dense(reply_to_results(reply))
    return reply.SerializeToString()


def check_dense_reply(data: bytes):
    """A REST reply (ours or the mosec peer's) to dense_requests()' body."""
    _check_dense([{"y": np.asarray(item["y"], np.float32)} for item in json.loads(data)["instances"]])


# ---------------------------------------------------------------------------------------------- meter


class CpuMeter:
    """CPU used during one measurement: by the server's processes, by the load generator, and by anything else."""

    def __init__(self, server: Server):
        self.server = server

    def __enter__(self):
        self.server.refresh()
        self.t0 = time.perf_counter()
        self.busy0 = self._busy()
        self.roles0 = self.server.cpu_by_role()
        self.server0 = sum(self.roles0.values())
        self.children0 = self._children()
        self.self0 = time.process_time()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.perf_counter() - self.t0
        self.busy = self._busy() - self.busy0
        roles = self.server.cpu_by_role()
        self.role_cpu = {role: value - self.roles0.get(role, 0.0) for role, value in roles.items()}
        self.server_cpu = sum(roles.values()) - self.server0
        self.loadgen_cpu = self._children() - self.children0 + time.process_time() - self.self0
        return False

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)

    @staticmethod
    def _children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def summary(self, requests: int) -> dict:
        other = self.busy - self.server_cpu - self.loadgen_cpu
        return {
            "server_cores": round(self.server_cpu / self.elapsed, 2),
            "loadgen_cores": round(self.loadgen_cpu / self.elapsed, 2),
            "other_cores": round(max(0.0, other) / self.elapsed, 2),
            "server_cpu_us_per_req": round(self.server_cpu / requests * 1e6, 1) if requests else None,
            "cores_by_role": {role: round(value / self.elapsed, 2) for role, value in sorted(self.role_cpu.items())},
            "cpu_us_per_req_by_role": {
                role: round(value / requests * 1e6, 1) if requests else None
                for role, value in sorted(self.role_cpu.items())
            },
        }


def measure(
    kind: str,
    server: Server,
    target,
    body: bytes,
    concurrency: int,
    seconds: float,
    warmup: float,
    workdir: str,
    prefer: str,
    good_reply: bytes = b"",
) -> dict:
    def run(duration):
        if kind == "rest":
            return loadgen.run_http(target, body, concurrency, duration, workdir, prefer)
        return loadgen.run_grpc(target, body, good_reply, concurrency, duration, workdir, prefer)

    if warmup > 0:
        run(warmup)
    with CpuMeter(server) as meter:
        result = run(seconds)
    row = result.to_dict()
    row.update(meter.summary(result.requests))
    return row


# ---------------------------------------------------------------------------------------------- report

COLUMNS = [
    ("server", "server", "{}"),
    ("protocol", "protocol", "{}"),
    ("concurrency", "conc", "{}"),
    ("rps", "req/s", "{:.0f}"),
    ("p50_ms", "p50 ms", "{:.2f}"),
    ("p99_ms", "p99 ms", "{:.2f}"),
    ("bad", "bad", "{}"),
    ("server_cpu_us_per_req", "srv CPU us/req", "{:.0f}"),
    ("other_cores", "other cores", "{:.2f}"),
    ("ratio_mosec", "ours/mosec", "{:.2f}"),
    ("ratio_fastapi", "ours/FastAPI", "{:.2f}"),
    ("ratio_bare", "ours/bare loop", "{:.2f}"),
    ("p50_over_bare_ms", "p50 - bare call ms", "{:.2f}"),
]


def fmt(value, pattern: str) -> str:
    if value is None or value == "":
        return "-"
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(key), pattern) for key, _, pattern in COLUMNS) + " |")
    return "\n".join(lines)


def add_ratios(rows: list[dict]):
    peers: dict[tuple, float] = {(r["server"], r["concurrency"]): r["rps"] for r in rows if r["server"] != "ours"}
    for row in rows:
        if row["server"] != "ours":
            continue
        for peer in ("mosec", "fastapi"):
            base = peers.get((peer, row["concurrency"]))
            row[f"ratio_{peer}"] = round(row["rps"] / base, 3) if base else None


def batching_table(batching: dict) -> str:
    direct, one = batching.get("direct") or {}, batching.get("direct_one_core") or {}
    lines = [
        f"direct (in-process GraphCell, batch {direct.get('batch')}): "
        f"{fmt(direct.get('instances_per_s'), '{:.0f}')} instances/s on {direct.get('cores')} cores "
        f"({fmt(direct.get('ms_per_batch_mean'), '{:.2f}')} ms per batch), "
        f"{fmt(one.get('instances_per_s'), '{:.0f}')} on one core",
        "| server | protocol | conc | instances/s | p50 ms | p99 ms | bad | cores: master / worker / load gen "
        "| of direct | worker's cores | of the limit on them | ours/mosec |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in batching.get("served", []):
        roles = row.get("cores_by_role", {})
        cores = (
            f"{fmt(roles.get('master'), '{:.2f}')} / {fmt(roles.get('worker'), '{:.2f}')} / "
            f"{fmt(row.get('loadgen_cores'), '{:.2f}')}"
            if row["server"] == "ours"
            else f"{fmt(row.get('server_cores'), '{:.2f}')} (all) / {fmt(row.get('loadgen_cores'), '{:.2f}')}"
        )
        lines.append(
            f"| {row['server']} | {row['protocol']} | {row['concurrency']} | {fmt(row['rps'], '{:.0f}')} | "
            f"{fmt(row['p50_ms'], '{:.2f}')} | {fmt(row['p99_ms'], '{:.2f}')} | {row['bad']} | {cores} | "
            f"{fmt(row.get('fraction_of_direct'), '{:.3f}')} | "
            f"{fmt(row.get('worker_cores_available'), '{:.2f}')} | "
            f"{fmt(row.get('fraction_of_available_limit'), '{:.3f}')} | "
            f"{fmt(row.get('ratio_mosec'), '{:.2f}')} |"
        )
    return "\n".join(lines)


def memory_table(memory: dict[str, list[dict]]) -> str:
    lines = ["| server | process | resident MB |", "|---|---|---|"]
    for server, processes in memory.items():
        for proc in processes:
            lines.append(f"| {server} | {proc['role']} (pid {proc['pid']}) | {proc['rss_mb']:.0f} |")
    return "\n".join(lines)


def versions() -> dict:
    found = {"python": platform.python_version()}
    # read from package metadata: importing mindspore here would switch the servers this process starts to the
    # pure-Python protobuf (it sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python when unset)
    for module, dist in (
        ("mindspore", "mindspore"),
        ("grpc", "grpcio"),
        ("fastapi", "fastapi"),
        ("uvicorn", "uvicorn"),
        ("mosec", "mosec"),
        ("numpy", "numpy"),
        ("orjson", "orjson"),
    ):
        try:
            found[module] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[module] = None
    for tool, flag in (("wrk", "-v"), ("h2load", "--version")):
        if shutil.which(tool):
            out = subprocess.run([tool, flag], capture_output=True, text=True)
            found[tool] = (out.stdout or out.stderr).splitlines()[0].strip() if (out.stdout or out.stderr) else "?"
        else:
            found[tool] = None
    return found


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=None, help="seconds per measurement (default 8; quick 2)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds of unrecorded load before each measurement (default 1; quick 0)",
    )
    parser.add_argument(
        "--concurrency", default=None, help="comma-separated client counts (default 1,8,64; quick 1,64)"
    )
    parser.add_argument("--quick", action="store_true", help="short run (about a minute): 2 s points, c=1,64")
    parser.add_argument("--skip-peers", action="store_true", help="only our server (no peer at all)")
    parser.add_argument(
        "--peers",
        default="original,mosec,fastapi",
        help="comma-separated peers: original (MindSpore Serving 2.0.2, when "
        "bench/peers/orig_ms_setup.py built it), mosec, fastapi (default: all)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="alternated rounds of ours against the original (each server's median is kept)",
    )
    parser.add_argument(
        "--frontend-processes",
        default="1",
        help="comma-separated front-end process counts of ours measured against the original "
        "(default 1; e.g. 1,2: both, alternated in the same rounds)",
    )
    parser.add_argument(
        "--grpc-servers",
        default="h2grpc",
        help="comma-separated gRPC servers of ours measured against the original: h2grpc (ours, "
        "the default), grpcio (grpcio's aio server); the first is the one of every other part",
    )
    parser.add_argument(
        "--original-concurrency",
        default="1,64",
        help="client counts of the comparison with the original (default 1,64)",
    )
    parser.add_argument("--skip-batching", action="store_true", help="no batching-efficiency part")
    parser.add_argument(
        "--loadgen",
        choices=("auto", "native", "python"),
        default="auto",
        help="auto: wrk/h2load when installed, else Python; native: require them; python: always Python",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"JSON output (default {os.path.relpath(DEFAULT_OUT, ROOT)})"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' working directories and logs")
    args = parser.parse_args(argv)
    args.duration = args.duration if args.duration is not None else (2.0 if args.quick else 8.0)
    args.warmup = args.warmup if args.warmup is not None else (0.0 if args.quick else 1.0)
    text = args.concurrency or ("1,64" if args.quick else "1,8,64")
    args.concurrency = [int(c) for c in text.split(",") if c.strip()]
    args.peers = set() if args.skip_peers else {peer.strip() for peer in args.peers.split(",") if peer.strip()}
    unknown = args.peers - {"original", "mosec", "fastapi"}
    if unknown:
        parser.error(f"unknown peers: {', '.join(sorted(unknown))}")
    args.original_concurrency = [int(c) for c in args.original_concurrency.split(",") if c.strip()]
    args.frontend_processes = [int(c) for c in args.frontend_processes.split(",") if c.strip()]
    args.grpc_servers = [kind.strip() for kind in args.grpc_servers.split(",") if kind.strip()]
    if not args.grpc_servers or set(args.grpc_servers) - {"h2grpc", "grpcio"}:
        parser.error("--grpc-servers takes h2grpc and/or grpcio")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not args.concurrency or min(args.concurrency) < 1 or max(args.concurrency) > 1024:
        parser.error("--concurrency takes numbers between 1 and 1024")
    if args.duration <= 0 or args.duration > 120:
        parser.error("--duration must be in (0, 120] seconds")
    return args


def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


def ensure_dense_model():
    sys.path.insert(0, os.path.dirname(DENSE_EXPORT))
    import export_model

    if export_model.missing():
        log(f"exporting the bench model ({os.path.relpath(export_model.MODEL_PATH, ROOT)})")
        subprocess.run([sys.executable, DENSE_EXPORT], check=True, stdout=subprocess.DEVNULL)


def run_direct(seconds: float, warmup: float, model: str = "dense", cores: int = 0) -> dict:
    """bench/model_direct.py in a subprocess: the model called in-process back to back (on `cores` cores; 0: all)."""
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "model_direct.py"),
            "--model",
            model,
            "--cores",
            str(cores),
            "--seconds",
            f"{seconds:g}",
            "--warmup",
            f"{warmup:g}",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + warmup + 180,
    )
    line = next((text_line for text_line in proc.stdout.splitlines() if text_line.startswith("DIRECT_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"model_direct.py failed: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return json.loads(line[len("DIRECT_JSON ") :])


def limit_on(cores: float, one: dict, whole: dict) -> float:
    """The model's in-process instances/s on `cores` cores (between 1 and all of them), interpolated linearly
    between the runs bound to one core and on all cores."""
    all_cores = whole["cores"]
    if all_cores <= 1:
        return whole["instances_per_s"]
    share = min(max(cores, 1.0), all_cores)
    gain = (whole["instances_per_s"] - one["instances_per_s"]) / (all_cores - 1)
    return one["instances_per_s"] + (share - 1.0) * gain


def measure_dense(dense: "OurServer", peer: Optional["HttpPeer"], requests: tuple, args, workdir: str) -> dict:
    """dense_batch at 64 clients, single-instance requests (`requests`: REST body, gRPC request, its good reply):
    ours over gRPC and REST, the mosec peer over REST, and the model's in-process limit, on the whole machine and on
    the cores our worker can use while the master and the load generator run (those they left over during each of
    our runs; see limit_on)."""
    body, request, good = requests
    log("batching: direct model throughput (all cores, then one core)")
    seconds, warmup = max(2.0, args.duration), 0.5 if args.quick else 1.0
    whole = run_direct(seconds, warmup)
    one = run_direct(seconds, warmup, cores=1)
    log(
        f"direct: {whole['instances_per_s']:.0f} instances/s on {whole['cores']} cores "
        f"({whole['ms_per_batch_mean']:.2f} ms per batch, {whole['cpu_cores_used']} cores busy), "
        f"{one['instances_per_s']:.0f} on one core"
    )
    result = {
        "model": f"bench/servables/{DENSE} (x [512] -> y [16], batch 64, 512-2048-2048-16 dense stack)",
        "direct": whole,
        "direct_one_core": one,
        "served": [],
    }
    targets = [
        ("ours", "rest", dense, f"http://{dense.rest}/model/{DENSE}:predict", body, b""),
        ("ours", "grpc", dense, dense.grpc, request, good),
    ]
    if peer is not None:
        targets.append(("mosec", "rest", peer, peer.url, body, b""))
    for name, kind, server, target, payload, good_reply in targets:
        row = {"server": name, "protocol": kind, "servable": DENSE}
        row.update(
            measure(
                kind,
                server,
                target,
                payload,
                64,
                args.duration,
                max(args.warmup, 1.0),
                workdir,
                args.loadgen,
                good_reply,
            )
        )
        row["fraction_of_direct"] = round(row["rps"] / whole["instances_per_s"], 4)
        if name == "ours":
            roles = row["cores_by_role"]
            row["worker_cores_available"] = round(whole["cores"] - roles.get("master", 0.0) - row["loadgen_cores"], 2)
            row["limit_on_available_cores"] = round(limit_on(row["worker_cores_available"], one, whole), 1)
            row["fraction_of_available_limit"] = round(row["rps"] / row["limit_on_available_cores"], 4)
        result["served"].append(row)
        log(
            f"dense {name} {kind} c=64: {row['rps']:.0f} instances/s = {row['fraction_of_direct']:.3f} of direct"
            + (
                f", {row['fraction_of_available_limit']:.3f} of the limit on the {row['worker_cores_available']} "
                f"cores left to the worker"
                if name == "ours"
                else ""
            )
        )
    mosec = next((row["rps"] for row in result["served"] if row["server"] == "mosec"), None)
    for row in result["served"]:
        if row["server"] == "ours" and mosec:
            row["ratio_mosec"] = round(row["rps"] / mosec, 3)
    return result


ORIG_COLUMNS = [
    "point",
    "ours req/s",
    "original req/s",
    "ours / original",
    "ours p50 ms",
    "original p50 ms",
    "ours CPU us/req front ends / worker",
    "original CPU us/req master / worker",
]


def point_targets(server: Server, servable: str, body: bytes, request: bytes, good: bytes) -> tuple:
    """(server, target per protocol, payload per protocol, good gRPC reply) of one servable on one server."""
    method = "add:add_common" if servable == "add" else f"{DENSE}:predict"
    return (
        server,
        {"rest": f"http://{server.rest}/model/{method}", "grpc": server.grpc},
        {"rest": body, "grpc": request},
        good,
    )


def ours_name(frontend_processes: int, grpc_server: str = "") -> str:
    return ("ours" if frontend_processes == 1 else f"ours_fp{frontend_processes}") + (
        f"_{grpc_server}" if grpc_server else ""
    )


def variant_label(name: str) -> str:
    """What sets a variant of ours apart, for the tables: its front-end processes and its gRPC server."""
    parts = name.split("_")[1:]
    return "".join(f" ({part[2:]} front ends)" if part.startswith("fp") else f" ({part})" for part in parts)


def measure_versus_original(points: list[tuple], servers: dict, args, workdir: str) -> dict:
    """Ours (one server per front-end process count) against the original MindSpore Serving on each point
    (protocol, servable, clients), in `args.rounds` rounds that rotate which server goes first; each server's
    median over the rounds. `servers`: name -> {servable: (server, target per protocol, body per protocol, good
    gRPC reply)}."""
    names = list(servers)
    rounds: dict[tuple, dict[str, list[dict]]] = {}
    for index in range(args.rounds):
        for number, (protocol, servable, concurrency) in enumerate(points):
            shift = (index + number) % len(names)
            for name in names[shift:] + names[:shift]:
                server, targets, bodies, good = servers[name][servable]
                row = measure(
                    protocol,
                    server,
                    targets[protocol],
                    bodies[protocol],
                    concurrency,
                    args.duration,
                    args.warmup,
                    workdir,
                    args.loadgen,
                    good if protocol == "grpc" else b"",
                )
                rounds.setdefault((protocol, servable, concurrency), {}).setdefault(name, []).append(row)
                log(
                    f"round {index + 1} {name:8s} {protocol:4s} {servable:11s} c={concurrency:<3d} "
                    f"{row['rps']:9.1f} req/s  p50 {row['p50_ms']:.2f} ms  bad {row['bad']}  "
                    f"other {row['other_cores']} cores"
                )
    result = {"rounds": args.rounds, "duration_s": args.duration, "servers": names, "points": []}
    for (protocol, servable, concurrency), by_server in rounds.items():
        point = {"protocol": protocol, "servable": servable, "concurrency": concurrency}
        for name, rows in by_server.items():
            rows = sorted(rows, key=lambda row: row["rps"])
            point[name] = {
                "rps": statistics.median(row["rps"] for row in rows),
                "p50_ms": statistics.median(row["p50_ms"] for row in rows),
                "bad": sum(row["bad"] for row in rows),
                "cpu_us_per_req_by_role": rows[len(rows) // 2]["cpu_us_per_req_by_role"],
                "rounds": rows,
            }
        for name in names:
            if name != "original":
                point[name]["ratio"] = (
                    round(point[name]["rps"] / point["original"]["rps"], 3) if point["original"]["rps"] else None
                )
        result["points"].append(point)
    return result


def original_table(versus: dict) -> str:
    lines = ["| " + " | ".join(ORIG_COLUMNS) + " |", "|" + "|".join("---" for _ in ORIG_COLUMNS) + "|"]

    def cpu(side):
        roles = side["cpu_us_per_req_by_role"]
        front = roles.get("master", 0.0) + roles.get("frontend", 0.0)
        return f"{fmt(front, '{:.0f}')} / {fmt(roles.get('worker'), '{:.0f}')}"

    for point in versus["points"]:
        orig = point["original"]
        for name in versus.get("servers", ["ours", "original"]):
            if name == "original":
                continue
            ours = point[name]
            front_ends = variant_label(name)
            lines.append(
                f"| {point['protocol'].upper() if point['protocol'] == 'rest' else 'gRPC'} "
                f"`{point['servable']}` c={point['concurrency']}{front_ends} | {ours['rps']:,.0f} | "
                f"{orig['rps']:,.0f} | {fmt(ours['ratio'], '{:.2f}')} | {ours['p50_ms']:.2f} | "
                f"{orig['p50_ms']:.2f} | {cpu(ours)} | {cpu(orig)} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_exit)
    started = time.time()
    workdir = loadgen.scratch_dir()
    servers: list[Server] = []
    tools = {
        "http": "wrk" if args.loadgen != "python" and loadgen.have("wrk") else "python-asyncio-http",
        "grpc": "h2load" if args.loadgen != "python" and loadgen.have("h2load") else "python-grpc-aio",
    }
    report = {
        "meta": {
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "concurrency": args.concurrency,
            "quick": args.quick,
            "load_generators": tools,
            "versions": versions(),
            "peers": {
                "mosec": "bench/peers/mosec_add.py: 1 worker, max_batch_size 8, max_wait_time 5 ms, default JSON codec",
                "fastapi": "bench/peers/fastapi_add.py: async def route, body: dict, numpy add, "
                "uvicorn uvloop+httptools",
            },
        },
        "results": [],
        "batching": {},
    }
    rows = report["results"]
    try:
        if not args.skip_batching:
            ensure_dense_model()
        log("starting servers")
        ours = OurServer("ours", "add", grpc_server=args.grpc_servers[0])
        servers.append(ours)
        peers: list[HttpPeer] = []
        if "mosec" in args.peers:
            peers.append(
                HttpPeer(
                    "mosec",
                    "mosec_add.py",
                    "/inference",
                    [
                        "--address",
                        "127.0.0.1",
                        "--log-level",
                        "warning",
                        "--timeout",
                        "10000",
                        "--path",
                        os.path.join("{workdir}", "ipc"),
                    ],
                )
            )  # its sockets go with the workdir
        if "fastapi" in args.peers:
            peers.append(HttpPeer("fastapi", "fastapi_add.py", "/model/add:add_common"))
        servers.extend(peers)
        dense = dense_peer = original = None
        if not args.skip_batching:
            dense = OurServer("dense", DENSE, BENCH_SERVABLES, grpc_server=args.grpc_servers[0])
            servers.append(dense)
            if "mosec" in args.peers:
                dense_peer = HttpPeer(
                    "mosec_dense",
                    "mosec_dense.py",
                    "/inference",
                    [
                        "--address",
                        "127.0.0.1",
                        "--log-level",
                        "warning",
                        "--timeout",
                        "10000",
                        "--path",
                        os.path.join("{workdir}", "ipc"),
                    ],
                )
                servers.append(dense_peer)
        variants = {}  # name -> (add server, dense server) of the other variants measured against the original
        if "original" in args.peers:
            for count in args.frontend_processes:
                for index, kind in enumerate(args.grpc_servers):
                    if count == 1 and index == 0:
                        continue  # `ours` and `dense` themselves
                    name = ours_name(count, kind if index else "")  # the first server is the unnamed default
                    variants[name] = (
                        OurServer(name, "add", frontend_processes=count, grpc_server=kind),
                        None
                        if args.skip_batching
                        else OurServer(f"dense{name[len('ours') :]}", DENSE, BENCH_SERVABLES, count, kind),
                    )
                    servers.extend(server for server in variants[name] if server is not None)
            python = orig_python()
            if python is None:
                log(
                    "the original MindSpore Serving is not built: run bench/peers/orig_ms_setup.py to compare with "
                    "it (skipped)"
                )
            else:
                original = OrigServer(python)
                servers.append(original)

        ours_url = f"http://{ours.rest}/model/add:add_common"
        add_request = add_grpc_request()
        ours.wait_ready(lambda: check_add_reply(http_post(ours_url, ADD_BODY)))
        good_add_reply = check_grpc_add(ours.grpc, add_request)
        for peer in peers:
            peer.wait_ready(lambda peer=peer: check_add_reply(http_post(peer.url, ADD_BODY)))
        if dense is not None:
            dense_body, dense_request = dense_requests()
            dense.wait_ready(lambda: http_post(f"http://{dense.rest}/model/{DENSE}:predict", dense_body))
            good_dense_reply = check_grpc_dense(dense.grpc, dense_request)
            if dense_peer is not None:
                dense_peer.wait_ready(lambda: check_dense_reply(http_post(dense_peer.url, dense_body)))
        if original is not None:
            original.wait_ready(
                lambda: check_add_reply(http_post(f"http://{original.rest}/model/add:add_common", ADD_BODY))
            )
            original_add_reply = check_grpc_add(original.grpc, add_request)
            if dense is not None:
                check_dense_reply(http_post(f"http://{original.rest}/model/{DENSE}:predict", dense_body))
                original_dense_reply = check_grpc_dense(original.grpc, dense_request)
        log(f"servers ready in {time.time() - started:.1f} s; load generators: {tools}")

        for concurrency in args.concurrency:
            targets = [
                ("ours", "rest", ours, ours_url, ADD_BODY, b""),
                ("ours", "grpc", ours, ours.grpc, add_request, good_add_reply),
            ]
            targets += [(peer.name, "rest", peer, peer.url, ADD_BODY, b"") for peer in peers]
            for name, kind, server, target, body, good in targets:
                row = {"server": name, "protocol": kind}
                row.update(
                    measure(
                        kind, server, target, body, concurrency, args.duration, args.warmup, workdir, args.loadgen, good
                    )
                )
                rows.append(row)
                log(
                    f"{name:8s} {kind:4s} c={concurrency:<3d} {row['rps']:9.1f} req/s  p50 {row['p50_ms']:.2f} ms  "
                    f"p99 {row['p99_ms']:.2f} ms  bad {row['bad']}  srv {row['server_cpu_us_per_req']} us/req  "
                    f"other {row['other_cores']} cores"
                )
        add_ratios(rows)

        log("add: the bare GraphCell loop")
        bare = run_direct(max(2.0, args.duration), 0.5 if args.quick else 1.0, "add")
        report["add_bare_loop"] = bare
        log(f"bare add loop: {bare['instances_per_s']:.0f} calls/s, p50 {bare['ms_per_batch_p50']:.3f} ms per call")
        for row in rows:
            if row["server"] == "ours":
                row["ratio_bare"] = round(row["rps"] / bare["instances_per_s"], 3)
                row["p50_over_bare_ms"] = round(row["p50_ms"] - bare["ms_per_batch_p50"], 3)

        if original is not None:
            targets = {"original": {"add": point_targets(original, "add", ADD_BODY, add_request, original_add_reply)}}
            if dense is not None:
                targets["original"][DENSE] = point_targets(
                    original, DENSE, dense_body, dense_request, original_dense_reply
                )
            ours_variants = {"ours": (ours, dense)} if 1 in args.frontend_processes else {}
            ours_variants.update(variants)
            for name, (add_server, dense_server) in ours_variants.items():
                if add_server is not ours:
                    add_server.wait_ready(
                        lambda s=add_server: check_add_reply(
                            http_post(f"http://{s.rest}/model/add:add_common", ADD_BODY)
                        )
                    )
                targets[name] = {"add": point_targets(add_server, "add", ADD_BODY, add_request, good_add_reply)}
                if dense_server is not None:
                    if dense_server is not dense:
                        dense_server.wait_ready(
                            lambda s=dense_server: check_dense_reply(
                                http_post(f"http://{s.rest}/model/{DENSE}:predict", dense_body)
                            )
                        )
                    targets[name][DENSE] = point_targets(
                        dense_server, DENSE, dense_body, dense_request, good_dense_reply
                    )
            targets["original"] = targets.pop("original")  # last in the first round's order
            points = [
                (protocol, servable, concurrency)
                for servable in targets["original"]
                for protocol in ("rest", "grpc")
                for concurrency in args.original_concurrency
            ]
            log(f"versus the original: {len(points)} points, {args.rounds} alternated rounds")
            report["original"] = measure_versus_original(points, targets, args, workdir)
        if dense is not None:
            report["batching"] = measure_dense(
                dense, dense_peer, (dense_body, dense_request, good_dense_reply), args, workdir
            )
        report["memory_mb"] = {server.name: server.resident_mb() for server in servers if isinstance(server, OurServer)}
    finally:
        for server in reversed(servers):
            try:
                server.stop(keep_dir=args.keep_logs)
            except Exception as err:
                log(f"stopping {server.name} failed: {err}")
        shutil.rmtree(workdir, ignore_errors=True)
        if args.keep_logs:
            for server in servers:
                log(f"{server.name} logs: {server.workdir}")

    write_report(report, started, args.out, indent=2)
    print()
    print(table(rows))
    if report["batching"]:
        print()
        print(batching_table(report["batching"]))
    if report.get("original"):
        print()
        print(original_table(report["original"]))
    if report.get("memory_mb"):
        print()
        print(memory_table(report["memory_mb"]))
    print()
    note_other_load(
        [row["other_cores"] for row in rows + report["batching"].get("served", [])], " (column 'other cores')"
    )
    log(f"wrote {args.out} (wall {report['meta']['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
