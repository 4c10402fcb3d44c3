"""Export the py_heavy bench servable's model: py_heavy.mindir, one dense layer with a batch dimension of 8.

    python bench/servables/py_heavy/export_model.py [--force]

Writes bench/servables/py_heavy/1/py_heavy.mindir (ignored by git, rebuilt when missing) and checks it by loading
it back and comparing with numpy. The weights are fixed (seeded), so every export is the same model.

Shapes: x float32 [BATCH, IN] -> Dense(IN, OUT) -> y float32 [BATCH, OUT]. The model is cheap on purpose: the
servable's cost is its Python pre-processing (servable_config.py).
"""
import argparse
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_DIR = os.path.join(HERE, "1")
MODEL_NAME = "py_heavy"
MODEL_FILES = [MODEL_NAME + ".mindir"]
MODEL_PATH = os.path.join(VERSION_DIR, MODEL_FILES[0])
BATCH, IN, OUT = 8, 64, 16
SEED = 20241


def _weights():
    rng = np.random.default_rng(SEED)
    return ((rng.standard_normal((OUT, IN)) / np.sqrt(IN)).astype(np.float32),
            (rng.standard_normal(OUT) * 0.01).astype(np.float32))


def numpy_forward(x: np.ndarray) -> np.ndarray:
    """The model in numpy, for checking."""
    weight, bias = _weights()
    return x @ weight.T + bias


def missing() -> bool:
    return not os.path.isfile(MODEL_PATH)


def main(force: bool = False):
    if not force and not missing():
        print(f"{MODEL_PATH}: up to date")
        return [MODEL_PATH]
    import mindspore as ms
    from mindspore import nn
    from mindspore_serving.common.ms_device import select_device
    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    os.makedirs(VERSION_DIR, exist_ok=True)
    if os.path.exists(MODEL_PATH):
        os.chmod(MODEL_PATH, 0o644)
        os.remove(MODEL_PATH)
    weight, bias = _weights()
    net = nn.Dense(IN, OUT, weight_init=ms.Tensor(weight), bias_init=ms.Tensor(bias))
    ms.export(net, ms.Tensor(np.zeros((BATCH, IN), np.float32)), file_name=os.path.join(VERSION_DIR, MODEL_NAME),
              file_format="MINDIR")
    os.chmod(MODEL_PATH, 0o644)  # MindSpore writes it read-only for the owner

    graph = ms.nn.GraphCell(ms.load(MODEL_PATH))
    x = np.random.default_rng(1).standard_normal((BATCH, IN)).astype(np.float32)
    np.testing.assert_allclose(graph(ms.Tensor(x)).asnumpy(), numpy_forward(x), rtol=1e-4, atol=1e-4)
    print(f"exported {MODEL_PATH}")
    return [MODEL_PATH]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="re-export even if the file exists")
    main(parser.parse_args().force)
