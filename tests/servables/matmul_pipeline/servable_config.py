"""matmul_distributed's product as a 2-stage pipeline on 2 ranks.

Its graphs: servables/matmul_distributed/model/pipeline.
"""

from mindspore_serving.server import distributed, register

model = distributed.declare_servable(rank_size=2, stage_size=2, with_batch_dim=False)


@register.register_method(output_names=["y"])
def predict(x):
    y = register.add_stage(model, x, outputs_count=1)
    return y
