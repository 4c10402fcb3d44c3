"""`add` for the original MindSpore Serving 2.0 (bench/peers/orig_ms_setup.py copies it next to the model it
exports): the project's servables/add with its add_common method, without `enable_warmup`, which the original
does not have."""

from mindspore_serving.server import register

tensor_add = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


@register.register_method(output_names=["y"])
def add_common(x1, x2):
    y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
    return y
