"""How many threads MindSpore's CPU kernels use in a worker, chosen deliberately rather than left to MindSpore's
default of 25 (whatever the machine).

A servable sets it with `register.Context(thread_num=n)` on a declared model (MindSpore Serving's inference
thread count; with several models the largest applies: MindSpore has one CPU kernel pool per process, set once).
Otherwise it is the number of cores this worker may run on (its CPU affinity). Only on CPU.
"""
import os
from typing import Iterable, Optional, Tuple

from mindspore_serving import log


def declared_thread_num(model_specs: Iterable) -> Optional[int]:
    """The largest `thread_num` of the models' contexts, or None when no model sets one."""
    found = [spec.context.model_context.thread_num for spec in model_specs
             if spec.context is not None and (getattr(spec.context.model_context, "thread_num", 0) or 0) > 0]
    return max(found) if found else None  # an unset thread_num is -1


def allowed_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def choose_cpu_threads(model_specs: Iterable) -> Tuple[int, str]:
    """(thread count, where it comes from)."""
    declared = declared_thread_num(model_specs)
    if declared is not None:
        return declared, "register.Context(thread_num)"
    return allowed_cores(), "the cores this worker may use"


def apply_cpu_threads(model_specs: Iterable, servable_name: str):
    """Sets MindSpore's CPU kernel threads for this process (once; MindSpore refuses a second setting)."""
    import mindspore as ms  # lazy: only a worker that loads models on CPU gets here
    count, source = choose_cpu_threads(model_specs)
    try:
        ms.device_context.cpu.op_tuning.threads_num(count)
    except RuntimeError as err:  # already set in this process (e.g. a test that loads several servables)
        log.info(f"servable {servable_name}: MindSpore CPU kernel threads left as they are: {err}")
        return
    log.info(f"servable {servable_name}: MindSpore CPU kernel threads {count} ({source})")
