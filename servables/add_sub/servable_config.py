"""Servable `add_sub`: a pipeline of two models (tensor_add.mindir, tensor_sub.mindir; [2, 2] float32, no batch
dimension) and Python stages.

* add_sub_only_model(x1, x2, x3) -> y = (x1 + x2) - x3
* add_sub_complex(x1, x2, x3)    -> y = 2 * ((x1 + 1) + x2 - x3)
"""

import numpy as np

from mindspore_serving.server import register

tensor_add = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)
tensor_sub = register.declare_model(model_file="tensor_sub.mindir", model_format="MindIR", with_batch_dim=False)


def add_one(x1):
    """Python pre-processing: x1 + 1 as float32."""
    return (x1 + 1).astype(np.float32)


def postprocess(y):
    """Python post-processing: double the result."""
    return (y * 2).astype(np.float32)


@register.register_method(output_names=["y"])
def add_sub_only_model(x1, x2, x3):
    """Inputs x1, x2, x3: float32 [2, 2]. Output y = (x1 + x2) - x3, two model stages."""
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    y = register.add_stage(tensor_sub, y, x3, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def add_sub_complex(x1, x2, x3):
    """Inputs x1, x2, x3: float32 [2, 2]. Output y = 2 * ((x1 + 1) + x2 - x3): function, model, model, function."""
    x1 = register.add_stage(add_one, x1, outputs_count=1)
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    y = register.add_stage(tensor_sub, y, x3, outputs_count=1)
    y = register.add_stage(postprocess, y, outputs_count=1)
    return y
