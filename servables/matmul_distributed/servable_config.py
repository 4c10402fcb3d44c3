"""matmul_distributed: y = x @ w run by 2 rank agents, each holding half of w's rows (see export_model.py)."""

from mindspore_serving.server import distributed, register

model = distributed.declare_servable(rank_size=2, stage_size=1, with_batch_dim=False)


@register.register_method(output_names=["y"])
def predict(x):
    y = register.add_stage(model, x, outputs_count=1)
    return y
