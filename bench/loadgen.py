"""Closed-loop load generators for bench/classic.py: a fixed number of clients, each sending its next request
as soon as the previous reply arrived, for a fixed time, on 127.0.0.1 only.

HTTP: wrk (C, one thread) with a Lua script that POSTs a fixed JSON body and checks every reply
(status 200, an output named "y", no "error"). gRPC: h2load (nghttp2, C, one thread) POSTing a fixed,
pre-framed MSService.Predict message; every reply's size is checked against a known good reply.
Either falls back to a Python asyncio generator (raw HTTP/1.1 keep-alive sockets, or grpc.aio with the
generated stubs) when the tool is missing or `prefer="python"`.

Each run returns a Result: requests/s, p50/p90/p99/mean latency (ms), requests and bad replies.
"""

import asyncio
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field

GRPC_PATH = "/mindspore.serving.proto.MSService/Predict"


@dataclass
class Result:
    tool: str
    concurrency: int
    seconds: float
    requests: int
    bad: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * len(sorted_values))) - 1))
    return sorted_values[index]


def _from_latencies(
    tool: str, concurrency: int, seconds: float, latencies_s: list[float], bad: int, notes: list[str] | None = None
) -> Result:
    values = sorted(latencies_s)
    count = len(values)
    mean = sum(values) / count if count else float("nan")
    return Result(
        tool,
        concurrency,
        round(seconds, 3),
        count,
        bad,
        round(count / seconds, 1) if seconds else 0.0,
        round(_percentile(values, 50) * 1000, 3),
        round(_percentile(values, 90) * 1000, 3),
        round(_percentile(values, 99) * 1000, 3),
        round(mean * 1000, 3),
        round(values[-1] * 1000, 3) if values else float("nan"),
        notes or [],
    )


# ------------------------------------------------------------------------------------------------- HTTP

_WRK_SCRIPT = r"""
wrk.method = "POST"
wrk.body = [==[%(body)s]==]
wrk.headers["Content-Type"] = "application/json"

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  bad = 0
end

function response(status, headers, body)
  if status ~= 200 or not string.find(body, '"y"', 1, true) or string.find(body, "error", 1, true) then
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local b = 0
  for _, t in ipairs(threads) do
    b = b + (t:get("bad") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "bad": %%d, "connect": %%d, "read": %%d, "write": %%d, ' ..
    '"status": %%d, "timeout": %%d, "p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "mean_us": %%f, "max_us": %%d}\n',
    summary.requests, summary.duration, b, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
"""


def _split_url(url: str):
    match = re.match(r"http://([^:/]+):(\d+)(/.*)$", url)
    if not match:
        raise ValueError(f"expected http://host:port/path, got {url}")
    host, port, path = match.group(1), int(match.group(2)), match.group(3)
    if not host.startswith("127.") and host != "localhost":
        raise ValueError(f"the benchmark only sends traffic to 127.0.0.1, not {host}")
    return host, port, path


def run_wrk(url: str, body: bytes, concurrency: int, seconds: int, workdir: str) -> Result:
    _split_url(url)
    script = os.path.join(workdir, "post.lua")
    if b"]==]" in body:
        raise ValueError("body cannot be embedded in the Lua script")
    with open(script, "w") as stream:
        stream.write(_WRK_SCRIPT % {"body": body.decode()})
    seconds = max(1, int(round(seconds)))
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--timeout", "10s", "-s", script, url]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    line = next((text_line for text_line in proc.stdout.splitlines() if text_line.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    stats = json.loads(line[len("WRKJSON ") :])
    elapsed = stats["duration_us"] / 1e6
    errors = stats["connect"] + stats["read"] + stats["write"] + stats["timeout"]
    notes = [f"socket errors: {errors}"] if errors else []
    return Result(
        "wrk",
        concurrency,
        round(elapsed, 3),
        stats["requests"],
        stats["bad"] + errors,
        round(stats["requests"] / elapsed, 1),
        stats["p50_us"] / 1000,
        stats["p90_us"] / 1000,
        stats["p99_us"] / 1000,
        round(stats["mean_us"] / 1000, 3),
        stats["max_us"] / 1000,
        notes,
    )


def _http_request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _good_http_reply(status: int, body: bytes) -> bool:
    return status == 200 and b'"y"' in body and b"error" not in body


async def _http_client(host, port, request, deadline, latencies, counters):
    reader, writer = await asyncio.open_connection(host, port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            start = time.perf_counter()
            if start >= deadline:
                return
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            match = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
            if match is None:
                raise RuntimeError("the Python HTTP generator needs Content-Length replies")
            body = await reader.readexactly(int(match.group(1)))
            end = time.perf_counter()
            if end <= deadline:
                latencies.append(end - start)
                if not _good_http_reply(status, body):
                    counters["bad"] += 1
    finally:
        writer.close()


async def _run_http_python(url, body, concurrency, seconds):
    host, port, path = _split_url(url)
    request = _http_request_bytes(host, port, path, body)
    latencies: list[float] = []
    counters = {"bad": 0}
    start = time.perf_counter()
    deadline = start + seconds
    await asyncio.gather(
        *[_http_client(host, port, request, deadline, latencies, counters) for _ in range(concurrency)]
    )
    return _from_latencies("python-asyncio-http", concurrency, deadline - start, latencies, counters["bad"])


def run_http(url: str, body: bytes, concurrency: int, seconds: float, workdir: str, prefer: str = "auto") -> Result:
    if prefer != "python" and have("wrk"):
        return run_wrk(url, body, concurrency, seconds, workdir)
    if prefer == "native":
        raise RuntimeError("wrk is not installed (apt-get install -y wrk)")
    return asyncio.run(_run_http_python(url, body, concurrency, seconds))


# ------------------------------------------------------------------------------------------------- gRPC


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: flag 0 (not compressed), 4-byte big-endian length, payload."""
    return b"\0" + struct.pack(">I", len(message)) + message


def run_h2load(address: str, request: bytes, reply_size: int, concurrency: int, seconds: float, workdir: str) -> Result:
    host, port = address.rsplit(":", 1)
    if not host.startswith("127.") and host != "localhost":
        raise ValueError(f"the benchmark only sends traffic to 127.0.0.1, not {host}")
    data = os.path.join(workdir, "grpc_request.bin")
    with open(data, "wb") as stream:
        stream.write(grpc_frame(request))
    log = os.path.join(workdir, "h2load.log")
    if os.path.exists(log):
        os.remove(log)
    # one HTTP/2 connection per client with one stream each, like wrk's connections
    command = [
        "h2load",
        "-t1",
        f"-c{concurrency}",
        "-m1",
        "-D",
        f"{seconds:g}",
        "-d",
        data,
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        f"--log-file={log}",
        f"http://{host}:{port}{GRPC_PATH}",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    out = proc.stdout
    finished = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    counts = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        out,
    )
    traffic = re.search(r"\((\d+)\) data", out)
    if proc.returncode != 0 or not finished or not counts:
        raise RuntimeError(f"h2load failed ({proc.returncode}): {out[-2000:]} {proc.stderr[-2000:]}")
    elapsed = float(finished.group(1)) / (1000.0 if finished.group(2) == "ms" else 1.0)
    succeeded, failed, errored, timeouts = (int(counts.group(i)) for i in (4, 5, 6, 7))
    latencies = []
    with open(log) as stream:
        for line in stream:
            parts = line.split("\t")
            if len(parts) >= 3 and parts[1] == "200":
                latencies.append(int(parts[2]) / 1e6)
    notes = []
    bad = failed + errored + timeouts
    if traffic:  # every good reply has the same size: a shortfall means error replies or trailers-only errors
        expected_replies = int(traffic.group(1)) / (reply_size + 5)
        missing = abs(succeeded - expected_replies)
        if missing > concurrency + 1:
            bad += int(missing)
            notes.append(f"reply bytes match {expected_replies:.0f} good replies of {succeeded}")
    result = _from_latencies("h2load", concurrency, elapsed, latencies, bad, notes)
    result.requests = succeeded
    result.rps = round(succeeded / elapsed, 1) if elapsed else 0.0
    return result


async def _run_grpc_python(address, request_bytes, reply_ok, concurrency, seconds):
    import grpc

    from mindspore_serving.proto import ms_service_pb2, ms_service_pb2_grpc

    request = ms_service_pb2.PredictRequest.FromString(request_bytes)
    latencies: list[float] = []
    counters = {"bad": 0}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ms_service_pb2_grpc.MSServiceStub(channel)
        await stub.Predict(request)
        start = time.perf_counter()
        deadline = start + seconds

        async def client():
            while True:
                t0 = time.perf_counter()
                if t0 >= deadline:
                    return
                try:
                    reply = await stub.Predict(request)
                    good = reply_ok(reply)
                except grpc.aio.AioRpcError:
                    good = False
                t1 = time.perf_counter()
                if t1 <= deadline:
                    latencies.append(t1 - t0)
                    if not good:
                        counters["bad"] += 1

        await asyncio.gather(*[client() for _ in range(concurrency)])
    return _from_latencies("python-grpc-aio", concurrency, deadline - start, latencies, counters["bad"])


def run_grpc(
    address: str,
    request: bytes,
    good_reply: bytes,
    concurrency: int,
    seconds: float,
    workdir: str,
    prefer: str = "auto",
) -> Result:
    """Drives MSService.Predict with one serialized request; `good_reply` is a serialized correct reply."""
    if prefer != "python" and have("h2load"):
        return run_h2load(address, request, len(good_reply), concurrency, seconds, workdir)
    if prefer == "native":
        raise RuntimeError("h2load is not installed (apt-get install -y nghttp2-client)")

    def reply_ok(reply):
        return len(reply.error_msg) == 0 and len(reply.instances) > 0

    return asyncio.run(_run_grpc_python(address, request, reply_ok, concurrency, seconds))


def scratch_dir() -> str:
    return tempfile.mkdtemp(prefix="ms_bench_lg_")
