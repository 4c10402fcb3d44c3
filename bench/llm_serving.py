"""LLM serving benchmark: the bundled tiny LLaMA served over HTTP (OpenAI `/v1/completions`, SSE streams), driven by
a Poisson-arrival client, against the engine limit of its own graphs measured in the same run.

    .venv/bin/python bench/llm_serving.py              # 3-5 minutes (longer when the machine is busy)
    .venv/bin/python bench/llm_serving.py --quick      # about 70-85 s
    .venv/bin/python bench/llm_serving.py --requests 96 --rates 0.5x,4 --out /tmp/x.json
    .venv/bin/python bench/llm_serving.py --quick --rates "" --profile /tmp/llm_profile   # + py-spy profiles

What it does, all on 127.0.0.1, every process started (and killed at the end, even on error) by this script:
1. starts `serving_server.py` with the tiny LLM (config/llama_tiny.yaml with absolute paths, agents started by the
   worker on free ports, GLOG_v=1) and warms it up;
2. runs, each on its own fixed-seed workload of mixed prompt lengths (text windows of data/kjv_narrative.txt cut at
   token boundaries to 4-96 tokens) and output lengths (log-uniform 4-160 tokens; `ignore_eos`, `temperature` 0):
   - `c=1`: requests one after another with 64 output tokens each: the per-token overhead at batch 1;
   - `saturation`: every request sent at once (the engine runs max_num_seqs, the rest queue); repeated
     (--saturation-runs), each time with other prompts (a repeated prompt would hit the prefix cache), each run
     bracketed by engine-limit probes and followed by the same requests through the engine in-process;
   - `poisson`: open-loop Poisson arrivals at --rates (`0.5x` = half the saturated request rate, or req/s), at most
     rate x --poisson-seconds requests each;
   before each run it waits (at most --quiet-wait s) for the other processes on the machine to calm down;
3. the engine, in one subprocess started once (its own MindSpore process, bound like the agent, the same graphs
   and num_blocks), idle while the server is measured:
   - the engine limit, `bench/llm_engine.py`'s `engine_limit(runner, steps)` (best of 3 rounds per bucket) after
     the c=1 run and, in a full run, again after the Poisson runs: the best step time per bucket over the whole
     benchmark, the machine's quietest moment;
   - probes: the mean step time of `steps` decode steps back to back per bucket, right before and right after
     the c=1 run and each saturating run: the limit at the moment of that run (on a shared machine the same
     graph's step time moves by a third between minutes, so a run is compared with its own moment);
   - the saturating run's requests through the engine in-process (`llm_engine.run_engine`, no serving layers)
     right after each saturating run, probed after it as well;
4. per run: request throughput, output tokens/s, TTFT, TPOT (per request (e2e - ttft) / (n - 1)), ITL (every gap
   between two SSE token events), e2e latency (mean, p50, p90, p99), the mean decode batch occupancy (client side:
   time-average of the requests between their first and last token; the engine logs no step statistics), the
   engine's own TTFT/ITL per request (the master's INFO line of each request), and the CPU time of the master, the
   worker, the agent and this client per 1000 output tokens, also per thread (Python thread names from py-spy dump);
5. the saturated output tokens/s as a fraction of the engine limit at the same mean occupancy (occupancy / step time
   of the decode bucket it falls into, as llm_engine.limit_at): per saturating run against its probes (the
   median over the runs is the figure the target applies to), and the best run against the best round; the same
   for the in-process engine, and served over in-process run by run; at batch 1 the engine's batch-1 step time
   over the served TPOT;
6. prints a table and writes JSON (default bench/results/llm_serving.json; --quick: llm_serving_quick.json);
   with --profile DIR, one more saturating run and c=1 run under py-spy: the wall-time states of the worker's
   engine thread and of the agent (py-spy record --idle) and the master's on-CPU profile, in DIR/summary.txt.

The machine's cores are shared by the client, the master, the worker and the agent (and whatever else runs): the
JSON records the CPU used by other processes during each run ("other_cores", "top_other_processes").
"""
import argparse
import asyncio
import bisect
import collections
import contextlib
import datetime
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, BENCH)

CORPUS = os.path.join(ROOT, "data", "kjv_narrative.txt")
CONFIG = os.path.join(ROOT, "config", "llama_tiny.yaml")
MODEL = "llama_tiny"
DEFAULT_OUT = os.path.join(BENCH, "results", "llm_serving.json")
QUICK_OUT = os.path.join(BENCH, "results", "llm_serving_quick.json")
PROMPT_TOKENS = (4, 96)
OUTPUT_TOKENS = (4, 160)
C1_OUTPUT_TOKENS = 64
CHILD_MARK = "ENGINE_CHILD_JSON "


def log(text: str):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class _Exit(Exception):
    pass


_CHILDREN: List[subprocess.Popen] = []  # the engine subprocess


def _kill_children():
    for child in list(_CHILDREN):
        if child.poll() is None:
            child.kill()


def _raise_exit(signum, _frame):
    _kill_children()
    raise _Exit(f"signal {signum}")


# ------------------------------------------------------------------------------------------- engine limit

def engine_child(config_path: str) -> None:
    """In a subprocess bound like the config's rank-0 agent: loads the served graphs (same num_blocks) once, then
    answers one JSON line on stdout per JSON line on stdin (EOF ends it):
      {"op": "limit", "steps": N}     llm_engine.engine_limit (best of 3 rounds per bucket), CPU per step, and the
                                      same with every core (for reference);
      {"op": "probe", "steps": N}     one timed block of N back-to-back decode steps per bucket: the mean step time
                                      right now, to bracket a served run with;
      {"op": "engine", "workload": P} llm_engine.run_engine on a workload file ([[prompt ids, new tokens], ...])."""
    from llm_engine import bind_like_agent, engine_limit, limit_seqs, run_engine  # bench/llm_engine.py
    from mindspore_serving.common.cpu_affinity import bind_threads
    from mindspore_serving.spec.llm_config import load_serving_config
    config = load_serving_config(config_path)
    all_cpus = sorted(os.sched_getaffinity(0))
    cpus = bind_like_agent(config)  # the agent's cores (agents.cpu_affinity): the same conditions as served
    import mindspore as ms
    from mindspore_serving.agent.graph_runner import GraphRunner
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    runner = GraphRunner(config.model.graphs[0], num_blocks=config.engine.num_blocks)
    batches = list(runner.decode_batches)

    def limit(steps):
        result = engine_limit(runner, steps)
        for batch in batches:  # CPU time per step (this process, all its threads): less hit by noise
            rows = limit_seqs(batch)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                runner.run(rows)
            result[batch]["cpu_ms"] = (time.process_time() - cpu0) / steps * 1000
            result[batch]["wall_ms_of_cpu_rounds"] = (time.perf_counter() - wall0) / steps * 1000
        out = {"decode_batches": batches, "num_blocks": config.engine.num_blocks, "cpus": cpus,
               "graphs": config.model.graphs[0], "steps": steps, "limit": {str(k): v for k, v in result.items()}}
        if cpus is not None:  # for reference: the same graphs with every core of the machine to themselves
            bind_threads(all_cpus)
            out["limit_unbound"] = {str(k): v for k, v in engine_limit(runner, steps).items()}
            bind_threads(cpus)
        return out

    def probe(steps):
        step_ms = {}
        for batch in batches:
            rows = limit_seqs(batch)
            runner.run(rows)
            started = time.perf_counter()
            for _ in range(steps):
                runner.run(rows)
            step_ms[str(batch)] = (time.perf_counter() - started) / steps * 1000
        return {"t": time.time(), "step_ms": step_ms}

    def engine(workload_path):
        with open(workload_path, encoding="utf-8") as stream:
            requests = [(ids, n) for ids, n in json.load(stream)]
        me = psutil.Process()
        threads0 = {t.id: t.user_time + t.system_time for t in me.threads()}
        cpu0, calls0, mixed0 = time.process_time(), runner.calls, runner.mixed_calls
        run = run_engine(runner, config.engine, requests)  # in one thread the engine steps in turn (raw engine)
        run["cpu_ms_per_1k_tokens"] = (time.process_time() - cpu0) / max(1, run["output_tokens"]) * 1e6
        per_thread: Dict[str, float] = {}
        for thread in me.threads():  # as Cpu.thread_use names them for the agent
            with open(f"/proc/self/task/{thread.id}/comm") as stream:
                name = re.sub(r"_\d+$", "_*", stream.read().strip())
            used = thread.user_time + thread.system_time - threads0.get(thread.id, 0.0)
            per_thread[name] = per_thread.get(name, 0.0) + used / max(1, run["output_tokens"]) * 1e6
        run["thread_cpu_ms_per_1k_tokens"] = {k: round(v, 1) for k, v in per_thread.items() if v >= 0.5}
        run.update({"requests": len(requests), "graph_calls": runner.calls - calls0,
                    "mixed_calls": runner.mixed_calls - mixed0})
        return run

    print(CHILD_MARK + json.dumps({"ready": True, "cpus": cpus}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "limit":
            reply = limit(command["steps"])
        elif command["op"] == "probe":
            reply = probe(command["steps"])
        else:
            reply = engine(command["workload"])
        print(CHILD_MARK + json.dumps(reply), flush=True)


class EngineProcess:
    """The parent's handle on `engine_child`: started once, idle (no CPU) while the server is measured."""

    def __init__(self, config_path: str):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--engine-child", config_path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, GLOG_v="2"))
        _CHILDREN.append(self.proc)
        self.cpus = self._reply()["cpus"]

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(CHILD_MARK):
                return json.loads(line[len(CHILD_MARK):])
        raise RuntimeError(f"the engine subprocess ended ({self.proc.wait()}); its stderr is above")

    def ask(self, **command) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self):
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _CHILDREN.remove(self.proc)


class EngineMeasures:
    """What the benchmark asks of the engine subprocess, recorded in the report: the engine limit (best rounds),
    probes that bracket a served run (the limit at that moment), and in-process runs of the saturating requests."""

    def __init__(self, process: EngineProcess, report: dict, steps: int):
        self.process, self.report, self.steps = process, report, steps

    def limit(self):
        log("engine limit (engine subprocess; the server is idle)")
        measured = self.process.ask(op="limit", steps=self.steps)
        self.report["engine_limit"]["measurements"].append(measured)
        log("  " + " ".join(f"b{b}={row['step_ms']:.2f}ms" for b, row in measured["limit"].items()))

    def probe(self) -> dict:
        return self.process.ask(op="probe", steps=self.steps)

    def run(self, workload_path: str, probe_before: dict) -> dict:
        """A saturating run's requests (a workload file) through the engine in-process, bracketed by
        `probe_before` (taken just before) and a probe right after."""
        run = self.process.ask(op="engine", workload=workload_path)
        run["probes"] = [probe_before, self.probe()]
        log(f"  in-process engine: {run['tokens_per_s']:.0f} tok/s at decode batch {run['mean_decode_batch']:.2f}")
        return run


def best_limit(measurements: List[dict], key: str = "limit") -> dict:
    """The best step time (and, separately, the least CPU per step) per bucket over several measurements (the machine
    is shared: noise only adds time)."""
    best = {}
    for batch in measurements[0][key]:
        rows = [m[key][batch] for m in measurements]
        best[batch] = dict(min(rows, key=lambda row: row["step_ms"]))
        if "cpu_ms" in rows[0]:
            best[batch]["cpu_ms"] = min(row["cpu_ms"] for row in rows)
        if all("median_step_ms" in row for row in rows):
            best[batch]["median_step_ms"] = float(np.median([row["median_step_ms"] for row in rows]))
    return best


def bucket_of(decode_batches: List[int], occupancy: float) -> int:
    """The decode bucket a mean decode batch of `occupancy` falls into, as llm_engine.limit_at picks it."""
    return decode_batches[min(bisect.bisect_left(decode_batches, int(np.ceil(occupancy))), len(decode_batches) - 1)]


def limit_at(limit: dict, decode_batches: List[int], occupancy: float) -> Tuple[int, float]:
    """(bucket, engine-limit tokens/s at a mean decode batch of `occupancy`), as llm_engine.limit_at does."""
    bucket = bucket_of(decode_batches, occupancy)
    return bucket, occupancy / (limit[str(bucket)]["step_ms"] / 1000)


# ------------------------------------------------------------------------------------------------ workload

@dataclass
class Item:
    prompt: str
    prompt_tokens: int
    max_tokens: int


class PromptSource:
    """Text prompts of a chosen token count: windows of the corpus cut at token boundaries."""

    def __init__(self, tokenizer_path: str):
        from mindspore_serving.models.llama.tokenizer import TextTokenizer
        self.tokenizer = TextTokenizer.from_file(tokenizer_path)
        with open(CORPUS, encoding="utf-8") as stream:
            self.text = stream.read()
        self._cache: Dict[int, Tuple[List[Tuple[int, int]], int]] = {}

    def _window(self, start: int):
        if start not in self._cache:
            piece = self.text[start:start + 4000]
            self._cache[start] = (self.tokenizer.tokenizer.encode(piece, add_special_tokens=False).offsets, start)
        return self._cache[start]

    def prompt(self, rng: np.random.Generator, tokens: int) -> Tuple[str, int]:
        start = int(rng.integers(0, len(self.text) - 5000))
        start = self.text.find("\n", start) + 1  # begin at a verse
        offsets, base = self._window(start)
        for count in (tokens, tokens - 1, tokens + 1, tokens - 2, tokens + 2):
            count = max(1, count)
            text = self.text[base + offsets[0][0]:base + offsets[count - 1][1]].strip()
            n = len(self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids)
            if n == tokens:
                break
        return text, n


def workload(source: PromptSource, count: int, seed: int, max_model_len: int,
             output_tokens: Optional[int] = None) -> List[Item]:
    """Prompts of 4-96 tokens; output lengths log-uniform in [4, 160] (a long tail, as chat traffic), or fixed."""
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(count):
        prompt_len = int(rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1))
        if output_tokens is None:
            new = int(np.exp(rng.uniform(np.log(OUTPUT_TOKENS[0]), np.log(OUTPUT_TOKENS[1]))))
        else:
            new = output_tokens
        text, n = source.prompt(rng, prompt_len)
        items.append(Item(text, n, int(min(new, max_model_len - n - 2))))
    return items


# --------------------------------------------------------------------------------------------------- client

@dataclass
class Record:
    sent: float = 0.0
    status: int = 0
    request_id: str = ""
    events: List[float] = field(default_factory=list)   # perf_counter of every SSE token event
    completion_tokens: int = 0
    prompt_tokens: int = 0
    ended: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.status == 200 and bool(self.events)

    @property
    def ttft(self) -> float:
        return self.events[0] - self.sent

    @property
    def e2e(self) -> float:
        return self.ended - self.sent

    @property
    def tokens(self) -> int:
        return self.completion_tokens or len(self.events)


async def one_request(session, url: str, item: Item, record: Record) -> None:
    import orjson
    body = {"model": MODEL, "prompt": item.prompt, "max_tokens": item.max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0, "stream_options": {"include_usage": True}}
    record.sent = time.perf_counter()
    try:
        async with session.post(url, data=orjson.dumps(body), headers={"content-type": "application/json"}) as resp:
            record.status = resp.status
            if resp.status != 200:
                record.error = f"HTTP {resp.status}: {(await resp.read())[:300]!r}"
                record.ended = time.perf_counter()
                return
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                now = time.perf_counter()
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                event = orjson.loads(data)
                if "error" in event:
                    record.error = str(event["error"])[:300]
                    break
                choices = event.get("choices")
                if choices:
                    if choices[0].get("finish_reason") is None:
                        record.events.append(now)
                    if not record.request_id:
                        record.request_id = event.get("id", "")
                if event.get("usage"):
                    record.completion_tokens = event["usage"]["completion_tokens"]
                    record.prompt_tokens = event["usage"]["prompt_tokens"]
            record.ended = time.perf_counter()
            if record.completion_tokens and record.completion_tokens != item.max_tokens and not record.error:
                record.error = f"got {record.completion_tokens} tokens, asked for {item.max_tokens}"
    except Exception as err:  # counted as a failed request
        record.error = f"{type(err).__name__}: {err}"
        record.ended = time.perf_counter()


def new_session(connections: int):
    import aiohttp
    connector = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600))


async def run_closed(session, url: str, items: List[Item], concurrency: int) -> Tuple[List[Record], float, float]:
    """`concurrency` clients, each sending its next request when its previous one ended."""
    records = [Record() for _ in items]
    queue = list(range(len(items)))[::-1]

    async def client():
        while queue:
            i = queue.pop()
            await one_request(session, url, items[i], records[i])

    started = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(min(concurrency, len(items)))])
    return records, started, time.perf_counter()


async def run_poisson(session, url: str, items: List[Item], rate: float, seed: int) -> Tuple[List[Record], float, float]:
    """Open loop: request i is sent at the i-th arrival of a Poisson process of `rate` req/s (the first at 0)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, len(items))
    gaps[0] = 0.0
    at = np.cumsum(gaps)
    records = [Record() for _ in items]
    started = time.perf_counter()
    tasks = []
    for i, item in enumerate(items):
        delay = started + at[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one_request(session, url, item, records[i])))
    await asyncio.gather(*tasks)
    return records, started, time.perf_counter()


# ---------------------------------------------------------------------------------------------- processes

class Cpu:
    """CPU seconds of the server's processes by role, this client, and the whole machine."""

    def __init__(self, server_root: psutil.Process):
        self.roles: Dict[str, List[psutil.Process]] = {"master": [server_root], "worker": [], "agent": []}
        for child in server_root.children(recursive=True):
            try:
                cmdline = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if "start_worker" in cmdline:
                self.roles["worker"].append(child)
            elif "resource_tracker" in cmdline:
                continue
            else:
                self.roles["agent"].append(child)
        self.client = psutil.Process()
        self.names: Dict[int, str] = {}

    @staticmethod
    def _cpu(procs) -> float:
        total = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def learn_thread_names(self) -> None:
        """Python thread names (by OS thread id) of the server's processes, from `py-spy dump` (the kernel knows
        them all as "python")."""
        spy = py_spy()
        if not spy:
            return
        for role in ("master", "worker", "agent"):
            pid = self.pid(role)
            if pid is None:
                continue
            try:
                out = subprocess.run([spy, "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True,
                                     text=True, timeout=20)
                for thread in json.loads(out.stdout):
                    if thread.get("os_thread_id") and thread.get("thread_name"):
                        self.names[thread["os_thread_id"]] = "py:" + re.sub(r"_\d+$", "_*", thread["thread_name"])
            except (subprocess.SubprocessError, ValueError, OSError):
                continue

    def thread_cpu(self) -> Dict[Tuple[str, int], Tuple[str, float]]:
        """(role, thread id) -> (thread's name, CPU seconds): a Python thread's name when learn_thread_names found it
        ("py:..."), else the kernel's (MindSpore's runtime threads ActorThread_*/KernelThread_*, gRPC core's
        event_engine, "python" for unnamed Python threads)."""
        found = {}
        for role, procs in list(self.roles.items()) + [("client", [self.client])]:
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    for thread in proc.threads():
                        try:
                            with open(f"/proc/{proc.pid}/task/{thread.id}/comm") as stream:
                                name = stream.read().strip()
                        except OSError:
                            name = "?"
                        name = self.names.get(thread.id) or re.sub(r"_\d+$", "_*", name)
                        found[(role, thread.id)] = (name, thread.user_time + thread.system_time)
        return found

    @staticmethod
    def thread_use(before, after, tokens: int) -> Dict[str, Dict[str, float]]:
        """CPU ms per 1000 output tokens by role and thread kind (threads started during the run count from 0)."""
        use: Dict[str, Dict[str, float]] = {}
        for key, (name, total) in after.items():  # a thread started during the run counts from 0
            role = use.setdefault(key[0], {})
            role[name] = role.get(name, 0.0) + (total - before.get(key, (name, 0.0))[1]) / max(1, tokens) * 1e6
        return {role: {name: round(v, 1) for name, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 0.5}
                for role, kinds in use.items()}

    def snapshot(self) -> dict:
        machine = psutil.cpu_times()
        snap = {role: self._cpu(procs) for role, procs in self.roles.items()}
        snap["client"] = self._cpu([self.client])
        snap["machine"] = machine.user + machine.system + machine.nice + getattr(machine, "irq", 0) + \
            getattr(machine, "softirq", 0)
        snap["t"] = time.perf_counter()
        return snap

    def ours(self) -> set:
        pids = {self.client.pid}
        for procs in self.roles.values():
            pids.update(p.pid for p in procs)
        return pids

    @staticmethod
    def processes() -> Dict[int, Tuple[str, float]]:
        """pid -> (command, CPU seconds) of every process on the machine."""
        found = {}
        for proc in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
            info = proc.info
            times = info.get("cpu_times")
            if times is None:
                continue
            command = " ".join(info.get("cmdline") or []) or info.get("name") or "?"
            found[info["pid"]] = (command[:120], times.user + times.system)
        return found

    def top_others(self, before: Dict[int, Tuple[str, float]], seconds: float, count: int = 3) -> List[dict]:
        """The processes other than ours that used the most CPU since `before` (cores over `seconds`)."""
        ours = self.ours()
        used = []
        for pid, (command, total) in self.processes().items():
            if pid in ours or pid not in before:
                continue
            cores = (total - before[pid][1]) / seconds if seconds > 0 else 0.0
            if cores >= 0.05:
                used.append({"pid": pid, "cores": round(cores, 2), "command": command})
        return sorted(used, key=lambda u: -u["cores"])[:count]

    def wait_quiet(self, limit_s: float, threshold: float = 0.3) -> float:
        """Waits (at most `limit_s`) until processes other than ours use < `threshold` cores over 0.5 s; returns
        the last measured use."""
        deadline = time.perf_counter() + limit_s
        while True:
            a = self.snapshot()
            time.sleep(0.5)  # ok-sleep: sampling the machine's CPU use
            b = self.snapshot()
            ours = sum(b[k] - a[k] for k in ("master", "worker", "agent", "client"))
            other = max(0.0, (b["machine"] - a["machine"]) - ours) / (b["t"] - a["t"])
            if other < threshold or time.perf_counter() >= deadline:
                return other

    def pid(self, role: str) -> Optional[int]:
        return self.roles[role][0].pid if self.roles[role] else None


class LlmServer:
    """serving_server.py with the tiny LLM on free ports (agents started by the worker); stop() kills the tree."""

    def __init__(self, workdir: str, engine_overrides: dict, agents_overrides: Optional[dict] = None):
        from llm_setup import write_config, write_servable  # tests/llm_setup.py
        self.workdir = workdir
        self.config = write_config(workdir, start_port=0, agents=agents_overrides, **engine_overrides)
        self.servables = write_servable(workdir, self.config)
        self.proc = None
        self.rest = ""
        self.processes: List[psutil.Process] = []

    def start(self):
        from serving_process import start_server  # tests/serving_process.py
        self.proc, _, self.rest = start_server(self.workdir, servables=(MODEL,),
                                               extra_args=["--servable_directory", self.servables],
                                               env={"GLOG_v": "1"})
        self.refresh()

    def refresh(self):
        if self.proc is None:
            return
        self.proc.remember_children()
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.proc.proc.pid)
            self.processes = [root] + root.children(recursive=True)

    def output(self) -> str:
        return self.proc.output() if self.proc is not None else ""

    def worker_logs(self) -> str:
        """The workers' own logs (serving_logs/ in the server's directory), where their engines report."""
        texts = []
        for path in sorted(glob.glob(os.path.join(self.workdir, "serving_logs", "*.log"))):
            with open(path, "rb") as stream:
                texts.append(stream.read().decode(errors="replace"))
        return "\n".join(texts)

    def stop(self):
        if self.proc is None:
            return
        self.proc.close(grace=8)  # SIGTERM, then SIGKILL of whatever of the tree is left
        self.proc = None


_ENGINE_LINE = re.compile(r"LLM request (\w+) \(openai.*?completion_tokens=(\d+).*?"
                          r"\(engine: ttft=([\d.]+)ms itl=([\d.-]+)(?:ms)? e2e=([\d.]+)ms\)")


def engine_timings(server_output: str) -> Dict[str, Tuple[float, float, float]]:
    """request id -> (engine TTFT, engine ITL, engine e2e) in seconds, from the master's INFO lines."""
    found = {}
    for match in _ENGINE_LINE.finditer(server_output):
        itl = match.group(4)
        found[match.group(1)] = (float(match.group(3)) / 1000, float(itl) / 1000 if itl != "-" else float("nan"),
                                 float(match.group(5)) / 1000)
    return found


_TOTALS_LINE = re.compile(r"engine: .*?; totals (.*)$", re.M)


def engine_totals(server_output: str) -> List[Dict[str, float]]:
    """The running totals of every engine statistics line (engine.stats_interval) in the server's output."""
    return [{k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", m.group(1))}
            for m in _TOTALS_LINE.finditer(server_output)]


def engine_steps(before: List[Dict[str, float]], after: List[Dict[str, float]]) -> Optional[dict]:
    """What the engine's steps did during a run: the difference of the last totals after it and before it, with
    the mean decode batch per model step (the engine's own occupancy, as llm_engine.run_engine counts it)."""
    if len(after) <= len(before):
        return None
    start = before[-1] if before else {k: 0.0 for k in after[-1]}
    diff = {k: round(v - start.get(k, 0.0), 3) for k, v in after[-1].items()}
    diff["mean_decode_batch"] = round(diff["decode_rows"] / diff["decode_steps"], 3) if diff.get("decode_steps") else 0.0
    return diff


# ------------------------------------------------------------------------------------------------ metrics

def stats(values) -> dict:
    values = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ms = values * 1000
    return {"mean": round(float(ms.mean()), 2), "p50": round(float(np.percentile(ms, 50)), 2),
            "p90": round(float(np.percentile(ms, 90)), 2), "p99": round(float(np.percentile(ms, 99)), 2)}


def occupancy(records: List[Record], start: float, end: float) -> float:
    """Time-average over [start, end] of the requests between their first and last token (in the decode batch)."""
    if end <= start:
        return 0.0
    busy = 0.0
    for r in records:
        if r.ok and len(r.events) > 1:
            busy += max(0.0, min(r.events[-1], end) - max(r.events[0], start))
    return busy / (end - start)


def summarise(name: str, records: List[Record], started: float, ended: float, cpu0: dict, cpu1: dict,
              engine: Dict[str, Tuple[float, float, float]], extra: Optional[dict] = None) -> dict:
    good = [r for r in records if r.ok]
    duration = max(r.ended for r in records) - started if records else 0.0
    tokens = sum(r.tokens for r in good)
    tpot = [(r.e2e - r.ttft) / (r.tokens - 1) for r in good if r.tokens > 1]
    itl = [b - a for r in good for a, b in zip(r.events, r.events[1:])]
    row = {
        "run": name, "requests": len(records), "ok": len(good), "failed": len(records) - len(good),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "seconds": round(duration, 3), "req_per_s": round(len(good) / duration, 3) if duration else 0.0,
        "output_tokens": tokens, "output_tokens_per_s": round(tokens / duration, 1) if duration else 0.0,
        "prompt_tokens_mean": round(float(np.mean([r.prompt_tokens for r in good])), 1) if good else 0.0,
        "ttft_ms": stats(r.ttft for r in good), "tpot_ms": stats(tpot), "itl_ms": stats(itl),
        "e2e_ms": stats(r.e2e for r in good),
        "mean_occupancy": round(occupancy(good, started, started + duration), 3),
        "mean_in_flight": round(sum(r.ended - r.sent for r in records) / duration, 3) if duration else 0.0,
        "token_events_short": sum(1 for r in good if len(r.events) != r.tokens),
    }
    pairs = [(r, engine[r.request_id[5:]]) for r in good if r.request_id[5:] in engine]
    matched = [m for _, m in pairs]
    row["engine_log"] = {"matched": len(matched), "ttft_ms": stats(m[0] for m in matched),
                         "itl_ms": stats(m[1] for m in matched), "e2e_ms": stats(m[2] for m in matched),
                         # client TTFT - engine TTFT: from the client's send until the request is in the engine, plus
                         # the first token's way back (the engine counts from its own arrival)
                         "ttft_outside_engine_ms": stats(r.ttft - m[0] for r, m in pairs),
                         "e2e_outside_engine_ms": stats(r.e2e - m[2] for r, m in pairs)}
    if matched:  # engine-side decode time of the requests / the run's duration: occupancy seen by the engine
        decode_s = sum(m[2] - m[0] for m in matched)
        row["engine_log"]["occupancy"] = round(decode_s / duration, 3) if duration else 0.0
    wall = cpu1["t"] - cpu0["t"]
    used = {role: cpu1[role] - cpu0[role] for role in ("master", "worker", "agent", "client")}
    row["cpu_cores"] = {role: round(v / wall, 3) for role, v in used.items()}
    row["cpu_ms_per_1k_tokens"] = {role: round(v / max(1, tokens) * 1e6, 1) for role, v in used.items()}
    row["other_cores"] = round(max(0.0, (cpu1["machine"] - cpu0["machine"]) - sum(used.values())) / wall, 3)
    if extra:
        row.update(extra)
    return row


def saturated_window(records: List[Record], started: float) -> dict:
    """The part of a saturating run while requests still queued: from the start until the last request's first
    token. Output tokens/s and occupancy there (a full engine, no ramp-down)."""
    good = [r for r in records if r.ok]
    if not good:
        return {"seconds": 0.0, "token_events": 0, "output_tokens_per_s": 0.0, "mean_occupancy": 0.0}
    end = max(r.events[0] for r in good)
    tokens = sum(1 for r in good for t in r.events if t <= end)
    seconds = end - started
    return {"seconds": round(seconds, 3), "token_events": tokens,
            "output_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else 0.0,
            "mean_occupancy": round(occupancy(good, started, end), 3)}


# --------------------------------------------------------------------------------------------------- py-spy

def py_spy() -> str:
    found = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    return found if os.path.exists(found) else ""


ENGINE_STATES = (  # first match wins, on the function names of the engine thread's stack
    ("waiting for the agent's step (AgentRunner.run)", ("AgentRunner.run",)),
    ("scheduler (Scheduler.schedule)", ("Scheduler.schedule",)),
    ("sampler (Sampler.sample_requests)", ("Sampler.",)),
    ("scheduler update (Scheduler.update_from_output)", ("update_from_output",)),
    ("outputs + detokenizer (LLMEngine._to_output)", ("LLMEngine._to_output",)),
    ("delivery to the request streams (EngineLoop._deliver)", ("EngineLoop._deliver",)),
    ("idle, waiting for requests (EngineLoop._drain)", ("EngineLoop._drain",)),
    ("step statistics (EngineCore._record)", ("EngineCore._record",)),
)
AGENT_STATES = (
    ("graph execution (GraphCell / _CellGraphExecutor)", ("_CellGraphExecutor", "GraphCell.__call__", "Cell.__call__")),
    ("logits to numpy (Tensor.asnumpy)", ("asnumpy",)),
    ("input buffers (_Bucket.run)", ("_Bucket.run",)),
    ("step decoding / logits encoding (protocol)", ("decode_step", "encode_logits")),
    ("GraphRunner.run bookkeeping", ("GraphRunner.",)),
)


def _classify(names: List[str], states) -> str:
    for label, needles in states:
        if any(needle in name for name in names for needle in needles):
            return label
    return "other: " + (names[0] if names else "?")


def start_spies(cpu: Cpu, out_dir: str, seconds: int) -> List[Tuple[str, str, subprocess.Popen]]:
    """py-spy record of the master (on-CPU samples, not pausing it) and of the worker and the agent (every thread at
    every tick, idle included, pausing the process for each sample: exact about waiting threads, which
    `--nonblocking --idle` is not)."""
    spy = py_spy()
    spies = []
    if not spy:
        log("py-spy not found: no profile")
        return spies
    os.makedirs(out_dir, exist_ok=True)
    for role, extra in (("master", ["-r", "100", "--nonblocking"]), ("worker", ["-r", "50", "--idle"]),
                        ("agent", ["-r", "50", "--idle"])):
        pid = cpu.pid(role)
        if pid is None:
            continue
        path = os.path.join(out_dir, f"{role}.txt")
        spies.append((role, path, subprocess.Popen(
            [spy, "record", "-p", str(pid), "-d", str(seconds), "--threads", "-f", "raw", "-o", path] + extra,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    return spies


def wall_breakdown(role: str, stacks) -> str:
    """The engine thread's states (worker), or the share of time the agent runs a step at all (agent)."""
    def names(frames):
        return [frame.split(" (")[0] for frame in frames]

    per_thread = collections.Counter()
    for frames, count in stacks:
        per_thread[frames[0] if frames else "?"] += count
    ticks = max(per_thread.values()) if per_thread else 0
    if not ticks:
        return ""
    states = collections.Counter()
    if role == "worker":
        for frames, count in stacks:
            if frames and "-engine" in frames[0]:
                states[_classify(names(frames), ENGINE_STATES)] += count
        title = "worker's engine thread, wall time"
    else:
        for frames, count in stacks:
            if any("AgentServicer.Step" in f for f in frames):
                states[_classify(names(frames), AGENT_STATES)] += count
        states["idle: no step running (waiting for the worker's next step)"] = max(0, ticks - sum(states.values()))
        title = "agent, wall time"
    lines = [f"-- {title} ({ticks} ticks of py-spy record --idle)"]
    lines += [f"  {count / ticks:6.1%}  {label}" for label, count in states.most_common()]
    return "\n".join(lines)


FOCUS = {
    "master": ["completion_chunks", "MasterLlmBackend.stream", "grpc/aio", "uvicorn", "starlette", "anyio",
               "Generation.events", "Generation.close", "sse.py", "log.py"],
    "worker": ["EngineLoop._run", "LlmWorkerServicer.Generate", "grpc/_server.py", "AgentRunner.run",
               "Scheduler.schedule", "Sampler.", "update_from_output", "LLMEngine._to_output", "EngineLoop._deliver"],
    "agent": ["AgentServicer.Step", "_CellGraphExecutor", "_Bucket.run", "asnumpy", "encode_logits", "decode_step",
              "grpc/_server.py"],
}


def finish_spies(spies, out_dir: str) -> str:
    import pyspy_summary  # bench/pyspy_summary.py
    walls, lines = [], []
    for role, path, proc in spies:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not os.path.exists(path):
            continue
        stacks = pyspy_summary.load(path)
        if role == "master":
            lines.append("-- master: on-CPU samples (py-spy record --nonblocking), all threads")
            lines.append(pyspy_summary.summarise(stacks, 15, FOCUS[role]))
        else:
            walls.append(wall_breakdown(role, stacks))
            lines.append(f"-- {role}: every thread, idle included (py-spy record --idle)")
            lines.append(pyspy_summary.summarise(stacks, 12, FOCUS[role]))
    lines = walls + lines
    text = "\n".join(lines)
    with open(os.path.join(out_dir, "summary.txt"), "w") as stream:
        stream.write(text + "\n")
    return text


# ---------------------------------------------------------------------------------------------------- main

def parse_rates(text: str) -> List[Tuple[str, float]]:
    rates = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        rates.append(("x", float(part[:-1])) if part.endswith("x") else ("abs", float(part)))
    return rates


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and rates: about 70-85 s")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per saturation/Poisson run (default 96; --quick 32)")
    parser.add_argument("--rates", default=None,
                        help="Poisson rates, comma-separated: '0.5x' = a fraction of the saturated request rate, "
                             "a plain number = req/s (default 0.3x,0.6x,0.9x; --quick 0.6x)")
    parser.add_argument("--poisson-seconds", type=float, default=None,
                        help="a Poisson run sends at most rate x this many requests (at least 16), which bounds its "
                             "time when the machine is slow (default 40; --quick 12)")
    parser.add_argument("--saturation-runs", type=int, default=None,
                        help="saturating runs, each probed before and after and followed by an in-process engine "
                             "run; the median of their fractions counts (default 3; --quick 1)")
    parser.add_argument("--c1-requests", type=int, default=None, help="requests of the c=1 run (default 8; --quick 4)")
    parser.add_argument("--limit-steps", type=int, default=None,
                        help="timed decode steps per round and bucket for the engine limit and per bucket for a probe "
                             "(default 20; --quick 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", action="append", default=[], metavar="FIELD=VALUE",
                        help="override an engine field of the served config (a YAML value), e.g. "
                             "--engine async_scheduling=false; repeatable")
    parser.add_argument("--out", default=None, help=f"JSON path (default {os.path.relpath(DEFAULT_OUT, ROOT)}; "
                                                    f"--quick: {os.path.relpath(QUICK_OUT, ROOT)})")
    parser.add_argument("--profile", default="", metavar="DIR",
                        help="after the measured runs, one more saturating run under py-spy (master, worker, agent); "
                             "raw files and summary.txt go to DIR")
    parser.add_argument("--keep-logs", action="store_true", help="keep the server's working directory")
    parser.add_argument("--quiet-wait", type=float, default=None,
                        help="before each run, wait up to this many seconds for other processes to use < 0.3 cores "
                             "(default 8; --quick 3)")
    parser.add_argument("--cpu-affinity", choices=("config", "auto", "none"), default="config",
                        help="agents.cpu_affinity of the served config (and of the engine limit's process): as in "
                             "config/llama_tiny.yaml, auto, or none (unbound)")
    parser.add_argument("--engine-child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.requests = args.requests or (32 if args.quick else 96)
    args.rates = parse_rates(args.rates if args.rates is not None else ("0.6x" if args.quick else "0.3x,0.6x,0.9x"))
    args.poisson_seconds = args.poisson_seconds or (12.0 if args.quick else 40.0)
    args.saturation_runs = max(1, args.saturation_runs or (1 if args.quick else 3))
    args.c1_requests = args.c1_requests if args.c1_requests is not None else (4 if args.quick else 8)
    args.limit_steps = args.limit_steps or (10 if args.quick else 20)
    args.out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    args.quiet_wait = args.quiet_wait if args.quiet_wait is not None else (3.0 if args.quick else 8.0)
    return args


def fmt(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def table(report: dict) -> str:
    lines = []
    limit = report["engine_limit"]["best"]
    ms = report["engine_limit"]["measurements"]
    unbound = report["engine_limit"].get("best_unbound")
    lines.append(f"Engine limit (bench/llm_engine.py engine_limit: decode steps at full batch, graphs back to back; "
                 f"best of {len(ms)} measurement(s); on the agent's cores {ms[0].get('cpus') or 'all'}"
                 f"{'; unbound: every core' if unbound else ''})")
    lines.append(f"{'batch':>6} {'step ms':>8} {'tokens/s':>9}   {'each measurement, step ms':<26}"
                 f"{'unbound step ms' if unbound else ''}")
    for batch, row in sorted(limit.items(), key=lambda kv: int(kv[0])):
        each = " ".join(f"{m['limit'][batch]['step_ms']:.2f}" for m in ms)
        free = f"{unbound[batch]['step_ms']:.2f}" if unbound else ""
        lines.append(f"{batch:>6} {row['step_ms']:>8.2f} {row['tokens_per_s']:>9.0f}   {each:<26}{free}")
    lines.append("")
    head = (f"{'run':<19} {'ok':>4} {'req/s':>6} {'tok/s':>6} {'occ':>5} {'TTFT mean/p50/p90/p99':>24} "
            f"{'TPOT mean/p50/p90/p99':>23} {'ITL mean/p50/p90/p99':>23} {'E2E mean/p50/p90/p99':>24} "
            f"{'CPU m/w/a/c':>19} {'other':>5}")
    lines.append(head)
    for row in report["runs"]:
        def q(key):
            st = row[key]
            return "/".join(fmt(st[k], ".0f" if (st[k] or 0) >= 100 else ".1f") for k in ("mean", "p50", "p90", "p99"))
        c = row["cpu_cores"]
        lines.append(f"{row['run']:<19} {row['ok']:>4} {row['req_per_s']:>6.2f} {row['output_tokens_per_s']:>6.0f} "
                     f"{row['mean_occupancy']:>5.1f} {q('ttft_ms'):>24} {q('tpot_ms'):>23} {q('itl_ms'):>23} "
                     f"{q('e2e_ms'):>24} {c['master']:.2f}/{c['worker']:.2f}/{c['agent']:.2f}/{c['client']:.2f} "
                     f"{row['other_cores']:>5.2f}")
    lines.append("")
    lines.append(f"{'run':<19} {'engine TTFT mean/p50':>21} {'engine ITL mean':>16} {'client-engine TTFT mean/p90':>28} "
                 f"{'CPU ms/1k tok m/w/a/c':>25}")
    for row in report["runs"]:
        e = row["engine_log"]
        out = e["ttft_outside_engine_ms"]
        c = row["cpu_ms_per_1k_tokens"]
        lines.append(f"{row['run']:<19} {fmt(e['ttft_ms']['mean'], '.0f') + '/' + fmt(e['ttft_ms']['p50'], '.0f'):>21} "
                     f"{fmt(e['itl_ms']['mean'], '.1f'):>16} "
                     f"{fmt(out['mean'], '.1f') + '/' + fmt(out['p90'], '.1f'):>28} "
                     f"{c['master']:.0f}/{c['worker']:.0f}/{c['agent']:.0f}/{c['client']:.0f}".rjust(0))
    lines.append("times in ms; occ: mean decode batch occupancy (client side: time-average of the requests between "
                 "their first and last token);\nCPU: cores used by master/worker/agent/client during the run; other: "
                 "cores used by other processes on the machine;\nengine TTFT/ITL: the engine's own figures (master's "
                 "log); client-engine TTFT: getting into the engine and the first token back out")
    s = report["summary"]
    lines.append("")
    pair = s.get("paired") or {}
    if pair.get("runs"):
        lines.append("Saturation against the engine limit probed right before and right after each run (the same decode "
                     "steps back to back, mean of the two probes; the in-process engine runs right after the served run "
                     "and is probed after it too; batch: the engine's mean decode batch per model step, from its "
                     "statistics lines):")
        lines.append(f"  {'run':<15} {'tok/s':>6} {'batch':>6} {'probe ms':>13} {'limit':>6} {'fraction':>8}   "
                     f"{'in-process tok/s':>16} {'batch':>6} {'fraction':>8}   {'served/in-process':>17}")
        for row in pair["runs"]:
            eng = row.get("engine") or {}
            probes = "/".join(f"{x:.1f}" for x in row["probe_step_ms"])
            lines.append(f"  {row['run']:<15} {row['output_tokens_per_s']:>6.0f} {row['decode_batch']:>6.2f} "
                         f"{probes:>13} {row['limit_tokens_per_s']:>6.0f} {row['fraction_of_limit']:>8.3f}   "
                         f"{fmt(eng.get('output_tokens_per_s'), '.0f'):>16} "
                         f"{fmt(eng.get('mean_decode_batch'), '.2f'):>6} {fmt(eng.get('fraction_of_limit'), '.3f'):>8}"
                         f"   {fmt(row.get('served_over_in_process'), '.3f'):>17}")
        lines.append(f"  median over {len(pair['runs'])} run(s): served {fmt(pair['fraction_of_limit'], '.3f')} of the "
                     f"limit (target >= {pair['target']}), in-process engine "
                     f"{fmt(pair['engine_fraction_of_limit'], '.3f')}, served / in-process "
                     f"{fmt(pair['served_over_in_process'], '.3f')}")
    sat = s["saturation"]
    lines.append(f"Best saturating run ({sat['run']}): {sat['output_tokens_per_s']:.0f} output tokens/s at mean "
                 f"decode batch {sat['decode_batch']:.2f} (bucket {sat['bucket']}); against the engine limit's best "
                 f"round of the whole benchmark (the machine's quietest moment) {sat['limit_tokens_per_s']:.0f} "
                 f"tokens/s there -> fraction {sat['fraction_of_limit']:.3f}")
    if sat.get("median_limit_tokens_per_s"):
        lines.append(f"  against the limit's median round instead of its best (the machine's usual speed, not its "
                     f"quietest moment): {sat['median_limit_tokens_per_s']:.0f} tokens/s -> fraction "
                     f"{sat['fraction_of_median_limit']:.3f}")
    if sat.get("unbound_limit_tokens_per_s"):
        lines.append(f"  the limit was measured on the agent's cores {sat['cpus']} (agents.cpu_affinity); with every "
                     f"core to itself it is {sat['unbound_limit_tokens_per_s']:.0f} tokens/s there -> fraction "
                     f"{sat['fraction_of_unbound_limit']:.3f}")
    win = sat["full_window"]
    lines.append(f"  while requests queued ({win['seconds']:.1f} s): {win['output_tokens_per_s']:.0f} tokens/s at "
                 f"occupancy {win['mean_occupancy']:.2f} -> fraction {win['fraction_of_limit']:.3f} of "
                 f"{win['limit_tokens_per_s']:.0f}")
    eng = s.get("engine_in_process")
    if eng:
        lines.append(f"  the same requests through the engine in-process (llm_engine.run_engine, best of "
                     f"{eng['runs']}): {eng['output_tokens_per_s']:.0f} tokens/s at mean decode batch "
                     f"{eng['mean_decode_batch']:.2f} -> {eng['fraction_of_limit']:.3f} of the limit (decode-only "
                     f"steps {eng['decode_fraction_of_limit']:.3f}); served / in-process = "
                     f"{eng['served_over_in_process']:.3f}")
    out = sat.get("ttft_outside_engine_ms") or {}
    if out.get("mean") is not None:
        lines.append(f"  client TTFT - engine TTFT (getting into the engine and the first token out): mean "
                     f"{out['mean']:.0f} ms, p90 {out['p90']:.0f} ms; engine ITL mean {fmt(sat['engine_itl_ms'], '.1f')}"
                     f" ms vs client TPOT {fmt(sat['served_tpot_ms'], '.1f')} ms")
    cpu = sat["cpu_ms_per_1k_tokens"]
    line = (f"  CPU per 1000 output tokens: master {cpu['master']:.0f} + worker {cpu['worker']:.0f} + agent "
            f"{cpu['agent']:.0f} = {cpu['server']:.0f} ms (client {cpu['client']:.0f} ms)")
    if eng:
        line += (f"; in-process engine {eng['cpu_ms_per_1k_tokens']:.0f} ms -> served/in-process CPU "
                 f"{sat['server_cpu_over_in_process_cpu']:.2f}x")
    lines.append(line)
    b1 = s["batch1"]
    for warning in s.get("warnings", []):
        lines.append(f"  WARNING: {warning}")
    lines.append(f"Batch 1: served TPOT {b1['served_tpot_ms']:.2f} ms (p50 {b1['served_tpot_p50_ms']:.2f}) vs engine "
                 f"step {b1['engine_step_ms']:.2f} ms -> {b1['fraction_of_limit']:.3f} of the engine limit: "
                 f"{b1['overhead_fraction']:.1%} of each token's time is serving overhead "
                 f"(the engine loop's own ITL, from the master's log: {fmt(b1['engine_itl_ms'], '.2f')} ms; the "
                 f"limit's median batch-1 round: {fmt(b1.get('engine_step_median_ms'), '.2f')} ms)")
    if b1.get("paired"):
        lines.append(f"  against batch-1 steps probed right before and after the run "
                     f"({'/'.join(f'{x:.2f}' for x in b1['paired']['probe_step_ms'])} ms): "
                     f"{b1['paired']['fraction_of_limit']:.3f} of the engine limit")
    cpu = b1["cpu_ms_per_1k_tokens"]
    if b1.get("engine_step_cpu_ms"):
        lines.append(f"  CPU per token: master {cpu['master'] / 1000:.2f} + worker {cpu['worker'] / 1000:.2f} + agent "
                     f"{cpu['agent'] / 1000:.2f} = {cpu['server'] / 1000:.2f} ms vs {b1['engine_step_cpu_ms']:.2f} ms "
                     f"per batch-1 step in-process ({b1['server_cpu_over_engine_cpu']:.2f}x)")
    return "\n".join(lines)


async def serve_runs(args, server: LlmServer, workloads: dict, cpu: Cpu, report: dict, engine: "EngineMeasures"):
    url = f"http://{server.rest}/v1/completions"
    runs = report["runs"]

    async with new_session(args.requests) as session:
        async def measure(name, coro_factory, extra=None, wait_quiet=True, bracket=False):
            quiet = cpu.wait_quiet(args.quiet_wait) if wait_quiet else -1.0
            probe_before = await asyncio.to_thread(engine.probe) if bracket else None
            before = cpu.processes()
            threads0 = cpu.thread_cpu()
            totals0 = engine_totals(server.worker_logs())
            c0 = cpu.snapshot()
            records, started, ended = await coro_factory()
            c1 = cpu.snapshot()
            threads1 = cpu.thread_cpu()
            probe_after = await asyncio.to_thread(engine.probe) if bracket else None
            cpu.learn_thread_names()  # threads started during the run (gRPC handlers) get their names too
            threads0 = {k: (cpu.names.get(k[1], v[0]), v[1]) for k, v in threads0.items()}
            threads1 = {k: (cpu.names.get(k[1], v[0]), v[1]) for k, v in threads1.items()}
            others = cpu.top_others(before, c1["t"] - c0["t"])
            await asyncio.sleep(0.3)  # the master logs each request when its stream is closed
            row = summarise(name, records, started, ended, c0, c1, engine_timings(server.output()), extra)
            row["thread_cpu_ms_per_1k_tokens"] = cpu.thread_use(threads0, threads1, row["output_tokens"])
            row["other_cores_before"] = round(quiet, 3)
            row["engine_steps"] = engine_steps(totals0, engine_totals(server.worker_logs()))
            if bracket:
                row["probes"] = [probe_before, probe_after]
            row["top_other_processes"] = others
            runs.append(row)
            log(f"{name}: {row['ok']}/{row['requests']} ok, {row['req_per_s']:.2f} req/s, "
                f"{row['output_tokens_per_s']:.0f} tok/s, occupancy {row['mean_occupancy']:.2f}, TTFT p50 "
                f"{fmt(row['ttft_ms']['p50'])} ms, TPOT mean {fmt(row['tpot_ms']['mean'], '.2f')} ms, "
                f"CPU m/w/a/c {row['cpu_cores']}, other {row['other_cores']}")
            if row["failed"]:
                log(f"  errors: {row['errors']}")
            return row, records, started

        log("warm-up")
        warm = workloads["warm"]
        await run_closed(session, url, warm, len(warm))
        await run_closed(session, url, warm[:2], 1)
        cpu.learn_thread_names()

        c1_items = workloads["c1"]
        await measure("c=1", lambda: run_closed(session, url, c1_items, 1), bracket=True)

        await asyncio.to_thread(engine.limit)  # the server is idle meanwhile

        rates = []
        for k, (sat_items, workload_path) in enumerate(workloads["saturation"]):
            name = "saturation" if args.saturation_runs == 1 else f"saturation #{k + 1}"
            sat, sat_records, sat_started = await measure(
                name, lambda: run_closed(session, url, sat_items, len(sat_items)),
                {"mode": f"all {len(sat_items)} requests at once", "saturation": True}, bracket=True)
            sat["full_window"] = saturated_window(sat_records, sat_started)
            # right after it, the same requests through the engine in-process, bracketed the same way
            sat["engine_run"] = await asyncio.to_thread(engine.run, workload_path, sat["probes"][1])
            rates.append(sat["req_per_s"])
        saturated_rate = float(np.median(rates))

        for k, (kind, value) in enumerate(args.rates):
            rate = value * saturated_rate if kind == "x" else value
            items = workloads["poisson"][k]
            items = items[:max(16, min(len(items), int(math.ceil(rate * args.poisson_seconds))))]
            label = f"poisson {value:g}x" if kind == "x" else f"poisson {value:g}/s"
            await measure(label, lambda: run_poisson(session, url, items, rate, args.seed + 100 + k),
                          {"mode": "poisson", "rate_req_per_s": round(rate, 3)})

        if not args.quick:
            await asyncio.to_thread(engine.limit)

        if args.profile:
            items = workloads["profile"]
            sat_seconds = min(r["seconds"] for r in runs if r.get("saturation"))
            seconds = max(2, int(sat_seconds * len(items) / args.requests * 0.6))
            cpu.wait_quiet(args.quiet_wait)
            log(f"profile: a saturating run of {len(items)} requests, py-spy from its 1st second for {seconds} s "
                f"-> {args.profile}")
            run = asyncio.ensure_future(measure("profiled saturation",
                                                lambda: run_closed(session, url, items, len(items)),
                                                {"mode": "under py-spy (not a measurement)"}, wait_quiet=False))
            await asyncio.sleep(1.0)  # past the first admissions
            spies = start_spies(cpu, args.profile, seconds)
            await run
            text = finish_spies(spies, args.profile)
            # batch 1: where one token's time goes
            c1_dir = os.path.join(args.profile, "c1")
            c1_items = workloads["c1"][:4]
            run = asyncio.ensure_future(measure("profiled c=1", lambda: run_closed(session, url, c1_items, 1),
                                                {"mode": "under py-spy (not a measurement)"}, wait_quiet=False))
            await asyncio.sleep(0.5)
            spies = [spy for spy in start_spies(cpu, c1_dir, 3) if spy[0] != "master"]
            await run
            c1_text = finish_spies(spies, c1_dir)
            c1_walls = "\n".join(line.replace("-- ", "-- c=1: ", 1) if line.startswith("-- ") else line
                                  for line in c1_text.split("\n-- worker: every thread")[0].split("\n"))
            text = "== batch 1 (profiled c=1)\n" + c1_walls + "\n== saturation (profiled saturation)\n" + text
            with open(os.path.join(args.profile, "summary.txt"), "w") as stream:
                stream.write(text + "\n")
            report["profile"] = {"dir": args.profile, "summary": text}


def _ratio(a: float, b: float) -> Optional[float]:
    return round(a / b, 4) if b else None


def decode_batch(run: dict) -> float:
    """A served run's occupancy for the limit: the engine's mean decode batch per model step (its statistics
    lines), as the in-process engine counts it; the client-side occupancy when the server reported none."""
    steps = run.get("engine_steps") or {}
    return steps.get("mean_decode_batch") or run["mean_occupancy"]


def paired(tokens_per_s: float, occupancy: float, probes: List[dict], batches: List[int]) -> dict:
    """Throughput against the engine limit measured right before and right after it (the mean of the two probes'
    step times of the occupancy's bucket): the machine's speed at that moment, not at its quietest."""
    bucket = bucket_of(batches, occupancy)
    steps = [probe["step_ms"][str(bucket)] for probe in probes]
    at = occupancy / (float(np.mean(steps)) / 1000)
    return {"bucket": bucket, "probe_step_ms": [round(x, 3) for x in steps], "limit_tokens_per_s": round(at, 1),
            "fraction_of_limit": _ratio(tokens_per_s, at)}


def paired_summary(report: dict, batches: List[int]) -> dict:
    """Per saturating run: served, and the in-process engine right after it, each against the limit probed around
    it; the medians over the runs."""
    rows = []
    for run in (r for r in report["runs"] if r.get("saturation") and r.get("probes")):
        row = {"run": run["run"], "output_tokens_per_s": run["output_tokens_per_s"],
               "mean_occupancy": run["mean_occupancy"], "decode_batch": decode_batch(run),
               **paired(run["output_tokens_per_s"], decode_batch(run), run["probes"], batches)}
        eng = run.get("engine_run")
        if eng:
            row["engine"] = {"output_tokens_per_s": round(eng["tokens_per_s"], 1),
                             "mean_decode_batch": round(eng["mean_decode_batch"], 3),
                             **paired(eng["tokens_per_s"], eng["mean_decode_batch"], eng["probes"], batches)}
            row["served_over_in_process"] = _ratio(run["output_tokens_per_s"], eng["tokens_per_s"])
        rows.append(row)

    def median(values):
        values = [v for v in values if v is not None]
        return round(float(np.median(values)), 4) if values else None

    return {"runs": rows, "target": 0.85,
            "fraction_of_limit": median(r["fraction_of_limit"] for r in rows),
            "engine_fraction_of_limit": median(r.get("engine", {}).get("fraction_of_limit") for r in rows),
            "served_over_in_process": median(r.get("served_over_in_process") for r in rows)}


def summary(report: dict) -> dict:
    measurements = report["engine_limit"]["measurements"]
    limit = report["engine_limit"]["best"] = best_limit(measurements)
    batches = measurements[0]["decode_batches"]
    runs = {row["run"]: row for row in report["runs"]}
    # the best saturating run counts, as the best round counts for the limit (noise only takes throughput away)
    sat = max((r for r in report["runs"] if r.get("saturation")), key=lambda r: r["output_tokens_per_s"])
    occ = decode_batch(sat)
    bucket, at = limit_at(limit, batches, occ)
    win = sat["full_window"]
    wbucket, wat = limit_at(limit, batches, win["mean_occupancy"])
    win.update({"bucket": wbucket, "limit_tokens_per_s": round(wat, 1),
                "fraction_of_limit": _ratio(win["output_tokens_per_s"], wat)})
    c1 = runs["c=1"]
    step1 = limit[str(batches[0])]["step_ms"]
    unbound = None
    if all("limit_unbound" in m for m in measurements):
        unbound = report["engine_limit"]["best_unbound"] = best_limit(measurements, "limit_unbound")
    uat = limit_at(unbound, batches, occ)[1] if unbound else None
    median_ms = limit[str(bucket)].get("median_step_ms")
    mat = occ / (median_ms / 1000) if median_ms else None
    result = {
        "saturation": {"run": sat["run"], "output_tokens_per_s": sat["output_tokens_per_s"],
                       "mean_occupancy": sat["mean_occupancy"], "decode_batch": occ, "bucket": bucket, "limit_tokens_per_s": round(at, 1),
                       "fraction_of_limit": _ratio(sat["output_tokens_per_s"], at), "target": 0.85,
                       "cpus": measurements[0].get("cpus"),
                       "unbound_limit_tokens_per_s": round(uat, 1) if uat else None,
                       "median_limit_tokens_per_s": round(mat, 1) if mat else None,
                       "fraction_of_median_limit": _ratio(sat["output_tokens_per_s"], mat) if mat else None,
                       "fraction_of_unbound_limit": _ratio(sat["output_tokens_per_s"], uat) if uat else None,
                       "served_tpot_ms": sat["tpot_ms"]["mean"], "engine_itl_ms": sat["engine_log"]["itl_ms"]["mean"],
                       "ttft_outside_engine_ms": sat["engine_log"]["ttft_outside_engine_ms"],
                       "full_window": win},
        "batch1": {"served_tpot_ms": c1["tpot_ms"]["mean"], "served_tpot_p50_ms": c1["tpot_ms"]["p50"],
                   "engine_step_ms": round(step1, 3), "fraction_of_limit": round(step1 / c1["tpot_ms"]["mean"], 4),
                   "overhead_fraction": round(1 - step1 / c1["tpot_ms"]["mean"], 4),
                   "engine_itl_ms": c1["engine_log"]["itl_ms"]["mean"],
                   "ttft_outside_engine_ms": c1["engine_log"]["ttft_outside_engine_ms"],
                   "engine_step_median_ms": limit[str(batches[0])].get("median_step_ms")},
    }
    def served_cpu(row):
        per = row["cpu_ms_per_1k_tokens"]
        return {**per, "server": round(per["master"] + per["worker"] + per["agent"], 1)}

    result["saturation"]["cpu_ms_per_1k_tokens"] = served_cpu(sat)
    result["batch1"]["cpu_ms_per_1k_tokens"] = served_cpu(c1)
    cpu1 = limit[str(batches[0])].get("cpu_ms")
    if cpu1:
        result["batch1"]["engine_step_cpu_ms"] = round(cpu1, 3)
        result["batch1"]["server_cpu_over_engine_cpu"] = round(served_cpu(c1)["server"] / 1000 / cpu1, 3)
    warnings = []
    steps = [limit[str(b)]["step_ms"] for b in batches]
    if any(later < earlier * 0.9 for earlier, later in zip(steps, steps[1:])):
        warnings.append("the engine limit's step times do not grow with the batch: the machine was busy while it "
                        "was measured (rerun, or compare with bench/llm_engine.py)")
    busy = [r["run"] for r in report["runs"] if r["other_cores"] > 0.3 and not r["run"].startswith("profiled")]
    if busy:
        warnings.append(f"other processes used > 0.3 cores during: {', '.join(busy)} (see other_cores)")
    result["warnings"] = warnings
    result["paired"] = paired_summary(report, batches)
    if c1.get("probes"):
        steps = [probe["step_ms"][str(batches[0])] for probe in c1["probes"]]
        result["batch1"]["paired"] = {"probe_step_ms": [round(x, 3) for x in steps],
                                      "fraction_of_limit": _ratio(float(np.mean(steps)), c1["tpot_ms"]["mean"])}
    engine_runs = [r["engine_run"] for r in report["runs"] if r.get("engine_run")]
    if engine_runs:
        best = max(engine_runs, key=lambda r: r["tokens_per_s"])
        ebucket, eat = limit_at(limit, batches, best["mean_decode_batch"])
        decode_at = limit_at(limit, batches, best["decode_only_mean_batch"])[1] if best["decode_only_steps"] else 0.0
        result["engine_in_process"] = {
            "runs": len(engine_runs), "output_tokens_per_s": round(best["tokens_per_s"], 1),
            "each_tokens_per_s": [round(r["tokens_per_s"], 1) for r in engine_runs],
            "mean_decode_batch": round(best["mean_decode_batch"], 3), "bucket": ebucket,
            "fraction_of_limit": round(best["tokens_per_s"] / eat, 4),
            "decode_fraction_of_limit": round(best["decode_only_tokens_per_s"] / decode_at, 4) if decode_at else 0.0,
            "served_over_in_process": round(sat["output_tokens_per_s"] / best["tokens_per_s"], 4),
            "cpu_ms_per_1k_tokens": round(min(r["cpu_ms_per_1k_tokens"] for r in engine_runs), 1)}
        result["saturation"]["server_cpu_over_in_process_cpu"] = round(
            served_cpu(sat)["server"] / result["engine_in_process"]["cpu_ms_per_1k_tokens"], 3)
    return result


def engine_overrides(items: List[str]) -> Dict[str, object]:
    """--engine FIELD=VALUE items as {field: YAML value}."""
    import yaml
    overrides = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--engine takes FIELD=VALUE, got {item!r}")
        overrides[name.strip()] = yaml.safe_load(value)
    return overrides


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.engine_child:
        engine_child(args.engine_child)
        return 0
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _raise_exit)
    started = time.time()
    workdir = tempfile.mkdtemp(prefix="ms_bench_llm_")
    agents = {} if args.cpu_affinity == "config" else {"cpu_affinity": None if args.cpu_affinity == "none" else "auto"}
    server = LlmServer(workdir, engine_overrides(args.engine), agents)
    from mindspore_serving.spec.llm_config import load_serving_config
    config = load_serving_config(server.config)
    max_model_len = config.engine.max_model_len
    report = {"meta": {"started": datetime.datetime.now().isoformat(timespec="seconds"), "quick": args.quick,
                       "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(), "seed": args.seed,
                       "requests": args.requests, "cpu_affinity": args.cpu_affinity, "c1_requests": args.c1_requests,
                       "poisson_seconds": args.poisson_seconds,
                       "saturation_runs": args.saturation_runs,
                       "rates": [f"{v:g}x" if k == "x" else f"{v:g}/s" for k, v in args.rates],
                       "api": "OpenAI POST /v1/completions, stream, ignore_eos, temperature 0, include_usage",
                       "client": "asyncio (uvloop) + aiohttp, one connection per stream",
                       "workload": f"prompts {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens (windows of "
                                   f"data/kjv_narrative.txt), outputs log-uniform {OUTPUT_TOKENS[0]}-"
                                   f"{OUTPUT_TOKENS[1]} tokens; c=1: {C1_OUTPUT_TOKENS} output tokens",
                       "engine": {k: getattr(config.engine, k) for k in ("batching", "max_num_seqs",
                                                                       "max_num_batched_tokens", "num_blocks",
                                                                       "enable_prefix_caching",
                                                                       "enable_chunked_prefill", "max_model_len",
                                                                       "num_scheduler_steps", "async_scheduling",
                                                                       "max_prefills_per_decode_step")}},
              "engine_limit": {"measurements": []}, "runs": []}
    source = PromptSource(config.model.tokenizer)
    workloads = {"warm": workload(source, 24, args.seed + 99, max_model_len, output_tokens=8),
                 "c1": workload(source, args.c1_requests, args.seed + 1, max_model_len, output_tokens=C1_OUTPUT_TOKENS),
                 # each saturating run its own prompts: a repeated prompt would hit the prefix cache
                 "saturation": [workload(source, args.requests, args.seed + 2 + 30 * k, max_model_len)
                                for k in range(args.saturation_runs)],
                 "profile": workload(source, 2 * args.requests, args.seed + 3, max_model_len),
                 "poisson": [workload(source, args.requests, args.seed + 10 + k, max_model_len)
                             for k in range(len(args.rates))]}
    for k, items in enumerate(workloads["saturation"]):  # and for the in-process engine, the ids the server makes
        path = os.path.join(workdir, f"saturation_workload_{k}.json")
        with open(path, "w", encoding="utf-8") as stream:
            json.dump([[source.tokenizer.encode(item.prompt), item.max_tokens] for item in items], stream)
        workloads["saturation"][k] = (items, path)
    report["meta"]["saturation_output_tokens"] = [sum(item.max_tokens for item in items)
                                                  for items, _ in workloads["saturation"]]

    try:
        log("starting the server")
        t0 = time.time()
        server.start()
        log(f"server ready in {time.time() - t0:.1f} s at {server.rest}")
        cpu = Cpu(server.processes[0])
        with contextlib.suppress(ImportError):
            import uvloop  # the client's own CPU use matters on a 2-core machine
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        log("starting the engine subprocess (the served graphs, bound like the agent)")
        process = EngineProcess(server.config)
        engine = EngineMeasures(process, report, args.limit_steps)
        asyncio.run(serve_runs(args, server, workloads, cpu, report, engine))
        process.close()
    finally:
        _kill_children()
        try:
            server.stop()
        except Exception as err:
            log(f"stopping the server failed: {err}")
        if args.keep_logs:
            log(f"server logs: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    report["summary"] = summary(report)
    report["meta"]["loadavg_end"] = os.getloadavg()
    report["meta"]["wall_s"] = round(time.time() - started, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as stream:
        json.dump(report, stream, indent=1)
    print()
    print(table(report))
    if report.get("profile"):
        print("\nProfile of a saturated run\n" + report["profile"]["summary"])
    log(f"wrote {args.out} in {report['meta']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
