"""Profile our server's hot paths under load: CPU per request in the master and the worker, py-spy profiles of both,
and the cost of a bare master -> worker gRPC hop.

    .venv/bin/python bench/profile_ours.py [--servable add|dense_batch] [--seconds 6] [--concurrency 64]
                                           [--out bench/results/profile]

Starts `serving_server.py --servables add` (or bench/servables' dense_batch, batch 64) on free 127.0.0.1 ports
and, for REST then gRPC, drives it with wrk / h2load (bench/loadgen.py) while `py-spy record --gil --nonblocking`
samples the master and the worker (only the thread holding the GIL: Python CPU). Then measures WorkerService.Ping
(an empty unary RPC) from a grpc.aio client at the same concurrency: the CPU of one gRPC hop to the worker without
any work (Predict calls take the worker's framed socket instead: ipc/predict_socket.py).
Writes the raw py-spy files and a summary (bench/pyspy_summary.py) under --out. Needs py-spy
(requirements-bench.txt); without it only the CPU numbers are printed.
"""

import argparse
import asyncio
import glob
import os
import shutil
import subprocess
import sys
import time

import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import classic  # noqa: E402
import loadgen  # noqa: E402
import pyspy_summary  # noqa: E402

FOCUS = {
    "master": [
        "httptools_impl",
        "RestfulApp.handle",
        "restful_codec",
        "tensor_codec",
        "Dispatcher",
        "grpc/aio",
        "grpc_server.py",
        "asyncio/",
    ],
    "worker": [
        "grpc/_server.py",
        "WorkerServicer.Predict",
        "tensor_codec",
        "MethodRunner.run",
        "collect_batch",
        "Subgraph.run",
        "mindspore/",
        "Condition.wait",
        "Future.result",
    ],
}


def cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def drive(kind, server, concurrency, seconds, workdir, target):
    url, body, grpc_request, good_reply = target
    if kind == "rest":
        return loadgen.run_http(url, body, concurrency, seconds, workdir)
    return loadgen.run_grpc(server.grpc, grpc_request, good_reply, concurrency, seconds, workdir)


def start(servable: str):
    """The server and what to send it: (REST url, REST body, gRPC request, its good reply)."""
    if servable == "add":
        server = classic.OurServer("ours", "add")
        url = f"http://{server.rest}/model/add:add_common"
        server.wait_ready(lambda: classic.check_add_reply(classic.http_post(url, classic.ADD_BODY)))
        request = classic.add_grpc_request()
        return server, (url, classic.ADD_BODY, request, classic.check_grpc_add(server.grpc, request))
    classic.ensure_dense_model()
    server = classic.OurServer("ours", classic.DENSE, classic.BENCH_SERVABLES)
    url = f"http://{server.rest}/model/{classic.DENSE}:predict"
    body, request = classic.dense_requests()
    server.wait_ready(lambda: classic.check_dense_reply(classic.http_post(url, body)))
    return server, (url, body, request, classic.check_grpc_dense(server.grpc, request))


async def _ping(address: str, concurrency: int, seconds: float, worker: psutil.Process) -> dict:
    import grpc

    from mindspore_serving.proto import internal_pb2, internal_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = internal_pb2_grpc.WorkerServiceStub(channel)
        await stub.Ping(internal_pb2.Empty())
        calls = 0
        end = time.perf_counter() + seconds

        async def client():
            nonlocal calls
            while time.perf_counter() < end:
                await stub.Ping(internal_pb2.Empty())
                calls += 1

        w0, c0, t0 = cpu(worker), time.process_time(), time.perf_counter()
        await asyncio.gather(*[client() for _ in range(concurrency)])
        elapsed, c1, w1 = time.perf_counter() - t0, time.process_time(), cpu(worker)
    return {
        "calls_per_s": round(calls / elapsed),
        "aio_client_cpu_us_per_call": round((c1 - c0) / calls * 1e6),
        "sync_server_cpu_us_per_call": round((w1 - w0) / calls * 1e6),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servable", choices=["add", classic.DENSE], default="add")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(BENCH, "results", "profile"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    spy = pyspy_summary.py_spy()
    workdir = loadgen.scratch_dir()
    server, target = start(args.servable)
    lines = []
    try:
        server.refresh()
        master = server.processes[0]
        worker = next(p for p in server.processes[1:] if "start_worker" in " ".join(p.cmdline()))
        for kind in ("rest", "grpc"):
            drive(kind, server, args.concurrency, 1, workdir, target)  # warm up
            spies = []
            if spy:
                for role, proc in (("master", master), ("worker", worker)):
                    path = os.path.join(args.out, f"{kind}_{role}.txt")
                    spies.append(
                        (
                            role,
                            path,
                            subprocess.Popen(
                                [
                                    spy,
                                    "record",
                                    "-p",
                                    str(proc.pid),
                                    "-d",
                                    f"{max(1, int(args.seconds) - 1)}",
                                    "-r",
                                    "200",
                                    "--gil",
                                    "--nonblocking",
                                    "-f",
                                    "raw",
                                    "-o",
                                    path,
                                ],
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            ),
                        )
                    )
            m0, w0 = cpu(master), cpu(worker)
            result = drive(kind, server, args.concurrency, args.seconds, workdir, target)
            m1, w1 = cpu(master), cpu(worker)
            for _, _, proc in spies:
                proc.wait(30)
            requests = max(1, result.requests)
            lines.append(
                f"== {kind} c={args.concurrency}: {result.rps:.0f} req/s, p50 {result.p50_ms:.1f} ms; CPU per "
                f"request: master {(m1 - m0) / requests * 1e6:.0f} us, "
                f"worker {(w1 - w0) / requests * 1e6:.0f} us "
                f"(includes py-spy's own cost, small with --nonblocking)"
            )
            for role, path, _ in spies:
                if os.path.exists(path):
                    lines.append(f"-- {kind} {role} (GIL-holding samples)")
                    lines.append(pyspy_summary.summarise(pyspy_summary.load(path), 15, FOCUS[role]))
        address = (
            "unix:"
            + glob.glob(
                os.path.join(server.workdir, "unix_socket_files", "*", f"serving_worker_{args.servable}_*_{worker.pid}")
            )[0]
        )
        ping = asyncio.run(_ping(address, args.concurrency, min(args.seconds, 4.0), worker))
        lines.append(
            f"== bare master->worker hop (WorkerService.Ping, grpc.aio client -> sync server, "
            f"c={args.concurrency}): {ping}"
        )
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "summary.txt"), "w") as stream:
        stream.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
