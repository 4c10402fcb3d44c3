"""Export the bench servable's model: dense_batch.mindir, a dense stack with a batch dimension of 64.

    python bench/servables/dense_batch/export_model.py [--force]

Writes bench/servables/dense_batch/1/dense_batch.mindir (ignored by git, rebuilt when missing) and checks it by
loading it back and comparing with numpy. The weights are fixed (seeded), so every export is the same model.

Shapes: x float32 [BATCH, IN] -> Dense(IN, HIDDEN)+ReLU -> Dense(HIDDEN, HIDDEN)+ReLU -> Dense(HIDDEN, OUT).
Its cost grows slowly with the batch size (a batch of 64 costs a few times a batch of 1: the weights are read
once per call), which is what makes cross-request batching pay.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindir_export import command_line, export_checked

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_DIR = os.path.join(HERE, "1")
MODEL_NAME = "dense_batch"
MODEL_FILES = [MODEL_NAME + ".mindir"]
MODEL_PATH = os.path.join(VERSION_DIR, MODEL_FILES[0])
BATCH, IN, HIDDEN, OUT = 64, 512, 2048, 16
SEED = 20240


def _weights():
    """(weight [out, in], bias [out]) per layer, scaled so that activations stay O(1)."""
    rng = np.random.default_rng(SEED)
    dims = [IN, HIDDEN, HIDDEN, OUT]
    return [
        (
            (rng.standard_normal((d_out, d_in)) / np.sqrt(d_in)).astype(np.float32),
            (rng.standard_normal(d_out) * 0.01).astype(np.float32),
        )
        for d_in, d_out in zip(dims[:-1], dims[1:])
    ]


def numpy_forward(x: np.ndarray) -> np.ndarray:
    """The model in numpy, for checking."""
    layers = _weights()
    for index, (weight, bias) in enumerate(layers):
        x = x @ weight.T + bias
        if index < len(layers) - 1:
            x = np.maximum(x, 0)
    return x


def _build_net():
    import mindspore as ms
    from mindspore import nn

    layers = _weights()
    cells = []
    for index, (weight, bias) in enumerate(layers):
        activation = "relu" if index < len(layers) - 1 else None
        cells.append(
            nn.Dense(
                weight.shape[1],
                weight.shape[0],
                weight_init=ms.Tensor(weight),
                bias_init=ms.Tensor(bias),
                activation=activation,
            )
        )
    return nn.SequentialCell(cells)


def missing() -> bool:
    return not os.path.isfile(MODEL_PATH)


def main(force: bool = False):
    if not force and not missing():
        print(f"{MODEL_PATH}: up to date")
        return [MODEL_PATH]
    return export_checked(_build_net, numpy_forward, MODEL_PATH, (BATCH, IN), 1e-3)


if __name__ == "__main__":
    command_line(main, __doc__)
