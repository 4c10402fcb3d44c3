"""The bundled example servables (servables/add, add_sub, matmul, lenet).

* Their exported MindIR files load with mindspore.load + nn.GraphCell on CPU and match numpy.
* Their servable_config.py files, imported with a small stand-in for `mindspore_serving.server.register`, declare
  the expected models and methods, and their stages, run instance by instance on those MindIR files, give the
  documented results. (The real DSL and worker are tested elsewhere; this checks the example files themselves.)

`make test` runs servables/export_models.py first; the fixture below also exports whatever is missing.
"""

import glob
import importlib.util
import inspect
import io
import os
import re
import sys
import types

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVABLES = os.path.join(ROOT, "servables")
LENET_IMAGES = os.path.join(SERVABLES, "lenet", "images")
# the normalisation of servables/lenet/train_lenet.py and servable_config.py
LENET_MEAN, LENET_STD = 0.5, 0.5
MODEL_BATCH = {"lenet": 2}  # batch size of the models exported with a batch dimension


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # MindSpore's graph parser looks modules up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ms():
    mindspore = pytest.importorskip("mindspore")
    export_models = load_module("_test_servables_export_models", os.path.join(SERVABLES, "export_models.py"))
    export_models.main([])  # exports only what is missing
    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    return mindspore


_CELLS = {}


def graph(ms, servable, file_name):
    path = os.path.join(SERVABLES, servable, "1", file_name)
    if path not in _CELLS:
        _CELLS[path] = ms.nn.GraphCell(ms.load(path))
    return _CELLS[path]


def run(ms, cell, *inputs):
    out = cell(*[ms.Tensor(np.ascontiguousarray(x)) for x in inputs])
    if isinstance(out, (tuple, list)):
        return tuple(o.asnumpy() for o in out)
    return out.asnumpy()


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def lenet_preprocess(png_bytes):
    """Independent re-statement of the served pre-processing: grayscale, 32x32, (x / 255 - 0.5) / 0.5."""
    from PIL import Image

    img = Image.open(io.BytesIO(png_bytes)).convert("L")
    if img.size != (32, 32):
        img = img.resize((32, 32), Image.Resampling.BILINEAR)
    x = np.asarray(img, np.float32) / 255.0
    return ((x - LENET_MEAN) / LENET_STD).astype(np.float32).reshape(1, 32, 32)


def lenet_images():
    paths = sorted(glob.glob(os.path.join(LENET_IMAGES, "digit_*_*.png")))
    labels = [int(re.match(r"digit_(\d)_\d+\.png", os.path.basename(p)).group(1)) for p in paths]
    return paths, labels


# ---------------------------------------------------------------------------------------------------------------------
# MindIR files against numpy


def test_add_mindir(ms):
    rng = np.random.default_rng(1)
    x1, x2 = rand(rng, 2, 2), rand(rng, 2, 2)
    y = run(ms, graph(ms, "add", "tensor_add.mindir"), x1, x2)
    assert y.shape == (2, 2) and y.dtype == np.float32
    np.testing.assert_allclose(y, x1 + x2, rtol=1e-6)


def test_add_sub_mindirs(ms):
    rng = np.random.default_rng(2)
    x1, x2, x3 = rand(rng, 2, 2), rand(rng, 2, 2), rand(rng, 2, 2)
    added = run(ms, graph(ms, "add_sub", "tensor_add.mindir"), x1, x2)
    np.testing.assert_allclose(added, x1 + x2, rtol=1e-6)
    y = run(ms, graph(ms, "add_sub", "tensor_sub.mindir"), added, x3)
    assert y.shape == (2, 2) and y.dtype == np.float32
    np.testing.assert_allclose(y, (x1 + x2) - x3, rtol=1e-5, atol=1e-6)


def test_matmul_subgraphs(ms):
    weights = np.load(os.path.join(SERVABLES, "matmul", "1", "weights.npz"))
    w0, w1 = weights["w0"], weights["w1"]
    assert w0.shape == (96, 16) and w1.shape == (96, 16) and w0.dtype == np.float32
    exporter = load_module("_test_servables_matmul_export", os.path.join(SERVABLES, "matmul", "export_model.py"))
    np.testing.assert_array_equal(exporter.make_weights()[0], w0)  # the weights are fixed
    rng = np.random.default_rng(3)
    x1, x2 = rand(rng, 128, 96), rand(rng, 8, 96)
    y1 = run(ms, graph(ms, "matmul", "matmul_0.mindir"), x1)
    y2 = run(ms, graph(ms, "matmul", "matmul_1.mindir"), x2)
    assert y1.shape == (128, 16) and y2.shape == (8, 16) and y1.dtype == y2.dtype == np.float32
    np.testing.assert_allclose(y1, x1 @ w0, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y2, x2 @ w1, rtol=1e-4, atol=1e-4)


def test_lenet_classifies_the_bundled_digits(ms):
    paths, labels = lenet_images()
    assert len(paths) >= 10 and set(labels) == set(range(10))
    x = np.stack([lenet_preprocess(open(p, "rb").read()) for p in paths])
    cell = graph(ms, "lenet", "lenet.mindir")
    logits = []
    for i in range(0, len(x), 2):  # the model's batch size is 2; pad a last odd instance with a copy
        batch = x[i : i + 2]
        if len(batch) == 1:
            batch = np.concatenate([batch, batch])
        out = run(ms, cell, batch)
        assert out.shape == (2, 10) and out.dtype == np.float32
        logits.append(out[: len(x[i : i + 2])])
    predicted = np.concatenate(logits).argmax(axis=1)
    accuracy = float((predicted == np.array(labels)).mean())
    assert accuracy > 0.8, (accuracy, list(zip(labels, predicted)))


def test_lenet_artefacts_are_small():
    assert os.path.getsize(os.path.join(SERVABLES, "lenet", "lenet_digits.ckpt")) < 1024 * 1024
    for path in lenet_images()[0]:
        assert os.path.getsize(path) < 16 * 1024


def test_lenet_mindir_matches_numpy_forward(ms):
    exporter = load_module("_test_servables_lenet_export", os.path.join(SERVABLES, "lenet", "export_model.py"))
    params = {
        k: v.asnumpy() for k, v in ms.load_checkpoint(os.path.join(SERVABLES, "lenet", "lenet_digits.ckpt")).items()
    }
    x = np.random.default_rng(4).uniform(-1, 1, (2, 1, 32, 32)).astype(np.float32)
    y = run(ms, graph(ms, "lenet", "lenet.mindir"), x)
    np.testing.assert_allclose(y, exporter.numpy_lenet(params, x), rtol=1e-3, atol=1e-3)


def test_export_models_is_quick_when_nothing_is_missing(ms, capsys):
    export_models = load_module("_test_servables_export_models", os.path.join(SERVABLES, "export_models.py"))
    assert export_models.main([]) == {}
    assert "nothing to export" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        export_models.main(["no_such_servable"])


# ---------------------------------------------------------------------------------------------------------------------
# servable_config.py files, through a stand-in for the register DSL


class Placeholder:
    def __init__(self, stage, index):
        self.stage, self.index = stage, index


class StubModel:
    def __init__(self, servable, files, with_batch_dim, runner):
        self.servable, self.files, self.with_batch_dim, self.runner = servable, files, with_batch_dim, runner

    def call(self, *args, subgraph=0):
        return self.runner(self, subgraph, args)


class StubRegister(types.ModuleType):
    """Records declare_model / register_method / add_stage the way MindSpore Serving's DSL is used."""

    def __init__(self, servable, runner):
        super().__init__("mindspore_serving.server.register")
        self.servable, self.runner = servable, runner
        self.models, self.methods, self._stages = [], {}, None
        self.warmup_generate = False

    def enable_warmup(self, generate=True):
        self.warmup_generate = generate

    def declare_model(
        self,
        model_file,
        model_format,
        with_batch_dim=True,
        options=None,
        without_batch_dim_inputs=None,
        context=None,
        config_file=None,
    ):
        assert model_format.lower() == "mindir"
        files = list(model_file) if isinstance(model_file, (list, tuple)) else [model_file]
        model = StubModel(self.servable, files, with_batch_dim, self.runner)
        self.models.append(model)
        return model

    def register_method(self, output_names):
        names = [output_names] if isinstance(output_names, str) else list(output_names)

        def decorate(fn):
            inputs = list(inspect.signature(fn).parameters)
            self._stages = []
            result = fn(*[Placeholder(0, i) for i in range(len(inputs))])
            returns = result if isinstance(result, tuple) else (result,)
            assert len(returns) == len(names) and all(isinstance(r, Placeholder) for r in returns)
            self.methods[fn.__name__] = dict(inputs=inputs, outputs=names, stages=self._stages, returns=returns)
            self._stages = None
            return fn

        return decorate

    def add_stage(self, stage, *args, outputs_count, batch_size=None, tag=None):
        assert all(isinstance(a, Placeholder) for a in args)
        assert isinstance(stage, StubModel) or inspect.isfunction(stage)
        if inspect.isfunction(stage) and batch_size is None:
            assert len(inspect.signature(stage).parameters) == len(args)
        self._stages.append(dict(stage=stage, args=args, outputs_count=outputs_count, batch_size=batch_size))
        outs = tuple(Placeholder(len(self._stages), i) for i in range(outputs_count))
        return outs if outputs_count > 1 else outs[0]


def load_config(ms, servable, monkeypatch):
    """Import servables/<servable>/servable_config.py against StubRegister; model stages run the real MindIR."""

    def run_model(model, subgraph, args):
        cell = graph(ms, model.servable, model.files[subgraph])
        inputs = [np.asarray(a) for a in args]
        if model.with_batch_dim:  # one instance: pad the batch with copies, keep row 0
            inputs = [np.stack([a] * MODEL_BATCH[model.servable]) for a in inputs]
        out = run(ms, cell, *inputs)
        if model.with_batch_dim:
            out = tuple(o[0] for o in out) if isinstance(out, tuple) else out[0]
        return out

    register = StubRegister(servable, run_model)
    package = types.ModuleType("mindspore_serving.server")
    package.register = register
    monkeypatch.setitem(sys.modules, "mindspore_serving.server", package)
    monkeypatch.setitem(sys.modules, "mindspore_serving.server.register", register)
    module = load_module(f"_test_servable_config_{servable}", os.path.join(SERVABLES, servable, "servable_config.py"))
    return module, register


def call_method(register, name, *inputs):
    """Run one instance through a method's stages in order."""
    method = register.methods[name]
    values = {(0, i): v for i, v in enumerate(inputs)}
    for index, stage in enumerate(method["stages"], start=1):
        args = [values[(a.stage, a.index)] for a in stage["args"]]
        fn = stage["stage"]
        if isinstance(fn, StubModel):
            outs = fn.call(*args)
        elif stage["batch_size"] is not None:
            outs = list(fn([tuple(args)]))[0]
        else:
            outs = fn(*args)
        if stage["outputs_count"] == 1:
            outs = (outs,)
        assert len(outs) == stage["outputs_count"]
        for i, out in enumerate(outs):
            values[(index, i)] = out
    return tuple(values[(r.stage, r.index)] for r in method["returns"])


def test_add_servable_config(ms, monkeypatch):
    _, register = load_config(ms, "add", monkeypatch)
    assert [(m.files, m.with_batch_dim) for m in register.models] == [(["tensor_add.mindir"], False)]
    assert {n: (m["inputs"], m["outputs"]) for n, m in register.methods.items()} == {
        "add_common": (["x1", "x2"], ["y"]),
        "add_cast": (["x1", "x2"], ["y"]),
    }
    assert register.warmup_generate
    rng = np.random.default_rng(5)
    x1, x2 = rand(rng, 2, 2), rand(rng, 2, 2)
    (y,) = call_method(register, "add_common", x1, x2)
    np.testing.assert_allclose(y, x1 + x2, rtol=1e-6)
    a, b = np.arange(4, dtype=np.int32).reshape(2, 2), np.full((2, 2), 0.5, np.float64)
    (y,) = call_method(register, "add_cast", a, b)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, a.astype(np.float32) + b.astype(np.float32))


def test_add_sub_servable_config(ms, monkeypatch):
    _, register = load_config(ms, "add_sub", monkeypatch)
    assert [(m.files, m.with_batch_dim) for m in register.models] == [
        (["tensor_add.mindir"], False),
        (["tensor_sub.mindir"], False),
    ]
    assert {n: (m["inputs"], m["outputs"]) for n, m in register.methods.items()} == {
        "add_sub_only_model": (["x1", "x2", "x3"], ["y"]),
        "add_sub_complex": (["x1", "x2", "x3"], ["y"]),
    }
    rng = np.random.default_rng(6)
    x1, x2, x3 = rand(rng, 2, 2), rand(rng, 2, 2), rand(rng, 2, 2)
    (y,) = call_method(register, "add_sub_only_model", x1, x2, x3)
    np.testing.assert_allclose(y, (x1 + x2) - x3, rtol=1e-5, atol=1e-6)
    (y,) = call_method(register, "add_sub_complex", x1, x2, x3)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, 2 * ((x1 + 1) + x2 - x3), rtol=1e-5, atol=1e-5)


def test_matmul_servable_config(ms, monkeypatch):
    _, register = load_config(ms, "matmul", monkeypatch)
    assert [(m.files, m.with_batch_dim) for m in register.models] == [(["matmul_0.mindir", "matmul_1.mindir"], False)]
    assert {n: (m["inputs"], m["outputs"]) for n, m in register.methods.items()} == {
        "predict": (["x1", "x2"], ["y1", "y2"])
    }
    weights = np.load(os.path.join(SERVABLES, "matmul", "1", "weights.npz"))
    rng = np.random.default_rng(7)
    x1, x2 = rand(rng, 128, 96), rand(rng, 8, 96)
    y1, y2 = call_method(register, "predict", x1, x2)
    np.testing.assert_allclose(y1, x1 @ weights["w0"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y2, x2 @ weights["w1"], rtol=1e-4, atol=1e-4)


def test_lenet_servable_config(ms, monkeypatch):
    from PIL import Image

    config, register = load_config(ms, "lenet", monkeypatch)
    assert [(m.files, m.with_batch_dim) for m in register.models] == [(["lenet.mindir"], True)]
    assert {n: (m["inputs"], m["outputs"]) for n, m in register.methods.items()} == {
        "classify_top1": (["image"], ["label"]),
        "classify_top1_batch": (["image"], ["label"]),
    }
    assert [s["batch_size"] for s in register.methods["classify_top1_batch"]["stages"]][0] == 2

    paths, labels = lenet_images()
    blobs = [open(p, "rb").read() for p in paths]
    # the stage accepts bytes and MS_BYTES as a 1-D uint8 array, and matches the training normalisation
    for blob in blobs[:3]:
        expected = lenet_preprocess(blob)
        for given in (blob, np.frombuffer(blob, np.uint8)):
            x = config.preprocess(given)
            assert x.shape == (1, 32, 32) and x.dtype == np.float32
            np.testing.assert_array_equal(x, expected)
    batched = list(config.preprocess_batch([(np.frombuffer(b, np.uint8),) for b in blobs[:3]]))
    assert len(batched) == 3
    for x, blob in zip(batched, blobs):
        np.testing.assert_array_equal(x, lenet_preprocess(blob))
    # a larger RGB JPEG is converted and resized
    big = io.BytesIO()
    Image.open(io.BytesIO(blobs[0])).convert("RGB").resize((64, 64)).save(big, format="JPEG")
    assert config.preprocess(big.getvalue()).shape == (1, 32, 32)
    # a decompression bomb (a small PNG of 5000x5000 pixels) is refused from its header, before decoding
    bomb = io.BytesIO()
    Image.new("L", (5000, 5000)).save(bomb, format="PNG")
    with (
        pytest.warns(Image.DecompressionBombWarning),
        pytest.raises(  # PIL warns up to twice its limit
            ValueError, match=r"5000x5000 pixels, more than this servable decodes \(16777216 pixels\)"
        ),
    ):
        config.preprocess(bomb.getvalue())
    assert config.postprocess_top1(np.eye(10, dtype=np.float32)[7]) == "7"

    for method in ("classify_top1", "classify_top1_batch"):
        predicted = [call_method(register, method, np.frombuffer(b, np.uint8))[0] for b in blobs]
        assert all(isinstance(p, str) for p in predicted)
        accuracy = np.mean([p == str(label) for p, label in zip(predicted, labels)])
        assert accuracy > 0.8, (method, accuracy)
