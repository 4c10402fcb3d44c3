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
"""

import os
import time

import numpy as np

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.restful_instances import load_json, parse_instances
from mindspore_serving.common.tensor_codec import is_error
from mindspore_serving.spec.servable import ServableSpec
from mindspore_serving.worker.signatures import input_infos

WARMUP_DIR = "warmup"
WARMUP_SUFFIX = ".json"
MAX_FILE_BYTES = 1 << 30


class WarmupError(RuntimeError):
    """A warm-up that cannot run or fails; the worker does not start."""


def read_warmup_file(path: str, spec: ServableSpec) -> list[dict]:
    """The instances of warm-up file `path` (named `<method>.json`), checked against the method's inputs."""
    method_name = os.path.basename(path)[: -len(WARMUP_SUFFIX)]
    method = spec.methods.get(method_name)
    if method is None:
        raise WarmupError(
            f"warm-up file '{path}': servable '{spec.name}' has no method '{method_name}', "
            f"its methods: {sorted(spec.methods)}"
        )
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
            raise WarmupError(
                f"warm-up file '{path}': instance {index} has inputs {sorted(instance)}, but method "
                f"'{method_name}' takes {expected}"
            )
    return instances


def read_warmup_files(servable_path: str, spec: ServableSpec) -> dict[str, list[dict]]:
    """Method name -> instances of the warm-up files in `<servable_path>/warmup` (none when it is missing)."""
    folder = os.path.join(servable_path, WARMUP_DIR)
    if not os.path.isdir(folder):
        return {}
    plan = {}
    for file_name in sorted(os.listdir(folder)):
        if file_name.endswith(WARMUP_SUFFIX):
            path = os.path.join(folder, file_name)
            plan[file_name[: -len(WARMUP_SUFFIX)]] = read_warmup_file(path, spec)
    return plan


def generated_instances(spec: ServableSpec, models, skip=()) -> dict[str, list[dict]]:
    """Method name -> one instance of zeros, for each method (not in `skip`) whose inputs all have a known static
    dtype and shape."""
    plan = {}
    for name, method in spec.methods.items():
        if name in skip:
            continue
        infos = input_infos(method, models)
        unknown = [
            input_name
            for input_name, info in zip(method.input_names, infos)
            if info is None or not all(int(dim) >= 0 for dim in info.shape)
        ]
        if unknown or not method.input_names:
            log.info(
                f"warm-up: method {name} is not warmed up with zeros: the dtype or shape of inputs {unknown} "
                f"is unknown; give it a file {WARMUP_DIR}/{name}{WARMUP_SUFFIX}"
            )
            continue
        plan[name] = [
            {
                input_name: np.zeros(tuple(int(d) for d in info.shape), info.dtype)
                for input_name, info in zip(method.input_names, infos)
            }
        ]
    return plan


def warmup_plan(servable_path: str, spec: ServableSpec, models) -> dict[str, list[dict]]:
    """Method name -> warm-up instances: the files, then (when the servable opts in) generated zeros."""
    plan = read_warmup_files(servable_path, spec)
    if spec.warmup_generate:
        plan.update(generated_instances(spec, models, skip=plan))
    return plan


def run_warmup(runtime, plan: dict[str, list[dict]]):
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
        log.info(
            f"warm-up of method {method_name}: {len(instances)} instances in "
            f"{(time.perf_counter() - started) * 1000:.1f} ms"
        )


def warm_up(runtime, servable_path: str):
    """Warms up a loaded servable; does nothing when it has no warm-up. LLM servables (declare_llm) have none."""
    if runtime.spec.extension is not None:
        if os.path.isdir(os.path.join(servable_path, WARMUP_DIR)):
            raise WarmupError(
                f"warm-up folder '{os.path.join(servable_path, WARMUP_DIR)}': warm-up is not "
                f"supported for LLM servables"
            )
        return
    plan = warmup_plan(servable_path, runtime.spec, getattr(runtime, "models", {}))
    if plan:
        run_warmup(runtime, plan)
