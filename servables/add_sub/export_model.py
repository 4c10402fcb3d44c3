"""Export the `add_sub` servable's models on [2, 2] float32 tensors:

* tensor_add.mindir: y = x1 + x2
* tensor_sub.mindir: y = x1 - x2

Run from anywhere: ``python servables/add_sub/export_model.py``. The MindIR files are written to
``servables/add_sub/1/`` and checked by loading them back.
"""

import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = ["tensor_add.mindir", "tensor_sub.mindir"]


def _set_context():
    import mindspore as ms

    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)


def _build_nets():
    import mindspore.nn as nn
    import mindspore.ops as ops

    class AddNet(nn.Cell):
        """y = x1 + x2"""

        def __init__(self):
            super().__init__()
            self.add = ops.Add()

        def construct(self, x1, x2):
            return self.add(x1, x2)

    class SubNet(nn.Cell):
        """y = x1 - x2"""

        def __init__(self):
            super().__init__()
            self.sub = ops.Sub()

        def construct(self, x1, x2):
            return self.sub(x1, x2)

    return AddNet(), SubNet()


def main():
    import mindspore as ms

    _set_context()
    os.makedirs(VERSION_DIR, exist_ok=True)
    add_net, sub_net = _build_nets()
    dummy = ms.Tensor(np.ones([2, 2], np.float32))
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    b = np.array([[1.5, -2.0], [10.0, 0.25]], np.float32)
    paths = []
    for net, stem, expected in ((add_net, "tensor_add", a + b), (sub_net, "tensor_sub", a - b)):
        base = os.path.join(VERSION_DIR, stem)
        ms.export(net, dummy, dummy, file_name=base, file_format="MINDIR")
        path = base + ".mindir"
        os.chmod(path, 0o644)  # MindSpore writes it read-only for the owner
        # verify: load the file back and compare with numpy
        loaded = ms.nn.GraphCell(ms.load(path))
        y = loaded(ms.Tensor(a), ms.Tensor(b)).asnumpy()
        np.testing.assert_allclose(y, expected, rtol=1e-6)
        print(f"exported {path}")
        paths.append(path)
    return paths


if __name__ == "__main__":
    main()
