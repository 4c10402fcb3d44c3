"""Servable `matmul`: one model with two subgraphs (matmul_0.mindir and matmul_1.mindir, no batch dimension).

* subgraph 0: x [128, 96] float32 -> x @ w0, [128, 16] float32
* subgraph 1: x [8, 96] float32   -> x @ w1, [8, 16] float32

Method predict(x1, x2) -> (y1, y2): a single Python stage calls both subgraphs through Model.call.
"""

from mindspore_serving.server import register

model = register.declare_model(
    model_file=["matmul_0.mindir", "matmul_1.mindir"], model_format="MindIR", with_batch_dim=False
)


def process(x1, x2):
    """Python stage running the two subgraphs of the model."""
    y1 = model.call(x1, subgraph=0)
    y2 = model.call(x2, subgraph=1)
    return y1, y2


@register.register_method(output_names=["y1", "y2"])
def predict(x1, x2):
    """Inputs x1 float32 [128, 96], x2 float32 [8, 96]. Outputs y1 = x1 @ w0 [128, 16], y2 = x2 @ w1 [8, 16]."""
    y1, y2 = register.add_stage(process, x1, x2, outputs_count=2)
    return y1, y2
