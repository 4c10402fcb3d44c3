"""Bench servable `py_heavy`: Python pre-processing worth about 5 ms of pure Python per instance, then a cheap
model (py_heavy.mindir, exported by export_model.py next to this file: Dense(64, 16), batch dimension 8).

Method predict(x float32 [64]) -> y float32 [16] = model(2 x). The pre-processing holds the GIL the whole time,
so one worker process serves at most about 200 instances/s whatever its threads: what extra worker processes
(num_parallel_workers) are for.
"""

import numpy as np

from mindspore_serving.server import register

ROUNDS = 115_000  # about 5 ms of pure Python on the 2-core bench machine (40-45 ns a round)

model = register.declare_model(model_file="py_heavy.mindir", model_format="MindIR", with_batch_dim=True)


def preprocess(x):
    """Pure-Python work (a running hash that never touches numpy), then the input doubled."""
    state = 0
    for i in range(ROUNDS):
        state = (state * 31 + i) % 1000003
    return x * np.float32(2) + np.float32(state * 0)


@register.register_method(output_names=["y"])
def predict(x):
    """Input x: float32 [64]. Output y: float32 [16]."""
    features = register.add_stage(preprocess, x, outputs_count=1)
    y = register.add_stage(model, features, outputs_count=1)
    return y
