"""The CPU cores a process may run on, and binding its threads to some of them (agents, workers whose models'
contexts name cores, the benchmarks' in-process engines)."""

import os
from collections.abc import Iterable, Sequence


def allowed_cpus() -> list[int]:
    """The cores this process may run on (its affinity), sorted; every core where the platform has no affinity."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def bind_threads(cpus: Iterable[int]) -> None:
    """Binds every thread of this process to the cores `cpus` (threads started later inherit it)."""
    for thread_id in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread_id), cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def bind_process(cpus: Sequence[int] | None) -> Sequence[int] | None:
    """`bind_threads(cpus)` unless `cpus` is None (no binding); returns `cpus`."""
    if cpus is not None:
        bind_threads(cpus)
    return cpus
