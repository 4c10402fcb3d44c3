"""Inference options of a declared model: `Context` and the per-device `*DeviceInfo` objects.

Example (in servable_config.py)::

    context = register.Context(thread_num=4)
    context.append_device_info(register.GPUDeviceInfo(precision_mode="fp16"))
    model = register.declare_model("tensor_add.mindir", "MindIR", context=context)

Unset numbers keep MindSpore Serving's "unset" value -1; `device_list` holds one dict of str per
appended device info, each with a "device_type" key ("cpu", "gpu" or "ascend").
"""

from dataclasses import dataclass, field

from mindspore_serving.common import check_type


@dataclass
class ModelContext:
    """The options a `Context` collected, as read by the model loader."""

    thread_num: int = -1
    thread_affinity_core_list: list[int] = field(default_factory=list)
    enable_parallel: int = -1
    device_list: list[dict[str, str]] = field(default_factory=list)

    def as_string(self) -> str:
        """The options that were set, as MindSpore Serving prints them in "Load model failed, ... model context: "
        (a map in key order, lists in brackets, no quotes), e.g. `{device infos: [{device_type: cpu}], thread num: 2}`;
        `{}` when none was set."""
        items = {}
        if self.thread_num > -1:
            items["thread num"] = str(self.thread_num)
        if self.thread_affinity_core_list:
            items["thread affinity core list"] = _as_list(self.thread_affinity_core_list)
        if self.enable_parallel > -1:
            items["enable parallel"] = str(self.enable_parallel)
        if self.device_list:
            items["device infos"] = _as_list(_as_map(info) for info in self.device_list)
        return _as_map(items)


def _as_map(items: dict[str, str]) -> str:
    return "{" + ", ".join(f"{key}: {items[key]}" for key in sorted(items)) + "}"


def _as_list(items) -> str:
    return "[" + ", ".join(str(item) for item in items) + "]"


class DeviceInfoContext:
    """Base of the device infos; `context_map` holds the options that were set plus "device_type"."""

    device_type = ""
    _label = ""  # how error texts name the device ("cpu", "gpu", "ascend")

    def __init__(self):
        self._options: dict[str, str] = {}

    def _set_options(self, kwargs, setters, unsupported_text):
        for key, value in kwargs.items():
            setter = setters.get(key)
            if setter is None:
                raise RuntimeError(f"{unsupported_text} {key}")
            setter(value)
        self.context_map = self._as_context_map()

    def _as_context_map(self) -> dict[str, str]:
        context_map = dict(self._options)
        context_map["device_type"] = self.device_type
        return context_map

    def _set_choice(self, key: str, value, choices, text: str = ""):
        """Sets option `key` to one of `choices`; `text` is MindSpore Serving's error for another value, with
        `{value}` in it (by default "<Device> device info '<key>' can only be 'a', 'b'. given '<value>'")."""
        check_type.check_str(key, value)
        if value not in choices:
            if not text:
                allowed = ", ".join(f"'{item}'" for item in choices)
                text = f"{self._label.capitalize()} device info '{key}' can only be {allowed}. given '{{value}}'"
            raise RuntimeError(text.format(value=value))
        self._options[key] = value

    def _set_text(self, key: str, value):
        self._options[key] = check_type.check_str(key, value)


class _PrecisionModeDeviceInfo(DeviceInfoContext):
    _PRECISION_MODES = ("origin", "fp16")

    def __init__(self, **kwargs):
        super().__init__()
        setters = {"precision_mode": lambda value: self._set_choice("precision_mode", value, self._PRECISION_MODES)}
        self._set_options(kwargs, setters, f"Set {self._label} device info failed, unsupported option")


class CPUDeviceInfo(_PrecisionModeDeviceInfo):
    """CPU options: precision_mode ('origin' or 'fp16')."""

    device_type = "cpu"
    _label = "cpu"


class GPUDeviceInfo(_PrecisionModeDeviceInfo):
    """GPU options: precision_mode ('origin' or 'fp16')."""

    device_type = "gpu"
    _label = "gpu"


class AscendDeviceInfo(DeviceInfoContext):
    """Ascend options: insert_op_cfg_path, input_format, input_shape, output_type, precision_mode,
    op_select_impl_mode, fusion_switch_config_path, buffer_optimize_mode."""

    device_type = "ascend"
    _label = "ascend"
    # option -> (values, MindSpore Serving's error for another value; its output_type text names
    # op_select_impl_mode, as the original does)
    _CHOICES = {
        "input_format": (
            ("ND", "NCHW", "NHWC", "CHWN", "NC1HWC0", "NHWC1C0"),
            "Ascend device info 'input_format' can only be 'ND', 'NCHW', 'NHWC', 'CHWN', 'NC1HWC0', or "
            "'NHWC1C0', actually given '{value}'",
        ),
        "output_type": (
            ("FP32", "FP16", "UINT8"),
            "Ascend device info 'op_select_impl_mode' can only be 'FP32'(default), 'FP16' or 'UINT8', "
            "actually given '{value}'",
        ),
        "precision_mode": (
            ("force_fp16", "allow_fp32_to_fp16", "must_keep_origin_dtype", "allow_mix_precision"),
            "Ascend device info 'precision_mode' can only be 'force_fp16'(default), "
            "'allow_fp32_to_fp16' 'must_keep_origin_dtype' or 'allow_mix_precision', actually given "
            "'{value}'",
        ),
        "op_select_impl_mode": (
            ("high_performance", "high_precision"),
            "Ascend device info 'op_select_impl_mode' can only be 'high_performance'(default) or "
            "'high_precision', actually given '{value}'",
        ),
        "buffer_optimize_mode": (
            ("l1_optimize", "l2_optimize", "off_optimize", "l1_and_l2_optimize"),
            "Ascend device info 'buffer_optimize_mode' can only be 'off_optimize'(default), "
            "'l1_optimize', 'l2_optimize' or 'l1_and_l2_optimize', actually given '{value}'",
        ),
    }
    _TEXTS = ("insert_op_cfg_path", "input_shape", "fusion_switch_config_path")

    def __init__(self, **kwargs):
        super().__init__()
        setters = {
            key: (lambda value, key=key, choice=choice: self._set_choice(key, value, *choice))
            for key, choice in self._CHOICES.items()
        }
        setters.update({key: (lambda value, key=key: self._set_text(key, value)) for key in self._TEXTS})
        self._set_options(kwargs, setters, "Set ascend device info failed, unsupported parameter")


class Context:
    """Options for loading one model, passed to `declare_model(..., context=...)`.

    Args:
        thread_num (int): number of inference threads, >= 1.
        thread_affinity_core_list (tuple/list of int): CPU cores (each >= 0) the threads are bound to.
        enable_parallel (bool): whether operators may run in parallel; stored as 1/0.

    Raises:
        RuntimeError: an unknown option ("Set context failed, unsupported option <k>") or a bad value.
    """

    def __init__(self, **kwargs):
        self.model_context = ModelContext()
        self.device_types: list[str] = []
        setters = {
            "thread_num": self._set_thread_num,
            "thread_affinity_core_list": self._set_thread_affinity_core_list,
            "enable_parallel": self._set_enable_parallel,
        }
        for key, value in kwargs.items():
            setter = setters.get(key)
            if setter is None:
                raise RuntimeError(f"Set context failed, unsupported option {key}")
            setter(value)

    def append_device_info(self, device_info):
        """Adds the options of one device type (CPUDeviceInfo, GPUDeviceInfo or AscendDeviceInfo)."""
        if not isinstance(device_info, DeviceInfoContext):
            raise RuntimeError(
                f"Parameter 'device_info' should instance of CPUDeviceInfo, GPUDeviceInfo, or "
                f"AscendDeviceInfo, but actually {type(device_info)}"
            )
        info_map = device_info._as_context_map()  # pylint: disable=protected-access
        device_type = info_map["device_type"]
        if device_type in self.device_types:
            raise RuntimeError(f"Device info of type {device_type} has already been appended")
        self.device_types.append(device_type)
        self.model_context.device_list.append(info_map)

    def _set_thread_num(self, value):
        self.model_context.thread_num = check_type.check_int("thread_num", value, 1)

    def _set_thread_affinity_core_list(self, value):
        self.model_context.thread_affinity_core_list = list(
            check_type.check_int_tuple_list("thread_affinity_core_list", value, 0)
        )

    def _set_enable_parallel(self, value):
        self.model_context.enable_parallel = 1 if check_type.check_bool("enable_parallel", value) else 0

    def __repr__(self):
        return f"Context({self.model_context})"
