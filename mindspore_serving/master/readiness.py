"""Whether the server can serve, and why not: a pure function over the master's plans, registry and phase.

Live means the master answers; ready means it would serve every configured servable now:

    phase      the master is `serving` (not before start_servables finished, nor while it stops)
    servable   at least one of its workers is registered, answers the heartbeat and can serve (an LLM worker's
               agents are not restarting: `WorkerRecord.not_ready`, from its last heartbeat)

The front ends answer `GET /ready`, the KServe v2 probes and grpc.health.v1 from `Master.readiness()`.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

IDLE, STARTING, SERVING, STOPPING = "idle", "starting", "serving", "stopping"
"""The master's phases: no servable started yet, start_servables running, serving, stopping (the drain)."""

READY, NOT_READY, RESTARTING, NOT_RESPONDING, STOPPED = "ready", "not ready", "restarting", "not responding", "stopped"
"""A worker's states (STARTING too): registered and serving; registered but unable to serve now (its LLM agents
restart); dead and being restarted; hung (about to be killed); exited and not restarted (given up)."""


@dataclass(frozen=True)
class PlannedWorker:
    """One worker the master was asked to run (WorkerProcesses' view of it)."""

    key: str
    servable_name: str
    running: bool  # its process runs or is being started; False once it exited for good
    starts: int  # how often it was started, the start to come included while it is being restarted (a first
    #               start is `starting`, later ones `restarting`)


@dataclass(frozen=True)
class WorkerState:
    key: str
    state: str
    reason: str = ""
    pid: int | None = None
    version: int | None = None  # the version it serves, once registered

    def to_json(self) -> dict:
        out = {"key": self.key, "state": self.state}
        if self.pid is not None:
            out.update(pid=self.pid, version=self.version)
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class ServableState:
    name: str
    ready: bool
    state: str
    versions: Sequence[int] = ()  # the versions a ready worker serves
    workers: Sequence[WorkerState] = ()

    @property
    def reason(self) -> str:
        return "; ".join(f"{w.key}: {w.reason or w.state}" for w in self.workers if w.state != READY)

    def to_json(self, details: bool = True) -> dict:
        out = {"ready": self.ready, "state": self.state, "versions": list(self.versions)}
        if details:
            out["workers"] = [w.to_json() for w in self.workers]
        return out


@dataclass(frozen=True)
class Readiness:
    ready: bool
    phase: str
    servables: dict[str, ServableState] = field(default_factory=dict)
    live: bool = True

    @property
    def reason(self) -> str:
        """Why the server is not ready ("" when it is)."""
        if self.ready:
            return ""
        if self.phase == IDLE:
            return "no servable has been started"
        if self.phase == STARTING:
            return "the servables are starting"
        if self.phase == STOPPING:
            return "the server is stopping"
        return "; ".join(f"servable {s.name} is {s.state} ({s.reason})" for s in self.servables.values() if not s.ready)

    def model_ready(self, name: str, version: int = 0) -> bool | None:
        """Whether servable `name` (`version`, 0: any) can serve now; None when the server has no such servable."""
        servable = self.servables.get(name)
        if servable is None:
            return None
        return servable.ready and (version == 0 or version in servable.versions)

    def to_json(self, details: bool = True) -> dict:
        """The state as /ready shows it; without `details`, each servable's workers (keys, pids) are left out."""
        out = {
            "live": self.live,
            "ready": self.ready,
            "phase": self.phase,
            "servables": {name: s.to_json(details) for name, s in self.servables.items()},
        }
        if not self.ready:
            out["reason"] = self.reason
        return out


def _worker_state(planned: PlannedWorker | None, record) -> WorkerState:
    key = planned.key if planned is not None else record.key
    if record is None:
        if not planned.running:
            return WorkerState(key, STOPPED, "exited and not restarted")
        if planned.starts <= 1:
            return WorkerState(key, "starting", "not registered yet")
        return WorkerState(key, RESTARTING, "died; not registered again yet")
    registered = dict(pid=record.pid, version=record.version_number)
    if record.lost_reason:
        return WorkerState(key, NOT_RESPONDING, record.lost_reason, **registered)
    if record.not_ready:
        return WorkerState(key, NOT_READY, record.not_ready, **registered)
    return WorkerState(key, READY, **registered)


_SERVABLE_STATE_ORDER = (READY, NOT_READY, RESTARTING, "starting", NOT_RESPONDING, STOPPED)
"""A servable is in the best state of its workers (the first here)."""


def readiness(phase: str, planned: Sequence[PlannedWorker], records: Sequence) -> Readiness:
    """The server's readiness from the master's `phase`, the workers it runs (`planned`) and the registered
    `records` (WorkerRecord: key, pid, servable_name, version_number, lost_reason, not_ready)."""
    by_key = {record.key: record for record in records}
    workers: dict[str, list[WorkerState]] = {}
    for plan in planned:
        workers.setdefault(plan.servable_name, []).append(_worker_state(plan, by_key.pop(plan.key, None)))
    for record in by_key.values():  # registered without a plan of this master: still serves
        workers.setdefault(record.servable_name, []).append(_worker_state(None, record))
    servables = {}
    for name, states in workers.items():
        state = min((w.state for w in states), key=_SERVABLE_STATE_ORDER.index)
        ready = state == READY and phase != STOPPING
        versions = sorted({w.version for w in states if w.state == READY})
        servables[name] = ServableState(name, ready, STOPPING if phase == STOPPING else state, versions, tuple(states))
    ready = phase == SERVING and all(s.ready for s in servables.values())
    return Readiness(ready, phase, servables)


def readiness_from_json(data: dict) -> Readiness:
    """The Readiness whose `to_json()` is `data` (how the master tells its front-end processes)."""
    servables = {}
    for name, servable in data.get("servables", {}).items():
        workers = tuple(
            WorkerState(w["key"], w["state"], w.get("reason", ""), w.get("pid"), w.get("version"))
            for w in servable.get("workers", ())
        )
        servables[name] = ServableState(name, servable["ready"], servable["state"], list(servable["versions"]), workers)
    return Readiness(data["ready"], data["phase"], servables, data.get("live", True))
