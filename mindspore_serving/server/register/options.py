"""Deprecated model options of MindSpore Serving 1.x; each one wraps a `Context` in `.context`."""

from mindspore_serving.server.register._deprecation import deprecated
from mindspore_serving.server.register.context import AscendDeviceInfo, Context, GPUDeviceInfo

_OPTIONS_DEPRECATED_VERSION = "1.6.0"


class AclOptions:
    """Deprecated: use `Context` with `AscendDeviceInfo`. Accepts the AscendDeviceInfo options (insert_op_cfg_path,
    input_format, input_shape, output_type, precision_mode, op_select_impl_mode, fusion_switch_config_path,
    buffer_optimize_mode), with the same errors."""

    @deprecated("mindspore_serving.server.register.AscendDeviceInfo", _OPTIONS_DEPRECATED_VERSION)
    def __init__(self, **kwargs):
        device_info = AscendDeviceInfo(**kwargs)
        self.context = Context()
        self.context.append_device_info(device_info)


class GpuOptions:
    """Deprecated: use `Context` with `GPUDeviceInfo`. Accepts precision_mode ('origin' or 'fp16'), with
    GPUDeviceInfo's errors."""

    @deprecated("mindspore_serving.server.register.GPUDeviceInfo", _OPTIONS_DEPRECATED_VERSION)
    def __init__(self, **kwargs):
        device_info = GPUDeviceInfo(**kwargs)
        self.context = Context()
        self.context.append_device_info(device_info)
