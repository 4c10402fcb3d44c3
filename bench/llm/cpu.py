"""CPU accounting of a served run: CPU seconds of the server's processes by role (master, worker, agent), of this
client and of the whole machine; per thread, named by Python thread name where py-spy can tell it; the other
processes on the machine and waiting for them to calm down."""

import contextlib
import json
import re
import subprocess
import time

import psutil
from pyspy_summary import py_spy  # bench/pyspy_summary.py

ROLES = ("master", "worker", "agent")


def thread_kind(name: str) -> str:
    """A thread's name with its pool index folded (ActorThread_3 -> ActorThread_*): threads of one pool add up."""
    return re.sub(r"_\d+$", "_*", name)


def kernel_thread_name(pid, thread_id: int) -> str:
    """The kernel's name of a thread (its comm); "?" when it ended meanwhile."""
    try:
        with open(f"/proc/{pid}/task/{thread_id}/comm") as stream:
            return stream.read().strip()
    except OSError:
        return "?"


def thread_use(before: dict, after: dict, tokens: int) -> dict[str, float]:
    """CPU ms per 1000 output tokens by thread name, from {key: (name, CPU seconds)} before and after; a thread
    started meanwhile counts from 0."""
    use: dict[str, float] = {}
    for key, (name, total) in after.items():
        use[name] = use.get(name, 0.0) + (total - before.get(key, (name, 0.0))[1]) / max(1, tokens) * 1e6
    return {name: round(v, 1) for name, v in sorted(use.items(), key=lambda kv: -kv[1]) if v >= 0.5}


class Cpu:
    """CPU seconds of the server's processes by role, this client, and the whole machine."""

    def __init__(self, server_root: psutil.Process):
        self.roles: dict[str, list[psutil.Process]] = {"master": [server_root], "worker": [], "agent": []}
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
        self.names: dict[int, str] = {}

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
        for role in ROLES:
            pid = self.pid(role)
            if pid is None:
                continue
            try:
                out = subprocess.run(
                    [spy, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                for thread in json.loads(out.stdout):
                    if thread.get("os_thread_id") and thread.get("thread_name"):
                        self.names[thread["os_thread_id"]] = "py:" + thread_kind(thread["thread_name"])
            except (subprocess.SubprocessError, ValueError, OSError):
                continue

    def thread_cpu(self) -> dict[tuple[str, int], tuple[str, float]]:
        """(role, thread id) -> (thread's name, CPU seconds): a Python thread's name when learn_thread_names found it
        ("py:..."), else the kernel's (MindSpore's runtime threads ActorThread_*/KernelThread_*, gRPC core's
        event_engine, "python" for unnamed Python threads)."""
        found = {}
        for role, procs in list(self.roles.items()) + [("client", [self.client])]:
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    for thread in proc.threads():
                        name = self.names.get(thread.id) or thread_kind(kernel_thread_name(proc.pid, thread.id))
                        found[(role, thread.id)] = (name, thread.user_time + thread.system_time)
        return found

    @staticmethod
    def thread_use(before, after, tokens: int) -> dict[str, dict[str, float]]:
        """CPU ms per 1000 output tokens by role and thread name."""
        return {
            role: thread_use(before, {k: v for k, v in after.items() if k[0] == role}, tokens)
            for role in dict.fromkeys(key[0] for key in after)
        }

    def snapshot(self) -> dict:
        machine = psutil.cpu_times()
        snap = {role: self._cpu(procs) for role, procs in self.roles.items()}
        snap["client"] = self._cpu([self.client])
        snap["machine"] = (
            machine.user + machine.system + machine.nice + getattr(machine, "irq", 0) + getattr(machine, "softirq", 0)
        )
        snap["t"] = time.perf_counter()
        return snap

    def ours(self) -> set:
        pids = {self.client.pid}
        for procs in self.roles.values():
            pids.update(p.pid for p in procs)
        return pids

    @staticmethod
    def processes() -> dict[int, tuple[str, float]]:
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

    def top_others(self, before: dict[int, tuple[str, float]], seconds: float, count: int = 3) -> list[dict]:
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
            ours = sum(b[k] - a[k] for k in (*ROLES, "client"))
            other = max(0.0, (b["machine"] - a["machine"]) - ours) / (b["t"] - a["t"])
            if other < threshold or time.perf_counter() >= deadline:
                return other

    def pid(self, role: str) -> int | None:
        return self.roles[role][0].pid if self.roles[role] else None
