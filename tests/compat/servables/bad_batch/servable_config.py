"""One Python function in two add_stage calls, once with batch_size and once without: refused at start."""

from mindspore_serving.server import register


def double_each(instances):
    return [instance[0] * 2 for instance in instances]


@register.register_method(output_names=["y"])
def first(x):
    y = register.add_stage(double_each, x, outputs_count=1, batch_size=2)
    return y


@register.register_method(output_names=["y"])
def second(x):
    y = register.add_stage(double_each, x, outputs_count=1)
    return y
