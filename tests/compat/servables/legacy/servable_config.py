"""MindSpore Serving's older interface: call_preprocess, call_servable and call_postprocess in a method."""

import numpy as np

from mindspore_serving.server import register

register.declare_servable(servable_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


def cast(x1, x2):
    return x1.astype(np.float32), x2.astype(np.float32)


def double(y):
    return y * 2


@register.register_method(output_names=["y"])
def add_twice(x1, x2):
    x1, x2 = register.call_preprocess(cast, x1, x2)
    y = register.call_servable(x1, x2)
    y = register.call_postprocess(double, y)
    return y
