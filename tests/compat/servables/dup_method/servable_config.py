"""A method registered twice: refused at start."""

from mindspore_serving.server import register


def passthrough(x):
    return x


@register.register_method(output_names=["y"])
def echo(x):
    y = register.add_stage(passthrough, x, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def echo(x):  # noqa: F811  (the registration under test)
    y = register.add_stage(passthrough, x, outputs_count=1)
    return y
