"""A function stage given more inputs than its function takes: refused at start."""

from mindspore_serving.server import register


def one_input(x):
    return x


@register.register_method(output_names=["y"])
def method(a, b):
    y = register.add_stage(one_input, a, b, outputs_count=1)
    return y
