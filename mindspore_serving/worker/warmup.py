"""Warm-up: runs instances through a servable's methods before its worker registers with the master, so that
the first user request does not pay one-time costs (graph compilation for a new shape, first calls of Python
stages and their libraries, thread start-up).

Two sources, per method:

* a warm-up file `<servable directory>/<servable name>/warmup/<method>.json` holding `{"instances": [...]}`
  in the RESTful request format (`common.restful_instances`): always used when present;
* with `register.enable_warmup(generate=True)`, for methods without a file: one instance of zeros when every
  input's dtype and shape are known from the MindIR (`signatures.input_infos`); other methods are skipped.

Any error (a file that cannot be read, an unknown method, input names that differ from the method's, an
instance that fails) raises `WarmupError`, which fails the worker's start-up with the reason.

Then, always, every graph the worker runs on CPU is settled (`settle_graphs`): MindSpore makes two choices by
timing a graph's first calls, and keeps them for the process's life. Its CPU kernels try splitting their work over
1, 2, 4... threads for 5 calls each and keep the fastest; its graph scheduler times calls 31-40 on its actor
threads and 41-50 in the calling thread and keeps the faster. Timed during the first requests, under load, those
choices are a draw: of 18 `add` workers started under 64 clients, 4 split a 4-element add over two threads and
spent 110-170 us of CPU per request (the caller spinning in `sched_yield` for its partner) instead of 45-60. So
the worker makes those calls itself, on zeros, before it registers: SETTLE_CALLS per graph, at most
SETTLE_SECONDS each (a graph slow enough to hit that bound has work enough that the choices are clear).

Settling while another process is busy (an `add` worker started beside a `dense_batch` worker that settles its
own graph) still drew the slow choice for 2 of 6 workers (with the check below, 0 of 22). So a small graph (a call under SMALL_GRAPH_S) is then
checked: when MindSpore's own threads work during its calls (more than SPLIT_US_PER_CALL of their CPU per
call; a small graph run in the calling thread leaves them idle), it is loaded afresh, which makes new kernels
that choose again, and settled again, up to SETTLE_ATTEMPTS times.
"""
import os
import time
from typing import Dict, List, Optional

import numpy as np

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.restful_instances import load_json, parse_instances
from mindspore_serving.common.tensor_codec import is_error
from mindspore_serving.spec.servable import ServableSpec
from mindspore_serving.worker.model_backend import LoadedModel
from mindspore_serving.worker.signatures import input_infos

WARMUP_DIR = "warmup"
SETTLE_CALLS = 50  # MindSpore's last timed call is its graph scheduler's 50th execution
SETTLE_SECONDS = 2.0
SETTLE_ATTEMPTS = 3
SMALL_GRAPH_S = 0.001
SPLIT_US_PER_CALL = 2.0
CHECK_CALLS = 50
HELPER_THREADS = ("KernelThread", "ActorThread")  # MindSpore's CPU kernel and actor threads, by their names
WARMUP_SUFFIX = ".json"
MAX_FILE_BYTES = 1 << 30


class WarmupError(RuntimeError):
    """A warm-up that cannot run or fails; the worker does not start."""


def read_warmup_file(path: str, spec: ServableSpec) -> List[dict]:
    """The instances of warm-up file `path` (named `<method>.json`), checked against the method's inputs."""
    method_name = os.path.basename(path)[:-len(WARMUP_SUFFIX)]
    method = spec.methods.get(method_name)
    if method is None:
        raise WarmupError(f"warm-up file '{path}': servable '{spec.name}' has no method '{method_name}', "
                          f"its methods: {sorted(spec.methods)}")
    try:
        with open(path, "rb") as stream:
            instances = parse_instances(load_json(stream.read(), MAX_FILE_BYTES))
    except OSError as err:
        raise WarmupError(f"warm-up file '{path}': cannot be read: {err}") from None
    except errors.InvalidInputs as err:
        raise WarmupError(f"warm-up file '{path}': {err}") from None
    expected = sorted(method.input_names)
    for index, instance in enumerate(instances):
        if sorted(instance) != expected:
            raise WarmupError(f"warm-up file '{path}': instance {index} has inputs {sorted(instance)}, but method "
                              f"'{method_name}' takes {expected}")
    return instances


def read_warmup_files(servable_path: str, spec: ServableSpec) -> Dict[str, List[dict]]:
    """Method name -> instances of the warm-up files in `<servable_path>/warmup` (none when it is missing)."""
    folder = os.path.join(servable_path, WARMUP_DIR)
    if not os.path.isdir(folder):
        return {}
    plan = {}
    for file_name in sorted(os.listdir(folder)):
        if file_name.endswith(WARMUP_SUFFIX):
            path = os.path.join(folder, file_name)
            plan[file_name[:-len(WARMUP_SUFFIX)]] = read_warmup_file(path, spec)
    return plan


def generated_instances(spec: ServableSpec, models, skip=()) -> Dict[str, List[dict]]:
    """Method name -> one instance of zeros, for each method (not in `skip`) whose inputs all have a known static
    dtype and shape."""
    plan = {}
    for name, method in spec.methods.items():
        if name in skip:
            continue
        infos = input_infos(method, models)
        unknown = [input_name for input_name, info in zip(method.input_names, infos)
                   if info is None or not all(int(dim) >= 0 for dim in info.shape)]
        if unknown or not method.input_names:
            log.info(f"warm-up: method {name} is not warmed up with zeros: the dtype or shape of inputs {unknown} "
                     f"is unknown; give it a file {WARMUP_DIR}/{name}{WARMUP_SUFFIX}")
            continue
        plan[name] = [{input_name: np.zeros(tuple(int(d) for d in info.shape), info.dtype)
                       for input_name, info in zip(method.input_names, infos)}]
    return plan


def warmup_plan(servable_path: str, spec: ServableSpec, models) -> Dict[str, List[dict]]:
    """Method name -> warm-up instances: the files, then (when the servable opts in) generated zeros."""
    plan = read_warmup_files(servable_path, spec)
    if spec.warmup_generate:
        plan.update(generated_instances(spec, models, skip=plan))
    return plan


def run_warmup(runtime, plan: Dict[str, List[dict]]):
    """Runs each method's instances through `runtime.predict`; logs the time per method at INFO."""
    for method_name, instances in plan.items():
        started = time.perf_counter()
        try:
            results = runtime.predict(method_name, instances)
        except Exception as err:
            raise WarmupError(f"warm-up of method '{method_name}' failed: {err}") from err
        failed = [(index, result) for index, result in enumerate(results) if is_error(result)]
        if failed:
            index, result = failed[0]
            raise WarmupError(f"warm-up of method '{method_name}' failed, instance {index}: {result}")
        log.info(f"warm-up of method {method_name}: {len(instances)} instances in "
                 f"{(time.perf_counter() - started) * 1000:.1f} ms")


def warm_up(runtime, servable_path: str):
    """Warms up a loaded servable; does nothing when it has no warm-up. LLM servables (declare_llm) have none."""
    if runtime.spec.extension is not None:
        if os.path.isdir(os.path.join(servable_path, WARMUP_DIR)):
            raise WarmupError(f"warm-up folder '{os.path.join(servable_path, WARMUP_DIR)}': warm-up is not "
                              f"supported for LLM servables")
        return
    plan = warmup_plan(servable_path, runtime.spec, getattr(runtime, "models", {}))
    if plan:
        run_warmup(runtime, plan)
    settle_graphs(getattr(runtime, "models", {}))


def settle_graphs(models: Dict[str, LoadedModel]):
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
        calls = graph.settle(SETTLE_CALLS, SETTLE_SECONDS)
        if not calls:
            return  # dynamic shapes: nothing to run
        split = split_cpu_per_call(graph)
        took = (time.perf_counter() - started) * 1000
        if split is None or split <= SPLIT_US_PER_CALL:
            log.info(f"{name} settled: {calls} calls on zeros in {took:.1f} ms")
            return
        if attempt == SETTLE_ATTEMPTS:
            log.warning(f"{name}: MindSpore still runs its kernels split over its threads ({split:.0f} us of their "
                        f"CPU per call) after {attempt} settlings; register.Context(thread_num=1) keeps a small "
                        f"model in the calling thread")
            return
        log.info(f"{name}: MindSpore chose to split its kernels over its threads ({split:.0f} us of their CPU per "
                 f"call); loaded afresh to settle again")
        graph.reload()


def split_cpu_per_call(graph) -> Optional[float]:
    """For a small graph (a call under SMALL_GRAPH_S): the CPU (us) MindSpore's own threads use per call of it, over
    CHECK_CALLS calls on zeros. None for a larger graph, or where /proc cannot tell."""
    zeros = graph.zeros()
    before = helper_cpu_ns()
    if zeros is None or before is None:
        return None
    started = time.perf_counter()
    for _ in range(CHECK_CALLS):
        graph.run(zeros)
    per_call = (time.perf_counter() - started) / CHECK_CALLS
    after = helper_cpu_ns()
    if after is None or per_call >= SMALL_GRAPH_S:
        return None
    return (after - before) / CHECK_CALLS / 1000


def helper_cpu_ns() -> Optional[int]:
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
