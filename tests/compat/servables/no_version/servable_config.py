"""A model declared while the servable has no version folder: refused at start."""

from mindspore_serving.server import register

tensor_add = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


@register.register_method(output_names=["y"])
def add_common(x1, x2):
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    return y
