"""The engine beside the server: one subprocess (its own MindSpore process, bound like the agent, the served graphs
and num_blocks) that measures the engine limit, probes it around a served run and runs the saturating requests
in-process; the parent's handle on it, and its end when the benchmark ends or is signalled."""

import contextlib
import json
import os
import subprocess
import sys
import time

import psutil
from run_output import log  # bench/run_output.py

from .cpu import kernel_thread_name, thread_kind, thread_use

ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "llm_serving.py")
CHILD_MARK = "ENGINE_CHILD_JSON "


class Exit(Exception):
    pass


_CHILDREN: list[subprocess.Popen] = []  # the engine subprocess


def kill_children():
    for child in list(_CHILDREN):
        if child.poll() is None:
            child.kill()


def raise_exit(signum, _frame):
    kill_children()
    raise Exit(f"signal {signum}")


def engine_child(config_path: str) -> None:
    """In a subprocess bound like the config's rank-0 agent: loads the served graphs (same num_blocks, and as the
    agent at most engine.max_num_batched_tokens tokens per graph call) once, then
    answers one JSON line on stdout per JSON line on stdin (EOF ends it):
      {"op": "limit", "steps": N}     llm_engine.engine_limit (best of 3 rounds per batch of
                                      llm_engine.limit_batches(engine.max_num_seqs)), CPU per step, and the same
                                      with every core (for reference);
      {"op": "probe", "steps": N}     one timed block of N back-to-back decode steps per batch: the mean step time
                                      right now, to bracket a served run with;
      {"op": "engine", "workload": P} llm_engine.run_engine on a workload file ([[prompt ids, new tokens], ...])."""
    from llm_engine import (
        bind_like_agent,
        engine_limit,
        limit_batches,
        limit_seqs,
        load_runner,
        run_engine,
        step_seconds,
    )

    from mindspore_serving.common.cpu_affinity import bind_threads
    from mindspore_serving.spec.llm_config import load_serving_config

    config = load_serving_config(config_path)
    all_cpus = sorted(os.sched_getaffinity(0))
    cpus = bind_like_agent(config)  # the agent's cores (agents.cpu_affinity): the same conditions as served
    runner = load_runner(config)
    batches = limit_batches(config.engine.max_num_seqs)  # decode steps of these many rows measure the limit

    def limit(steps):
        result = engine_limit(runner, steps, batches)
        for batch in batches:  # CPU time per step (this process, all its threads): less hit by noise
            rows = limit_seqs(batch)
            cpu0 = time.process_time()
            wall_ms = step_seconds(runner, rows, steps) * 1000
            result[batch]["cpu_ms"] = (time.process_time() - cpu0) / steps * 1000
            result[batch]["wall_ms_of_cpu_rounds"] = wall_ms
        out = {
            "limit_batches": batches,
            "num_blocks": config.engine.num_blocks,
            "cpus": cpus,
            "graphs": config.model.graphs[0],
            "steps": steps,
            "limit": {str(k): v for k, v in result.items()},
        }
        if cpus is not None:  # for reference: the same graphs with every core of the machine to themselves
            bind_threads(all_cpus)
            out["limit_unbound"] = {str(k): v for k, v in engine_limit(runner, steps, batches).items()}
            bind_threads(cpus)
        return out

    def probe(steps):
        step_ms = {}
        for batch in batches:
            rows = limit_seqs(batch)
            runner.run(rows)
            step_ms[str(batch)] = step_seconds(runner, rows, steps) * 1000
        return {"t": time.time(), "step_ms": step_ms}

    def threads(me):
        return {
            t.id: (thread_kind(kernel_thread_name("self", t.id)), t.user_time + t.system_time) for t in me.threads()
        }

    def engine(workload_path):
        with open(workload_path, encoding="utf-8") as stream:
            requests = [(ids, n) for ids, n in json.load(stream)]
        me = psutil.Process()
        threads0 = threads(me)
        cpu0, calls0, mixed0 = time.process_time(), runner.calls, runner.mixed_calls
        run = run_engine(runner, config.engine, requests)  # in one thread the engine steps in turn (raw engine)
        run["cpu_ms_per_1k_tokens"] = (time.process_time() - cpu0) / max(1, run["output_tokens"]) * 1e6
        run["thread_cpu_ms_per_1k_tokens"] = thread_use(threads0, threads(me), run["output_tokens"])
        run.update(
            {
                "requests": len(requests),
                "graph_calls": runner.calls - calls0,
                "mixed_calls": runner.mixed_calls - mixed0,
            }
        )
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
        self.proc = subprocess.Popen(
            [sys.executable, ENTRY, "--engine-child", config_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, GLOG_v="2"),
        )
        _CHILDREN.append(self.proc)
        self.cpus = self._reply()["cpus"]

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(CHILD_MARK):
                return json.loads(line[len(CHILD_MARK) :])
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
