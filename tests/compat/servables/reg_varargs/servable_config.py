"""A method taking *args: refused at start."""

from mindspore_serving.server import register


def passthrough(x):
    return x


@register.register_method(output_names=["y"])
def method(*xs):
    y = register.add_stage(passthrough, xs[0], outputs_count=1)
    return y
