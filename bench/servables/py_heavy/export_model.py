"""Export the py_heavy bench servable's model: py_heavy.mindir, one dense layer with a batch dimension of 8.

    python bench/servables/py_heavy/export_model.py [--force]

Writes bench/servables/py_heavy/1/py_heavy.mindir (ignored by git, rebuilt when missing) and checks it by loading
it back and comparing with numpy. The weights are fixed (seeded), so every export is the same model.

Shapes: x float32 [BATCH, IN] -> Dense(IN, OUT) -> y float32 [BATCH, OUT]. The model is cheap on purpose: the
servable's cost is its Python pre-processing (servable_config.py).
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindir_export import command_line, export_checked

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_DIR = os.path.join(HERE, "1")
MODEL_NAME = "py_heavy"
MODEL_FILES = [MODEL_NAME + ".mindir"]
MODEL_PATH = os.path.join(VERSION_DIR, MODEL_FILES[0])
BATCH, IN, OUT = 8, 64, 16
SEED = 20241


def _weights():
    rng = np.random.default_rng(SEED)
    return (
        (rng.standard_normal((OUT, IN)) / np.sqrt(IN)).astype(np.float32),
        (rng.standard_normal(OUT) * 0.01).astype(np.float32),
    )


def numpy_forward(x: np.ndarray) -> np.ndarray:
    """The model in numpy, for checking."""
    weight, bias = _weights()
    return x @ weight.T + bias


def missing() -> bool:
    return not os.path.isfile(MODEL_PATH)


def _build_net():
    import mindspore as ms
    from mindspore import nn

    weight, bias = _weights()
    return nn.Dense(IN, OUT, weight_init=ms.Tensor(weight), bias_init=ms.Tensor(bias))


def main(force: bool = False):
    if not force and not missing():
        print(f"{MODEL_PATH}: up to date")
        return [MODEL_PATH]
    return export_checked(_build_net, numpy_forward, MODEL_PATH, (BATCH, IN), 1e-4)


if __name__ == "__main__":
    command_line(main, __doc__)
