"""`add` for the comparison: the model y = x1 + x2 on [2, 2] float32 (tensor_add.mindir, no batch dimension) with
MindSpore Serving's example methods, and Python-stage methods: values passed through, a stage that raises for
some instances, and stages given `batch_size`. Written in MindSpore Serving's API only (it runs in both)."""

import numpy as np

from mindspore_serving.server import register

tensor_add = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


def cast_float32(x1, x2):
    return x1.astype(np.float32), x2.astype(np.float32)


def passthrough(x):
    return x


def fail_when_negative(x):
    if np.any(np.asarray(x) < 0):
        raise ValueError("negative input")
    return x


def double_each(instances):
    results = []
    for instance in instances:
        results.append(instance[0] * 2)
    return results


def sum_and_diff(instances):
    return [(instance[0] + instance[1], instance[0] - instance[1]) for instance in instances]


def python_scalars(x):
    return 3, 2.5, True, "text", b"bytes"


@register.register_method(output_names=["y"])
def add_common(x1, x2):
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def add_cast(x1, x2):
    x1, x2 = register.add_stage(cast_float32, x1, x2, outputs_count=2)
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def echo(x):
    y = register.add_stage(passthrough, x, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def checked(x):
    y = register.add_stage(fail_when_negative, x, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def checked_tagged(x):
    y = register.add_stage(fail_when_negative, x, outputs_count=1, tag="Preprocess")
    return y


@register.register_method(output_names=["y"])
def doubled(x):
    y = register.add_stage(double_each, x, outputs_count=1, batch_size=2)
    return y


@register.register_method(output_names=["s", "d"])
def sum_diff(a, b):
    s, d = register.add_stage(sum_and_diff, a, b, outputs_count=2, batch_size=0)
    return s, d


@register.register_method(output_names=["i", "f", "b", "s", "by"])
def scalars(x):
    i, f, b, s, by = register.add_stage(python_scalars, x, outputs_count=5)
    return i, f, b, s, by
