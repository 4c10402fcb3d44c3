"""Export the `lenet` servable's model: lenet.mindir, built from the bundled checkpoint lenet_digits.ckpt.

Input float32 [2, 1, 32, 32] (batch size 2, normalised grayscale digits) -> logits float32 [2, 10].
If the checkpoint is missing, train_lenet.py is run first. The export is verified by loading the MindIR back and
comparing it with the network it came from, and with a numpy re-implementation of the network.
Run from anywhere: ``python servables/lenet/export_model.py``.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = ["lenet.mindir"]
CKPT_FILE = os.path.join(HERE, "lenet_digits.ckpt")
BATCH_SIZE = 2


def _set_context():
    import mindspore as ms

    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)


def numpy_lenet(params, x):
    """Reference forward pass in numpy from the checkpoint parameters (a dict name -> array)."""

    def conv(x, w, b):  # valid 2-D convolution, stride 1
        k = w.shape[-1]
        n, c, h, width = x.shape
        out_h, out_w = h - k + 1, width - k + 1
        cols = np.stack([x[:, :, i : i + out_h, j : j + out_w] for i in range(k) for j in range(k)], axis=2)
        cols = cols.reshape(n, c, k, k, out_h, out_w)
        return np.einsum("nckloq,fckl->nfoq", cols, w) + b.reshape(1, -1, 1, 1)

    def pool(x):
        n, c, h, w = x.shape
        return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))

    def relu(x):
        return np.maximum(x, 0)

    x = pool(relu(conv(x, params["conv1.weight"], params.get("conv1.bias", np.zeros(6, np.float32)))))
    x = pool(relu(conv(x, params["conv2.weight"], params.get("conv2.bias", np.zeros(16, np.float32)))))
    x = x.reshape(x.shape[0], -1)
    x = relu(x @ params["fc1.weight"].T + params["fc1.bias"])
    x = relu(x @ params["fc2.weight"].T + params["fc2.bias"])
    return x @ params["fc3.weight"].T + params["fc3.bias"]


def main():
    import mindspore as ms

    _set_context()
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    if not os.path.exists(CKPT_FILE):
        import train_lenet

        train_lenet.main()
    from lenet_net import LeNet5

    net = LeNet5()
    param_dict = ms.load_checkpoint(CKPT_FILE)
    not_loaded, _ = ms.load_param_into_net(net, param_dict)
    if not_loaded:
        raise RuntimeError(f"parameters missing from {CKPT_FILE}: {not_loaded}")
    net.set_train(False)

    os.makedirs(VERSION_DIR, exist_ok=True)
    base = os.path.join(VERSION_DIR, "lenet")
    ms.export(net, ms.Tensor(np.zeros([BATCH_SIZE, 1, 32, 32], np.float32)), file_name=base, file_format="MINDIR")
    path = base + ".mindir"
    os.chmod(path, 0o644)  # MindSpore writes it read-only for the owner

    # verify: load the file back, compare with the network and with numpy
    x = np.random.default_rng(0).uniform(-1, 1, (BATCH_SIZE, 1, 32, 32)).astype(np.float32)
    y = ms.nn.GraphCell(ms.load(path))(ms.Tensor(x)).asnumpy()
    assert y.shape == (BATCH_SIZE, 10) and y.dtype == np.float32, (y.shape, y.dtype)
    np.testing.assert_allclose(y, net(ms.Tensor(x)).asnumpy(), rtol=1e-4, atol=1e-4)
    params = {name: p.asnumpy() for name, p in param_dict.items()}
    np.testing.assert_allclose(y, numpy_lenet(params, x), rtol=1e-3, atol=1e-3)
    print(f"exported {path}")
    return [path]


if __name__ == "__main__":
    main()
