"""Choosing MindSpore's device: what this build offers, the name a servable asks for, and selecting it once per
process (tolerating a runtime that already runs on it)."""
from typing import List, Optional

from mindspore_serving import log

_DEVICE_NAMES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}


def select_device(target: str = "CPU", device_id=None):
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


def available_devices() -> List[str]:
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


def resolve_device(device_type: Optional[str], servable_name: str = "") -> str:
    """'cpu'/'gpu'/'ascend' (any case) to MindSpore's name; None or 'none' picks the best available."""
    available = available_devices()
    if device_type is None or device_type.lower() == "none":
        return available[0]
    name = _DEVICE_NAMES.get(device_type.lower())
    if name is None or name not in available:
        raise RuntimeError(f"The device type '{device_type}' of servable name {servable_name} is inconsistent with "
                           f"current running environment, supported device type: {available}")
    return name
