"""Bench servable `dense_batch`: a dense stack whose cost grows slowly with the batch size.

Model dense_batch.mindir (exported by export_model.py next to this file): x float32 [64, 512] ->
Dense(512, 2048) + ReLU -> Dense(2048, 2048) + ReLU -> Dense(2048, 16) -> y float32 [64, 16].
Declared with with_batch_dim=True, so one instance is x [512] -> y [16] and the worker merges up to
64 concurrent instances into one model call.
"""

from mindspore_serving.server import register

model = register.declare_model(model_file="dense_batch.mindir", model_format="MindIR", with_batch_dim=True)


@register.register_method(output_names=["y"])
def predict(x):
    """Input x: float32 [512]. Output y: float32 [16]."""
    y = register.add_stage(model, x, outputs_count=1)
    return y
