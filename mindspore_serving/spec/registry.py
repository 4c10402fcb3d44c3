"""The process-wide record of what servable_config.py files declared.

A worker imports one `servable_config.py`; the declarations land in a `ServableSpec` keyed by the
servable name, which is the name of the directory holding that file.
"""

import os
import sys
from types import FrameType

from mindspore_serving.spec.servable import ServableSpec

SERVABLE_CONFIG_FILE = "servable_config.py"

_servables: dict[str, ServableSpec] = {}
# "<servable>.<function name>" -> (inputs count, outputs count, batch_size enabled)
_stage_functions: dict[str, tuple[int, int, bool]] = {}


def get_servable_spec(name: str) -> ServableSpec | None:
    """The declarations of servable `name`, or None when its servable_config.py declared nothing."""
    return _servables.get(name)


def get_or_create_servable_spec(name: str) -> ServableSpec:
    spec = _servables.get(name)
    if spec is None:
        spec = _servables[name] = ServableSpec(name=name)
    return spec


def reset_registry() -> None:
    """Forgets every declaration (tests; a worker imports a single servable_config.py)."""
    _servables.clear()
    _stage_functions.clear()


def stage_function_info(key: str) -> tuple[int, int, bool] | None:
    return _stage_functions.get(key)


def set_stage_function_info(key: str, inputs_count: int, outputs_count: int, batch_enabled: bool) -> None:
    _stage_functions[key] = (inputs_count, outputs_count, batch_enabled)


def servable_location() -> tuple[str, str]:
    """(servable directory, servable name) of the servable_config.py found on the call stack.

    For `<servable_directory>/<servable_name>/servable_config.py` the name is `<servable_name>`.
    """
    frame: FrameType | None = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
        filename = frame.f_code.co_filename
        if os.path.basename(filename) == SERVABLE_CONFIG_FILE:
            config_dir = os.path.dirname(os.path.abspath(filename))
            name = os.path.basename(config_dir)
            if name:
                return os.path.dirname(config_dir), name
        frame = frame.f_back
    raise RuntimeError("Failed to obtain the directory of servable_config.py")
