"""Where and on how many threads MindSpore's CPU kernels run in a worker, chosen deliberately rather than left to
MindSpore's default of 25 threads (whatever the machine) on every core.

- Cores: `register.Context(thread_affinity_core_list=[...])` on a declared model binds the worker to those cores
  (with several models, the union). The whole process is bound: a graph call runs its kernels in the calling
  thread as well as in MindSpore's own threads. Unset: the worker runs where the master may.
- Threads: `register.Context(thread_num=n)` (MindSpore Serving's inference thread count; with several models the
  largest applies: MindSpore has one CPU kernel pool per process, set once). Otherwise the number of cores this
  worker may run on (its CPU affinity, after the binding above).

Only on CPU.
"""

from collections.abc import Iterable

from mindspore_serving import log
from mindspore_serving.common.cpu_affinity import allowed_cpus, bind_threads


def declared_thread_num(model_specs: Iterable) -> int | None:
    """The largest `thread_num` of the models' contexts, or None when no model sets one."""
    found = [
        spec.context.model_context.thread_num
        for spec in model_specs
        if spec.context is not None and (getattr(spec.context.model_context, "thread_num", 0) or 0) > 0
    ]
    return max(found) if found else None  # an unset thread_num is -1


def declared_cores(model_specs: Iterable) -> list[int] | None:
    """The cores the models' contexts bind them to (the union of their thread_affinity_core_list), sorted; None
    when no model sets one."""
    cores: set[int] = set()
    for spec in model_specs:
        if spec.context is not None:
            cores.update(getattr(spec.context.model_context, "thread_affinity_core_list", None) or ())
    return sorted(cores) if cores else None


def apply_cpu_affinity(model_specs: Iterable, servable_name: str):
    """Binds this worker's threads, those running and those to come, to the cores its models' contexts list.
    Raises RuntimeError for a core the worker may not run on (absent, or outside the cores it was started on)."""
    cores = declared_cores(model_specs)
    if cores is None:
        return
    allowed = allowed_cpus()
    missing = [core for core in cores if core not in allowed]
    if missing:
        raise RuntimeError(
            f"servable {servable_name}: thread_affinity_core_list {cores} names core(s) "
            f"{missing} this worker cannot run on (its cores: {allowed})"
        )
    bind_threads(cores)
    log.info(
        f"servable {servable_name}: worker bound to CPU core(s) {cores} (register.Context(thread_affinity_core_list))"
    )


def choose_cpu_threads(model_specs: Iterable) -> tuple[int, str]:
    """(thread count, where it comes from)."""
    declared = declared_thread_num(model_specs)
    if declared is not None:
        return declared, "register.Context(thread_num)"
    return len(allowed_cpus()), "the cores this worker may use"


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
