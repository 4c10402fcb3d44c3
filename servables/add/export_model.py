"""Export the `add` servable's model: tensor_add.mindir, y = x1 + x2 on [2, 2] float32.

Run from anywhere: ``python servables/add/export_model.py``. The MindIR is written to
``servables/add/1/tensor_add.mindir`` and checked by loading it back.
"""

import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = ["tensor_add.mindir"]


def _set_context():
    import mindspore as ms

    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)


def _build_net():
    import mindspore.nn as nn
    import mindspore.ops as ops

    class Net(nn.Cell):
        """y = x1 + x2"""

        def __init__(self):
            super().__init__()
            self.add = ops.Add()

        def construct(self, x1, x2):
            return self.add(x1, x2)

    return Net()


def main():
    import mindspore as ms

    _set_context()
    os.makedirs(VERSION_DIR, exist_ok=True)
    x1 = np.ones([2, 2], np.float32)
    x2 = np.ones([2, 2], np.float32)
    base = os.path.join(VERSION_DIR, "tensor_add")
    ms.export(_build_net(), ms.Tensor(x1), ms.Tensor(x2), file_name=base, file_format="MINDIR")
    path = base + ".mindir"
    os.chmod(path, 0o644)  # MindSpore writes it read-only for the owner

    # verify: load the file back and compare with numpy
    net = ms.nn.GraphCell(ms.load(path))
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    b = np.array([[1.5, -2.0], [10.0, 0.25]], np.float32)
    y = net(ms.Tensor(a), ms.Tensor(b)).asnumpy()
    np.testing.assert_allclose(y, a + b, rtol=1e-6)
    print(f"exported {path}")
    return [path]


if __name__ == "__main__":
    main()
