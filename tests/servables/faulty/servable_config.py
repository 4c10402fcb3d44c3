"""A servable without models whose Python stages fail in controlled ways (for error-path tests)."""

import numpy as np

from mindspore_serving.server import register


def check_positive(x):
    if float(np.min(x)) < 0:
        raise ValueError("negative input")
    return x * 2


def two_outputs_wrongly(x):
    return x, x, x  # declared with outputs_count=2


def batch_square(instances):
    results = []
    for (x,) in instances:
        if float(np.min(x)) < 0:
            raise ValueError("negative input in batch")
        results.append(x * x)
    return results


@register.register_method(output_names=["y"])
def double_positive(x):
    y = register.add_stage(check_positive, x, outputs_count=1)
    return y


@register.register_method(output_names=["y", "z"])
def wrong_count(x):
    y, z = register.add_stage(two_outputs_wrongly, x, outputs_count=2)
    return y, z


@register.register_method(output_names=["y"])
def square_batch(x):
    y = register.add_stage(batch_square, x, outputs_count=1, batch_size=4)
    return y


@register.register_method(output_names=["text", "data"])
def echo(text, data):
    return text, data
