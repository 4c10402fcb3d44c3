"""A stage with batch_size -1: refused at start."""

from mindspore_serving.server import register


def each(instances):
    return [instance[0] for instance in instances]


@register.register_method(output_names=["y"])
def method(x):
    y = register.add_stage(each, x, outputs_count=1, batch_size=-1)
    return y
