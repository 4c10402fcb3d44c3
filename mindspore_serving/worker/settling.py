"""Settling: before it registers (after its warm-up), a worker runs each graph it runs on CPU on zeros, so that
MindSpore makes its lasting choices while nothing else runs in the worker.

MindSpore makes two choices by timing a graph's first calls, and keeps them for the process's life. Its CPU
kernels try splitting their work over 1, 2, 4... threads for 5 calls each and keep the fastest; its graph
scheduler times calls 31-40 on its actor threads and 41-50 in the calling thread and keeps the faster. Timed
during the first requests, under load, those choices are a draw: of 18 `add` workers started under 64 clients, 4
split a 4-element add over two threads and spent 110-170 us of CPU per request (the caller spinning in
`sched_yield` for its partner) instead of 45-60. So the worker makes those calls itself: SETTLE_CALLS per graph,
at most SETTLE_SECONDS each (a graph slow enough to hit that bound has work enough that the choices are clear).

Settling while another process is busy (an `add` worker started beside a `dense_batch` worker that settles its
own graph) still drew the slow choice for 2 of 6 workers. So a small graph (a call under SMALL_GRAPH_S) is then
checked: when MindSpore's own threads work during its calls (more than SPLIT_US_PER_CALL of their CPU per call;
a small graph run in the calling thread leaves them idle), it is loaded afresh, which makes new kernels that
choose again, and settled again, up to SETTLE_ATTEMPTS times. With the check, 0 of 22 such workers ended split.
"""

import math
import os
import time

from mindspore_serving import log
from mindspore_serving.worker.model_backend import LoadedModel

SETTLE_CALLS = 50  # MindSpore's last timed call is its graph scheduler's 50th execution
SETTLE_SECONDS = 2.0
SETTLE_ATTEMPTS = 3
SMALL_GRAPH_S = 0.001
SPLIT_US_PER_CALL = 2.0
CHECK_CALLS = 50
HELPER_THREADS = ("KernelThread", "ActorThread")  # MindSpore's CPU kernel and actor threads, by their names


def settle_graphs(models: dict[str, LoadedModel]):
    """Runs each graph that this worker runs on CPU on zeros, SETTLE_CALLS times or for SETTLE_SECONDS, so that
    MindSpore times its choices while nothing else runs in this worker; a small graph whose kernels then run split
    over MindSpore's threads is loaded afresh and settled again (see the module docstring). Models whose inputs
    are not static are left as they are, and so are models run elsewhere (an extra worker's, a distributed
    servable's)."""
    for key, model in models.items():
        if not isinstance(model, LoadedModel) or model.device_target != "CPU":
            continue
        for index, graph in enumerate(model.subgraphs):
            try:
                _settle_graph(f"model {key} graph {index}", graph)
            except Exception as err:  # it ran on zeros at load; a failure here only costs the settling
                log.warning(f"model {key} graph {index} was not settled: {err}")


def _settle_graph(name: str, graph):
    for attempt in range(1, SETTLE_ATTEMPTS + 1):
        started = time.perf_counter()
        calls = graph.run_on_zeros(SETTLE_CALLS, SETTLE_SECONDS)
        if not calls:
            return  # dynamic shapes: nothing to run
        took = time.perf_counter() - started
        # only a small graph is checked: the check's calls would lengthen a large one's start-up for nothing
        split = split_cpu_per_call(graph) if took / calls < SMALL_GRAPH_S else None
        if split is None or split <= SPLIT_US_PER_CALL:
            log.info(f"{name} settled: {calls} calls on zeros in {took * 1000:.1f} ms")
            return
        if attempt == SETTLE_ATTEMPTS:
            log.warning(
                f"{name}: MindSpore still runs its kernels split over its threads ({split:.0f} us of their "
                f"CPU per call) after {attempt} settlings; register.Context(thread_num=1) keeps a small "
                f"model in the calling thread"
            )
            return
        log.info(
            f"{name}: MindSpore chose to split its kernels over its threads ({split:.0f} us of their CPU per "
            f"call); loaded afresh to settle again"
        )
        graph.reload()


def split_cpu_per_call(graph) -> float | None:
    """For a small graph (a call under SMALL_GRAPH_S): the CPU (us) MindSpore's own threads use per call of it, over
    CHECK_CALLS calls on zeros. None for a larger graph, or where /proc cannot tell."""
    before = helper_cpu_ns()
    if before is None:
        return None
    started = time.perf_counter()
    calls = graph.run_on_zeros(CHECK_CALLS, math.inf)
    per_call = (time.perf_counter() - started) / max(calls, 1)
    after = helper_cpu_ns()
    if not calls or after is None or per_call >= SMALL_GRAPH_S:
        return None
    return (after - before) / calls / 1000


def helper_cpu_ns() -> int | None:
    """The CPU time (ns) MindSpore's own threads in this process have used; None where /proc cannot say."""
    total = 0
    try:
        thread_ids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for thread_id in thread_ids:
        try:
            with open(f"/proc/self/task/{thread_id}/comm", encoding="utf-8") as stream:
                if not stream.read().startswith(HELPER_THREADS):
                    continue
            with open(f"/proc/self/task/{thread_id}/schedstat", encoding="utf-8") as stream:
                total += int(stream.read().split()[0])
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        except (OSError, ValueError, IndexError):
            return None
    return total
