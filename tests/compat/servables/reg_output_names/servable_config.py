"""A method whose output names repeat: refused at start."""

from mindspore_serving.server import register


def twice(x):
    return x, x


@register.register_method(output_names=["y", "y"])
def method(x):
    a, b = register.add_stage(twice, x, outputs_count=2)
    return a, b
