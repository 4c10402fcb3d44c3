"""Runs comparison scenarios against a serving (ours, or MindSpore Serving 2.0.2) and records what a user sees.

A `Group` is one server start: the servables laid out for it, the `mindspore_serving.server` calls that start it
(tests/compat/target_server.py runs them in the target's interpreter), the environment, and its scenarios. A
`Scenario` sends requests (tests/compat/target_client.py, in the target's interpreter too) and turns what came back,
the server's steps, its output and its log files into one JSON-able observation. `normalize` takes out what
differs from run to run (ports, pids, paths, times) so that the observations of two targets compare equal when a
user could not tell them apart.
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(HERE, "servables")
START_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0


@dataclasses.dataclass(frozen=True)
class Target:
    """A serving under test: its interpreter, environment and the MindIR files its runtime loads."""

    name: str
    python: str
    env: dict[str, str]
    models: dict[str, str]  # model file name -> path of one this target's runtime loads
    start_kwargs: dict[str, Any]  # extra keyword arguments of start_servables (MindSpore Serving: enable_lite)


@dataclasses.dataclass
class Context:
    """What a scenario's functions see: the group's addresses and, once it ran, the server's outcome."""

    target: Target
    run_dir: str
    servables_dir: str
    grpc: str
    rest: str
    steps: list[dict] = dataclasses.field(default_factory=list)
    output: str = ""
    exit_code: int | None = None
    pid: int | None = None

    def log_files(self) -> dict[str, str]:
        """serving_logs/<name> -> content."""
        folder = os.path.join(self.run_dir, "serving_logs")
        found = {}
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as stream:
                found[name] = stream.read()
        return found


@dataclasses.dataclass
class Scenario:
    name: str  # "<category>: ...", the category one of start-up, rest, grpc, client, logs, faults
    requests: Callable[[Context], list[dict]] | None = None
    observe: Callable[[Context, list[dict]], Any] | None = None  # default: the requests' observations
    before: Callable[[Context], None] | None = None  # e.g. kill a worker

    @property
    def category(self) -> str:
        return self.name.split(":", 1)[0]


@dataclasses.dataclass
class Group:
    name: str
    # servable -> {version folder: [model files]}, "from": the fixture copied (default: the servable's name; a name
    # without a fixture is an empty directory)
    servables: dict[str, dict[str, Any]]
    steps: Callable[[Context], list[dict]]
    scenarios: list[Scenario]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    serve: bool = True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lay_out(group: Group, target: Target, directory: str) -> str:
    """Copies the group's servables from tests/compat/servables into `directory`/servables, each version folder
    holding the target's copy of its model files."""
    servables = os.path.join(directory, "servables")
    for name, versions in group.servables.items():
        source = os.path.join(FIXTURES, versions.get("from", name))
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(servables, name), ignore=shutil.ignore_patterns("__pycache__"))
        else:  # a servable directory without servable_config.py
            os.makedirs(os.path.join(servables, name))
        for version, files in versions.items():
            if version == "from":
                continue
            folder = os.path.join(servables, name, version)
            os.makedirs(folder, exist_ok=True)
            for file in files:
                shutil.copyfile(target.models[file], os.path.join(folder, file))
    return servables


def _steps_of(output: str) -> list[dict]:
    return [json.loads(line[len("COMPAT_STEP ") :]) for line in output.splitlines() if line.startswith("COMPAT_STEP ")]


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as stream:
        return stream.read()


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its process group
    except ProcessLookupError:
        pass
    return proc.wait()


def run_client(ctx: Context, requests: list[dict]) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        given, taken = os.path.join(folder, "requests.json"), os.path.join(folder, "observations.json")
        with open(given, "w", encoding="utf-8") as stream:
            json.dump(requests, stream)
        done = subprocess.run(
            [ctx.target.python, os.path.join(HERE, "target_client.py"), given, taken],
            env=ctx.target.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            return [{"client_failed": done.returncode, "stderr": done.stderr[-2000:]}]
        with open(taken, encoding="utf-8") as stream:
            return json.load(stream)


def run_group(group: Group, target: Target, keep: str | None = None) -> dict[str, Any]:
    """Starts the group's server on `target`, runs its scenarios, stops it; scenario name -> observation."""
    directory = tempfile.mkdtemp(prefix=f"compat_{target.name}_{group.name}_", dir=keep)
    servables = lay_out(group, target, directory)
    ctx = Context(target, directory, servables, f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
    steps = group.steps(ctx)
    for step in steps:
        if step["call"] == "start_servables":
            step.update({key: value for key, value in target.start_kwargs.items() if key not in step})
    spec = os.path.join(directory, "spec.json")
    with open(spec, "w", encoding="utf-8") as stream:
        json.dump({"steps": steps, "serve": group.serve}, stream)
    output_path, steps_path = os.path.join(directory, "output.log"), os.path.join(directory, "steps.jsonl")
    open(steps_path, "w").close()
    observations: dict[str, Any] = {}
    with open(output_path, "wb") as output:
        proc = subprocess.Popen(
            [target.python, os.path.join(HERE, "target_server.py"), spec, steps_path],
            cwd=directory,
            env={**target.env, **group.env},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ctx.pid = proc.pid
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            text = _read(steps_path)
            if "COMPAT_READY" in text or "COMPAT_DONE" in text or proc.poll() is not None:
                break
            time.sleep(0.1)  # ok-sleep: polling the server's steps with a deadline
        ctx.steps = _steps_of(_read(steps_path))
        served = "COMPAT_READY" in _read(steps_path)
        for scenario in group.scenarios:
            if scenario.requests is None:
                continue
            if scenario.before:
                scenario.before(ctx)
            requests = scenario.requests(ctx)
            observations[scenario.name] = run_client(ctx, requests) if served else [{"not_served": True}]
    finally:
        ctx.exit_code = _stop(proc)
        ctx.output = _read(output_path)
    for scenario in group.scenarios:
        seen = observations.get(scenario.name, [])
        observations[scenario.name] = normalize(scenario.observe(ctx, seen) if scenario.observe else seen, ctx)
    if keep is None:
        shutil.rmtree(directory, ignore_errors=True)
    return observations


# ---- normalisation ----

_HEADER = re.compile(
    r"\[(DEBUG|INFO|WARNING|ERROR|EXCEPTION|CRITICAL)\] (\w+)\((\d+)[:,]([0-9a-fx]+),([^)]*)\):"
    r"(\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d\.\d+\.\d*) \[([^\]:]+):(\d+)\]( [\w~<>:()]+\])? ?"
)


_REQUEST_ID = re.compile(r" \[request [0-9a-f]+\]$")  # ours ends a request's log lines with its id


def log_lines(text: str, *needles: str) -> list[str]:
    """The lines of `text` holding one of `needles`, as `[LEVEL] message` (the header's pid, thread, time, file and
    function taken out: each serving writes its own; and the request id ours appends)."""
    found = []
    for line in text.splitlines():
        if any(needle in line for needle in needles):
            match = _HEADER.search(line)
            text = _REQUEST_ID.sub("", line[match.end() :] if match else line)
            found.append(f"[{match.group(1)}] {text}" if match else text)
    return found


def normalize(value: Any, ctx: Context | None = None) -> Any:
    """`value` with what differs between runs replaced by placeholders."""
    if isinstance(value, dict):
        return {key: normalize(item, ctx) for key, item in value.items()}
    if isinstance(value, list):
        return [normalize(item, ctx) for item in value]
    if not isinstance(value, str):
        return value
    text = value
    if ctx is not None:
        text = text.replace(ctx.servables_dir, "<servables>").replace(ctx.run_dir, "<run>")
        text = text.replace(ctx.grpc, "<grpc>").replace(ctx.rest, "<rest>")
    text = re.sub(r"unix:[\w./-]+", "unix:<socket>", text)
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)
    text = re.sub(r"\b(pid|pid=|pid:|pid )\s*\d+", r"\1<pid>", text)
    text = re.sub(r"\d+(\.\d+)? ms\b", "<n> ms", text)
    return text


def run_target(groups: list[Group], target: Target, keep: str | None = None) -> dict[str, Any]:
    """Every group's observations on `target`: scenario name -> normalized observation."""
    seen: dict[str, Any] = {}
    for group in groups:
        started = time.monotonic()
        observed = run_group(group, target, keep)
        seen.update(observed)
        print(
            f"  {target.name}: {group.name} ({len(observed)} scenarios) in {time.monotonic() - started:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return seen
