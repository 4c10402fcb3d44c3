"""Servable `add`: y = x1 + x2 on [2, 2] float32 tensors (tensor_add.mindir, no batch dimension)."""

import numpy as np

from mindspore_serving.server import register


def add_trans_datatype(x1, x2):
    """Python stage: cast both inputs to float32, so that e.g. int32 or float64 inputs are accepted."""
    return x1.astype(np.float32), x2.astype(np.float32)


# Warm-up before the worker counts as ready: add_common with zeros of the MindIR's [2, 2] float32 inputs,
# add_cast (whose inputs meet a Python stage first) with warmup/add_cast.json. See docs/servables.md, "Warm-up".
register.enable_warmup(generate=True)

tensor_add = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


@register.register_method(output_names=["y"])
def add_common(x1, x2):
    """Inputs x1, x2: float32 [2, 2]. Output y = x1 + x2."""
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def add_cast(x1, x2):
    """Inputs x1, x2: any numeric dtype, 4 elements. Output y = float32(x1) + float32(x2)."""
    x1, x2 = register.add_stage(add_trans_datatype, x1, x2, outputs_count=2)
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    return y
