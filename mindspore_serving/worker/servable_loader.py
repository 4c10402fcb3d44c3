"""Finds, imports and loads a servable inside a worker process."""

import importlib
import os
import sys

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.ms_device import resolve_device, select_device
from mindspore_serving.spec.llm import LlmDeclaration
from mindspore_serving.spec.registry import get_servable_spec
from mindspore_serving.worker.cpu_threads import apply_cpu_affinity, apply_cpu_threads
from mindspore_serving.worker.llm.runtime import LlmRuntime
from mindspore_serving.worker.servable_runtime import ServableRuntime


def newest_version_number(servable_path: str) -> int:
    versions = [
        int(name)
        for name in os.listdir(servable_path)
        if name.isdigit() and os.path.isdir(os.path.join(servable_path, name))
    ]
    return max(versions, default=0)


def import_servable_config(servable_directory: str, servable_name: str):
    """Imports `<servable_directory>/<servable_name>/servable_config.py` and returns its declarations."""
    if servable_directory not in sys.path:
        sys.path.insert(0, servable_directory)
    try:
        importlib.import_module(f"{servable_name}.servable_config")
    except Exception as err:
        raise RuntimeError(f"import {servable_name}.servable_config failed, {err}") from err
    return get_servable_spec(servable_name)


def resolve_version(servable_directory: str, servable_name: str, version_number: int, has_models: bool) -> int:
    """The version to load (0: the newest). Declared models need a numeric version directory, the one asked for."""
    servable_path = os.path.join(servable_directory, servable_name)
    if not has_models:
        return version_number or 1
    newest = newest_version_number(servable_path)
    if newest == 0:
        raise RuntimeError(
            f"There is no valid version directory of models while there are models declared in "
            f"servable_config.py, servable directory: {servable_directory}, "
            f"servable name: {servable_name}"
        )
    version_number = version_number or newest
    if not os.path.isdir(os.path.join(servable_path, str(version_number))):
        raise errors.core_failure(
            f"Start servable failed: There is no specified version directory of models, specified "
            f"version number: {version_number}, servable directory: '{servable_directory}', "
            f"servable name: '{servable_name}'"
        )
    return version_number


def _prepare_hf_model(settings) -> str:
    """The LLM configuration of a servable declared with declare_llm(model_dir=...), its graphs exported first
    when the model cache lacks them."""
    from mindspore_serving.spec.hf_serving import HfModelError  # only servables declared with model_dir need them
    from mindspore_serving.worker.llm import hf_model  # as above

    try:
        return hf_model.prepare(settings, log=log.info).config_file
    except HfModelError as err:
        raise RuntimeError(f"Start servable {settings.served_model_name} failed: {err}") from None


def load_servable(
    servable_directory: str,
    servable_name: str,
    version_number: int,
    device_type: str | None,
    device_id: int,
    dec_key: bytes | None = None,
    dec_mode: str = "AES-GCM",
    on_fatal=None,
    socket_directory: str = "",
) -> tuple[ServableRuntime, int]:
    """The servable's runtime and its resolved version; `on_fatal(reason)` is called when an LLM servable
    loses its agents, which listen in `socket_directory` (the server's runtime directory)."""
    spec = import_servable_config(servable_directory, servable_name)
    if spec is None or not spec.methods and spec.extension is None:
        raise errors.core_failure("There is no method registered for servable")
    if isinstance(spec.extension, LlmDeclaration):
        version = version_number or 1
        device = resolve_device(device_type, servable_name)
        config_file = spec.extension.config_file or _prepare_hf_model(spec.extension.hf_model)
        return LlmRuntime(spec, config_file, device, device_id, on_fatal, socket_directory), version
    version = resolve_version(servable_directory, servable_name, version_number, bool(spec.models))
    device = resolve_device(device_type, servable_name)
    select_device(device, device_id)
    if device == "CPU":
        apply_cpu_affinity(spec.models.values(), servable_name)  # first: the thread count follows the cores
        apply_cpu_threads(spec.models.values(), servable_name)
    log.info(f"loading servable {servable_name} version {version} on {device} device {device_id}")
    version_dir = os.path.join(servable_directory, servable_name, str(version))
    runtime = ServableRuntime(spec, version_dir, dec_key, dec_mode)
    runtime.device_type = device
    return runtime, version
