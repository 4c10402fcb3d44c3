"""A method returning a value that is not a placeholder: refused at start."""

from mindspore_serving.server import register


def passthrough(x):
    return x


@register.register_method(output_names=["y"])
def method(x):
    register.add_stage(passthrough, x, outputs_count=1)
    return 1
