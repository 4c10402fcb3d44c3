"""add_stage given a number as its stage: refused at start."""

from mindspore_serving.server import register


@register.register_method(output_names=["y"])
def method(x):
    y = register.add_stage(3, x, outputs_count=1)
    return y
