"""Exports the two benchmark models for the original MindSpore Serving with MindSpore 2.0.0 (run by
orig_ms_setup.py in a Python 3.9 venv that has it): MindSpore Lite 2.0 reads MindIR version 1 only, and MindSpore
2.10 writes version 3.

    <export venv>/bin/python bench/peers/orig_ms_export.py SERVABLES_DIR

The networks and weights are the project's own (servables/add/export_model.py and
bench/servables/dense_batch/export_model.py build them; only their MindSpore calls run here, under 2.0.0). Writes
SERVABLES_DIR/add/1/tensor_add.mindir and SERVABLES_DIR/dense_batch/1/dense_batch.mindir, each checked by loading
it back against numpy.
"""

import importlib.util
import os
import sys

import numpy as np

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(BENCH, "servables"))  # dense_batch's export_model imports mindir_export from there


def _module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # MindSpore's parser looks classes up there
    spec.loader.exec_module(module)
    return module


add = _module("add_export", os.path.join(ROOT, "servables", "add", "export_model.py"))
dense = _module("dense_export", os.path.join(BENCH, "servables", "dense_batch", "export_model.py"))


def export(net, inputs, path, expected):
    import mindspore as ms

    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.chmod(path, 0o644)
        os.remove(path)
    ms.export(net, *(ms.Tensor(x) for x in inputs), file_name=path[: -len(".mindir")], file_format="MINDIR")
    os.chmod(path, 0o644)
    graph = ms.nn.GraphCell(ms.load(path))
    got = graph(*(ms.Tensor(x) for x in inputs)).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
    print(f"exported {path}", flush=True)


def main(servables: str):
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rng = np.random.default_rng(3)
    x1, x2 = (rng.standard_normal((2, 2)).astype(np.float32) for _ in range(2))
    export(add._build_net(), [x1, x2], os.path.join(servables, "add", "1", "tensor_add.mindir"), x1 + x2)
    x = rng.standard_normal((dense.BATCH, dense.IN)).astype(np.float32)
    export(
        dense._build_net(),
        [x],
        os.path.join(servables, "dense_batch", "1", "dense_batch.mindir"),
        dense.numpy_forward(x),
    )


if __name__ == "__main__":
    main(sys.argv[1])
