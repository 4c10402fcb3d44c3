"""A model stage given three inputs for a model of two: refused when the model loads."""

from mindspore_serving.server import register

tensor_add = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


@register.register_method(output_names=["y"])
def method(x1, x2, x3):
    y = register.add_stage(tensor_add, x1, x2, x3, outputs_count=1)
    return y
