"""Deprecated model options of MindSpore Serving 1.x; each one wraps a `Context` in `.context`."""
from mindspore_serving.server.register._deprecation import deprecated
from mindspore_serving.server.register.context import AscendDeviceInfo, Context, GPUDeviceInfo

_ACL_OPTIONS = ("insert_op_cfg_path", "input_format", "input_shape", "output_type", "precision_mode",
                "op_select_impl_mode")


class AclOptions:
    """Deprecated: use `Context` with `AscendDeviceInfo`. Accepts the AscendDeviceInfo keys of 1.x:
    insert_op_cfg_path, input_format, input_shape, output_type, precision_mode, op_select_impl_mode."""

    @deprecated("mindspore_serving.server.register.AscendDeviceInfo")
    def __init__(self, **kwargs):
        for key in kwargs:
            if key not in _ACL_OPTIONS:
                raise RuntimeError(f"Set acl option failed, unsupported option {key}")
        self.context = Context()
        self.context.append_device_info(AscendDeviceInfo(**kwargs))


class GpuOptions:
    """Deprecated: use `Context` with `GPUDeviceInfo`. Accepts precision_mode ('origin' or 'fp16')."""

    @deprecated("mindspore_serving.server.register.GPUDeviceInfo")
    def __init__(self, **kwargs):
        for key in kwargs:
            if key != "precision_mode":
                raise RuntimeError(f"Set gpu option failed, unsupported option {key}")
        self.context = Context()
        self.context.append_device_info(GPUDeviceInfo(**kwargs))
