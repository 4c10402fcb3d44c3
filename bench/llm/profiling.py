"""py-spy profiles of a served run (--profile): one more saturating run and a c=1 run under py-spy record, the
wall-time states of the worker's engine thread and of the agent, and the master's on-CPU profile."""

import asyncio
import collections
import os
import subprocess

import pyspy_summary  # bench/pyspy_summary.py
from run_output import log  # bench/run_output.py

from .client import run_closed
from .cpu import Cpu

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
    ("graph call inputs (step_inputs: plan_calls, call_inputs)", ("plan_calls", "call_inputs")),
    ("step decoding / logits encoding (protocol)", ("decode_step", "encode_logits")),
    ("GraphRunner bookkeeping (run, call: input Tensors, logits rows)", ("GraphRunner.",)),
)
FOCUS = {
    "master": [
        "completion_chunks",
        "MasterLlmBackend.stream",
        "grpc/aio",
        "uvicorn",
        "starlette",
        "anyio",
        "Generation.events",
        "Generation.close",
        "sse.py",
        "log.py",
    ],
    "worker": [
        "EngineLoop._run",
        "LlmWorkerServicer.Generate",
        "grpc/_server.py",
        "AgentRunner.run",
        "Scheduler.schedule",
        "Sampler.",
        "update_from_output",
        "LLMEngine._to_output",
        "EngineLoop._deliver",
    ],
    "agent": [
        "AgentServicer.Step",
        "_CellGraphExecutor",
        "GraphRunner.call",
        "call_inputs",
        "asnumpy",
        "encode_logits",
        "decode_step",
        "grpc/_server.py",
    ],
}
SPY_ARGS = {"master": ["-r", "100", "--nonblocking"], "worker": ["-r", "50", "--idle"], "agent": ["-r", "50", "--idle"]}


def _classify(names: list[str], states) -> str:
    for label, needles in states:
        if any(needle in name for name in names for needle in needles):
            return label
    return "other: " + (names[0] if names else "?")


def start_spies(
    cpu: Cpu, out_dir: str, seconds: int, roles=("master", "worker", "agent")
) -> list[tuple[str, str, subprocess.Popen]]:
    """py-spy record of the master (on-CPU samples, not pausing it) and of the worker and the agent (every thread at
    every tick, idle included, pausing the process for each sample: exact about waiting threads, which
    `--nonblocking --idle` is not)."""
    spy = pyspy_summary.py_spy()
    spies = []
    if not spy:
        log("py-spy not found: no profile")
        return spies
    os.makedirs(out_dir, exist_ok=True)
    for role in roles:
        pid = cpu.pid(role)
        if pid is None:
            continue
        path = os.path.join(out_dir, f"{role}.txt")
        spies.append(
            (
                role,
                path,
                subprocess.Popen(
                    [spy, "record", "-p", str(pid), "-d", str(seconds), "--threads", "-f", "raw", "-o", path]
                    + SPY_ARGS[role],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
            )
        )
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


def finish_spies(spies, out_dir: str) -> str:
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


async def profiled_runs(measure, session, url: str, cpu: Cpu, workloads: dict, args, runs: list[dict]) -> dict:
    """A saturating run of the profile workload and a c=1 run, each under py-spy from shortly after its start;
    returns the report's "profile" (DIR/summary.txt holds the same summary)."""
    items = workloads["profile"]
    sat_seconds = min(r["seconds"] for r in runs if r.get("saturation"))
    seconds = max(2, int(sat_seconds * len(items) / args.requests * 0.6))
    cpu.wait_quiet(args.quiet_wait)
    log(
        f"profile: a saturating run of {len(items)} requests, py-spy from its 1st second for {seconds} s "
        f"-> {args.profile}"
    )
    run = asyncio.ensure_future(
        measure(
            "profiled saturation",
            lambda: run_closed(session, url, items, len(items)),
            {"mode": "under py-spy (not a measurement)"},
            wait_quiet=False,
        )
    )
    await asyncio.sleep(1.0)  # past the first admissions
    spies = start_spies(cpu, args.profile, seconds)
    await run
    text = finish_spies(spies, args.profile)
    # batch 1: where one token's time goes
    c1_dir = os.path.join(args.profile, "c1")
    c1_items = workloads["c1"][:4]
    run = asyncio.ensure_future(
        measure(
            "profiled c=1",
            lambda: run_closed(session, url, c1_items, 1),
            {"mode": "under py-spy (not a measurement)"},
            wait_quiet=False,
        )
    )
    await asyncio.sleep(0.5)
    spies = start_spies(cpu, c1_dir, 3, roles=("worker", "agent"))
    await run
    c1_text = finish_spies(spies, c1_dir)
    c1_walls = "\n".join(
        line.replace("-- ", "-- c=1: ", 1) if line.startswith("-- ") else line
        for line in c1_text.split("\n-- worker: every thread")[0].split("\n")
    )
    text = "== batch 1 (profiled c=1)\n" + c1_walls + "\n== saturation (profiled saturation)\n" + text
    with open(os.path.join(args.profile, "summary.txt"), "w") as stream:
        stream.write(text + "\n")
    return {"dir": args.profile, "summary": text}
