"""Model control: servables loaded and unloaded while the server serves (Triton's model repository API).

    load(plans)            start the plans' workers beside those serving; once all registered, workers of the same
                           servable, version and device that served before drain and stop (a reload)
    unload(name, version)  the servable's workers (of `version`; 0: all) leave the registry, drain, and stop

Nothing that serves is touched by a load that fails: its own workers are killed, and the error says why.
Draining a worker: it leaves the registry (no new request picks it), the requests queued for it or sent to it
are answered (its `outstanding` falls to 0, within the stop grace), then it gets SIGTERM. One operation runs at
a time; each blocks (a worker's start does until it registers), so the front ends call it from a thread.
"""

import re
import threading
import time
from collections.abc import Callable

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.master.worker_processes import WorkerPlan, WorkerProcesses
from mindspore_serving.master.worker_registry import WorkerRegistry

DRAIN_POLL = 0.05
"""Seconds between two looks at a draining worker's outstanding work."""
EXIT_GRACE = 5.0
"""Seconds a drained worker gets to exit after SIGTERM before its process group is killed."""
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

NO_CONTROL_TEXT = "model control is off on this server (start it with --model_control explicit)"


def check_servable_name(name: str):
    """Raises InvalidInputs for a name that cannot be a servable directory's (empty, a path, hidden)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise errors.InvalidInputs(
            f"invalid servable name {name!r}: expected a directory name of letters, digits, '_', '.' or '-'"
        )


class ModelControl:
    """Loads and unloads servables on a running master."""

    def __init__(
        self,
        processes: WorkerProcesses,
        registry: WorkerRegistry,
        grace: Callable[[], float],
        close_channels: Callable[[object], None],
    ):
        self.processes = processes
        self.registry = registry
        self.grace = grace
        self.close_channels = close_channels
        self._lock = threading.Lock()
        # set by the server: (servable name, version, device plans of running workers) -> worker plans; raises
        # FileNotFoundError for an unknown servable and another error for a malformed one
        self.plans_for: Callable[[str, int], list[WorkerPlan]] | None = None

    def load_by_name(self, name: str, version: int = 0):
        """Loads servable `name` of the server's servable directory (version 0: the newest)."""
        check_servable_name(name)
        if self.plans_for is None:
            raise errors.InvalidInputs("model control is not enabled: the server has no servable directory")
        try:
            plans = self.plans_for(name, version)
        except FileNotFoundError as err:
            raise errors.ServableUnavailable(f"failed to load '{name}': {err}") from None
        except (RuntimeError, ValueError, OSError) as err:
            raise errors.InvalidInputs(f"failed to load '{name}': {err}") from None
        self.load(plans)

    def load(self, plans: list[WorkerPlan]):
        """Starts the plans' workers; once all registered, the workers they replace drain and stop.

        Raises InvalidInputs with the reason when a worker fails to start; what served before still does."""
        if not plans:
            return
        with self._lock:
            running = {w.plan.key: w for w in self.processes.of_servable(plans[0].servable_name)}
            replaced = []
            for plan in plans:
                while plan.key in running:  # a reload: a second worker beside the serving one, under a new key
                    plan.generation += 1
                replaced.extend(w for key, w in running.items() if _same_slot(w.plan, plan) and key != plan.key)
            try:
                self.processes.load(plans)
            except RuntimeError as err:
                raise errors.InvalidInputs(f"failed to load servable {plans[0].servable_name}: {err}") from None
            log.info(
                f"loaded servable {plans[0].servable_name} version {plans[0].version_number} "
                f"({', '.join(plan.key for plan in plans)})"
            )
            self._retire([w.plan.key for w in replaced])

    def unload(self, name: str, version: int = 0):
        """Drains and stops the workers of servable `name` (`version`; 0: every version).

        Raises InvalidInputs when none is loaded."""
        with self._lock:
            keys = [
                w.plan.key for w in self.processes.of_servable(name) if version == 0 or w.plan.version_number == version
            ]
            if not keys:
                what = f"servable {name}" + (f" version {version}" if version else "")
                raise errors.InvalidInputs(f"failed to unload {what}: it is not loaded")
            self._retire(keys)
            log.info(f"unloaded servable {name}" + (f" version {version}" if version else ""))

    def _retire(self, keys: list[str]):
        workers = self.processes.detach(keys)
        records = [r for r in (self.registry.remove(w.plan.key) for w in workers) if r is not None]
        deadline = time.monotonic() + self.grace()
        idle_twice = 0
        while records and time.monotonic() < deadline:
            # seen idle twice in a row: a request that picked it just before it left the registry is counted too
            idle_twice = idle_twice + 1 if all(r.outstanding <= 0 for r in records) else 0
            if idle_twice >= 2:
                break
            time.sleep(DRAIN_POLL)
        else:
            busy = [r.key for r in records if r.outstanding > 0]
            if busy:
                log.warning(f"workers {', '.join(busy)} still had requests when the grace period ended")
        for worker in workers:
            self.processes.terminate(worker, EXIT_GRACE)
        for record in records:
            self.close_channels(record)


def _same_slot(old: WorkerPlan, new: WorkerPlan) -> bool:
    return (old.servable_name, old.version_number, old.slot) == (new.servable_name, new.version_number, new.slot)
