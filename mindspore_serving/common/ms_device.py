"""Choosing MindSpore's device: what this build offers, the name a servable asks for, and selecting it once per
process (tolerating a runtime that already runs on it)."""

import os
import subprocess
import sys

from mindspore_serving import log
from mindspore_serving.common.child_process import child_env

_DEVICE_NAMES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
# how MindSpore Serving names the device types in "supported device type: ..."
_SERVING_NAMES = {"Ascend": "Ascend", "GPU": "Gpu", "CPU": "Cpu"}
_PROBE_PREFIX = "#available_devices="
_ACCELERATOR_NODES = ("davinci", "nvidia", "dxg")


def select_device(target: str = "CPU", device_id: int | None = None) -> None:
    """`mindspore.set_device(target, device_id)` and GRAPH_MODE.

    MindSpore refuses set_device once its runtime has started (e.g. a test process that already ran a
    kernel); that is fine when the runtime already runs on `target`, and an error otherwise."""
    import mindspore as ms  # lazy: the master and the client never load MindSpore

    try:
        ms.set_device(target, None if target == "CPU" else device_id)
    except RuntimeError:
        if ms.get_context("device_target") != target:
            raise
    ms.set_context(mode=ms.GRAPH_MODE)


def available_devices() -> list[str]:
    """Device types this MindSpore build can use, best first."""
    import mindspore as ms  # lazy: the master and the client never load MindSpore

    found = []
    for name in ("Ascend", "GPU"):
        try:
            if ms.hal.is_available(name):
                found.append(name)
        except Exception as err:  # a build without the backend library raises instead of answering
            log.debug(f"device {name} is not available: {err}")
    found.append("CPU")
    return found


_probed: list[str] | None = None


def accelerator_nodes(dev: str = "/dev") -> list[str]:
    """The device files an Ascend or GPU driver creates (davinci*, nvidia*, WSL's dxg) found in `dev`: without
    any, MindSpore has only the CPU."""
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    return sorted(name for name in names if name.startswith(_ACCELERATOR_NODES))


def probe_available_devices() -> list[str]:
    """`available_devices()` answered by a child process, once per process: the master never loads MindSpore.
    Where no accelerator's device file exists the answer is the CPU alone, without the child (a MindSpore import
    of seconds)."""
    global _probed
    if _probed is None and not accelerator_nodes():
        _probed = ["CPU"]
    if _probed is None:
        code = (
            "from mindspore_serving.common.ms_device import available_devices; "
            f"print({_PROBE_PREFIX!r} + ','.join(available_devices()) + '#')"
        )
        try:
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=300, check=False
            )
            output = done.stdout
        except (OSError, subprocess.SubprocessError) as err:
            log.error(f"cannot ask MindSpore for its devices: {err}")
            output = ""
        start = output.find(_PROBE_PREFIX)
        if start < 0:
            raise RuntimeError("Failed to get device type")
        start += len(_PROBE_PREFIX)
        _probed = output[start : output.find("#", start)].split(",")
    return list(_probed)


def supported_device_text(available: list[str]) -> str:
    """MindSpore Serving's "None or 'Cpu'" / "None, 'Gpu' or 'Cpu'" for the device types of `available`."""
    default = _SERVING_NAMES[available[0]]
    if "CPU" in available and default != "Cpu":
        return f"None, '{default}' or 'Cpu'"
    return f"None or '{default}'"


def check_device_type(device_type: str | None, servable_name: str, available: list[str]) -> None:
    """Raises MindSpore Serving's error when `device_type` ('ascend', 'gpu', 'cpu' or 'none') is not in
    `available`."""
    if device_type is None or device_type.lower() == "none":
        return
    name = _DEVICE_NAMES.get(device_type.lower())
    if name is None or name not in available:
        raise RuntimeError(
            f"The device type '{device_type}' of servable name {servable_name} is inconsistent with "
            f"current running environment, supported device type: "
            f"{supported_device_text(available)}"
        )


def resolve_device(device_type: str | None, servable_name: str = "") -> str:
    """'cpu'/'gpu'/'ascend' (any case) to MindSpore's name; None or 'none' picks the best available."""
    available = available_devices()
    check_device_type(device_type, servable_name, available)
    if device_type is None or device_type.lower() == "none":
        return available[0]
    return _DEVICE_NAMES[device_type.lower()]
