"""Export the `matmul` servable's model: ONE model made of two subgraphs (two MindIR files).

* matmul_0.mindir (subgraph 0): y = x @ w0, x float32 [128, 96], w0 [96, 16] -> y float32 [128, 16]
* matmul_1.mindir (subgraph 1): y = x @ w1, x float32 [8, 96],   w1 [96, 16] -> y float32 [8, 16]

The weights are fixed (seeded) and also saved as ``1/weights.npz`` (arrays "w0", "w1") so that tests can compute
numpy references. Run from anywhere: ``python servables/matmul/export_model.py``.
"""

import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = ["matmul_0.mindir", "matmul_1.mindir", "weights.npz"]
WEIGHTS_FILE = os.path.join(VERSION_DIR, "weights.npz")
SEED = 20240601
IN_FEATURES, OUT_FEATURES = 96, 16
ROWS = (128, 8)  # rows of x for subgraph 0 and subgraph 1


def make_weights():
    """The two fixed weight matrices, float32 [96, 16] each."""
    rng = np.random.default_rng(SEED)
    w0 = rng.standard_normal((IN_FEATURES, OUT_FEATURES)).astype(np.float32) / np.sqrt(IN_FEATURES)
    w1 = rng.standard_normal((IN_FEATURES, OUT_FEATURES)).astype(np.float32) / np.sqrt(IN_FEATURES)
    return w0.astype(np.float32), w1.astype(np.float32)


def _set_context():
    import mindspore as ms

    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)


def _build_net(weight, name):
    import mindspore as ms
    import mindspore.nn as nn
    import mindspore.ops as ops

    class MatMulNet(nn.Cell):
        """y = x @ w with a constant weight stored in the MindIR."""

        def __init__(self):
            super().__init__()
            self.matmul = ops.MatMul()
            self.weight = ms.Parameter(ms.Tensor(weight), name=name, requires_grad=False)

        def construct(self, x):
            return self.matmul(x, self.weight)

    return MatMulNet()


def main():
    import mindspore as ms

    _set_context()
    os.makedirs(VERSION_DIR, exist_ok=True)
    weights = make_weights()
    np.savez(WEIGHTS_FILE, w0=weights[0], w1=weights[1])
    rng = np.random.default_rng(7)
    paths = []
    for index, (rows, weight) in enumerate(zip(ROWS, weights)):
        net = _build_net(weight, f"w{index}")
        base = os.path.join(VERSION_DIR, f"matmul_{index}")
        ms.export(net, ms.Tensor(np.zeros([rows, IN_FEATURES], np.float32)), file_name=base, file_format="MINDIR")
        path = base + ".mindir"
        os.chmod(path, 0o644)  # MindSpore writes it read-only for the owner
        # verify: load the file back and compare with numpy
        x = rng.standard_normal((rows, IN_FEATURES)).astype(np.float32)
        y = ms.nn.GraphCell(ms.load(path))(ms.Tensor(x)).asnumpy()
        assert y.shape == (rows, OUT_FEATURES), y.shape
        np.testing.assert_allclose(y, x @ weight, rtol=1e-4, atol=1e-4)
        print(f"exported {path}")
        paths.append(path)
    print(f"saved {WEIGHTS_FILE}")
    return paths + [WEIGHTS_FILE]


if __name__ == "__main__":
    main()
