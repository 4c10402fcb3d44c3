"""Pins the MindSpore fact the step graphs' layer-by-layer calls rely on (models/llama/step_graphs.py): a
dynamic-shape graph called once per layer, each call with that layer's weights, takes the memory of one layer's
intermediate tensors, not of all of them: the memory pool reuses what a call released for the next. Measured in a
child process (a clean resident size), with 8 layers of 2048 x 2048 float32 intermediates (16 MiB each)."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("mindspore")

_CHILD = r"""
import json, sys, tempfile
import numpy as np, psutil, mindspore as ms
from mindspore import Tensor, nn, ops
ms.set_context(mode=ms.GRAPH_MODE)
LAYERS, T, H, W = int(sys.argv[1]), 2048, 256, 2048
IN_GRAPH = 1
class Layers(nn.Cell):
    def __init__(self):
        super().__init__()
        self.mm = ops.MatMul()
    def construct(self, x, *weights):
        for i in range(IN_GRAPH):
            x = x + ops.matmul(ops.relu(ops.matmul(x, weights[2 * i])), weights[2 * i + 1])
        return x
weights = [Tensor(np.full((H, W) if i % 2 == 0 else (W, H), 1e-3 * (1 + i), np.float32)) for i in range(2 * LAYERS)]
spec = [Tensor(shape=[None, H], dtype=ms.float32)] + [Tensor(shape=list(w.shape), dtype=ms.float32) for w in weights]
d = tempfile.mkdtemp()
ms.export(Layers(), *spec[: 1 + 2 * IN_GRAPH], file_name=f"{d}/g", file_format="MINDIR")
graph = nn.GraphCell(ms.load(f"{d}/g.mindir"))
graph.set_inputs(*spec[: 1 + 2 * IN_GRAPH])
x = Tensor(np.ones((4, H), np.float32))
graph(x, *weights[: 2 * IN_GRAPH]).asnumpy()  # compiled on a small shape first
before = psutil.Process().memory_info().rss
x = Tensor(np.ones((T, H), np.float32))
for call in range(LAYERS // IN_GRAPH):
    x = graph(x, *weights[2 * IN_GRAPH * call : 2 * IN_GRAPH * (call + 1)])
x.asnumpy()
print(json.dumps((psutil.Process().memory_info().rss - before) / 2**20))
"""


def growth_mib(script, layers: int) -> float:
    out = subprocess.run([sys.executable, str(script), str(layers)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_graph_called_once_per_layer_takes_one_layers_memory(tmp_path):
    script = tmp_path / "child.py"  # MindSpore compiles a cell from its source file
    script.write_text(_CHILD)
    per_call = growth_mib(script, 8)
    # one layer holds two 16 MiB tensors and two of 2 MiB; eight layers' would be ~290 MiB
    assert per_call < 3 * 36, per_call
