"""Binding a process's threads to CPU cores (agents and the benchmarks' in-process engines)."""
import os
from typing import Optional, Sequence


def bind_threads(cpus) -> None:
    """Binds every thread of this process to the cores `cpus` (threads started later inherit it)."""
    for thread_id in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread_id), cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def bind_process(cpus: Optional[Sequence[int]]) -> Optional[Sequence[int]]:
    """`bind_threads(cpus)` unless `cpus` is None (no binding); returns `cpus`."""
    if cpus is not None:
        bind_threads(cpus)
    return cpus
