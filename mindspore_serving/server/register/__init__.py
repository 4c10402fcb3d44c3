"""Declarations used in `servable_config.py`: models, methods and their stages.

A servable directory holds `<servable_name>/servable_config.py`, imported by the workers only::

    from mindspore_serving.server import register

    model = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR")

    @register.register_method(output_names=["y"])
    def add_common(x1, x2):
        y = register.add_stage(model, x1, x2, outputs_count=1)
        return y
"""

from mindspore_serving.server.register.context import AscendDeviceInfo, Context, CPUDeviceInfo, GPUDeviceInfo
from mindspore_serving.server.register.deprecated import (
    AclOptions,
    GpuOptions,
    call_postprocess,
    call_postprocess_pipeline,
    call_preprocess,
    call_preprocess_pipeline,
    call_servable,
    declare_servable,
)
from mindspore_serving.server.register.llm import declare_llm
from mindspore_serving.server.register.method import add_stage, register_method
from mindspore_serving.server.register.model import Model, declare_model
from mindspore_serving.server.register.warmup import enable_warmup

__all__ = [
    "declare_model",
    "declare_llm",
    "Model",
    "Context",
    "CPUDeviceInfo",
    "GPUDeviceInfo",
    "AscendDeviceInfo",
    "register_method",
    "add_stage",
    "enable_warmup",
    "declare_servable",
    "call_preprocess",
    "call_preprocess_pipeline",
    "call_servable",
    "call_postprocess",
    "call_postprocess_pipeline",
    "AclOptions",
    "GpuOptions",
]
