"""Subgraph.run: GraphCell calls, and the fast call that skips GraphCell's per-call compile once compiled.

The fast call uses MindSpore's private executor API (model_backend._CompiledRunner); these tests pin that it
gives the public call's results, is really used after the first call of an input signature, and falls back to
the public call when it is unavailable or fails.
"""

import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ADD_MINDIR = os.path.join(ROOT, "servables", "add", "1", "tensor_add.mindir")


@pytest.fixture(scope="module")
def ms():
    mindspore = pytest.importorskip("mindspore")
    if not os.path.isfile(ADD_MINDIR):
        pytest.skip("servables/add/1/tensor_add.mindir is missing (make models)")
    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    return mindspore


@pytest.fixture()
def add_graph(ms):
    from mindspore_serving.worker.model_backend import Subgraph

    return Subgraph(ADD_MINDIR)


@pytest.fixture()
def public_calls(ms, monkeypatch):
    """Counts GraphCell.__call__ (the public, compiling call)."""
    calls = []
    original = ms.nn.GraphCell.__call__

    def counting(self, *args, **kwargs):
        calls.append(len(args))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ms.nn.GraphCell, "__call__", counting)
    return calls


def pairs(count, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((2, 2)).astype(np.float32), rng.standard_normal((2, 2)).astype(np.float32))
        for _ in range(count)
    ]


def test_probe_reveals_inputs_and_outputs(add_graph):
    assert [(info.shape, info.dtype) for info in add_graph.inputs] == [((2, 2), np.float32)] * 2
    assert [(info.shape, info.dtype) for info in add_graph.outputs] == [((2, 2), np.float32)]


def test_fast_call_is_used_after_the_first_call_and_matches_the_public_call(ms, add_graph, public_calls):
    from mindspore_serving.worker.model_backend import compiled_runner

    assert compiled_runner().available, "MindSpore's executor internals changed: the fast call is off"
    for x1, x2 in pairs(20):
        (y,) = add_graph.run([x1, x2])
        np.testing.assert_array_equal(y, x1 + x2)
        expected = add_graph.cell(ms.Tensor(x1), ms.Tensor(x2)).asnumpy()
        np.testing.assert_array_equal(y, expected)
    # the probe at load time compiled the signature: only the 20 reference calls above went through GraphCell
    assert len(public_calls) == 20
    assert len(add_graph._phases) == 1


def test_inputs_are_not_kept_between_calls(add_graph):
    x = np.ones((2, 2), np.float32)
    first = add_graph.run([x, x])[0]
    x[0, 0] = 5.0  # changing the caller's array after the call must not change the earlier output
    second = add_graph.run([x, x])[0]
    assert first[0, 0] == 2.0 and second[0, 0] == 10.0


def test_non_contiguous_and_read_only_inputs(add_graph):
    base = np.arange(16, dtype=np.float32).reshape(4, 4)
    strided = base[::2, ::2]
    read_only = np.frombuffer(np.full(4, 3.0, np.float32).tobytes(), np.float32).reshape(2, 2)
    (y,) = add_graph.run([strided, read_only])
    np.testing.assert_array_equal(y, strided + 3.0)


def test_each_new_signature_goes_through_the_public_call_once(add_graph, public_calls):
    ones3 = np.ones((3, 3), np.float32)
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(add_graph.run([ones3, ones3])[0])
        except Exception as err:  # pylint: disable=broad-except
            outcomes.append(type(err))
    if isinstance(outcomes[0], np.ndarray):  # MindSpore recompiled the graph for the new shape
        np.testing.assert_array_equal(outcomes[1], ones3 * 2)
        assert len(public_calls) == 1 and len(add_graph._phases) == 2
    else:  # it refused the shape: every such call is public and raises
        assert outcomes[1] is outcomes[0] and len(public_calls) == 2
    before = len(public_calls)
    (y,) = add_graph.run([np.ones((2, 2), np.float32)] * 2)  # the first signature still takes the fast call
    np.testing.assert_array_equal(y, np.full((2, 2), 2.0, np.float32))
    assert len(public_calls) == before


def test_without_the_fast_call_every_call_is_public(add_graph, public_calls, monkeypatch):
    from mindspore_serving.worker import model_backend

    monkeypatch.setattr(model_backend._CompiledRunner, "phase_of", lambda self, cell: None)
    add_graph._phases.clear()
    for x1, x2 in pairs(3):
        np.testing.assert_array_equal(add_graph.run([x1, x2])[0], x1 + x2)
    assert len(public_calls) == 3 and not add_graph._phases


def test_a_failing_fast_call_falls_back_to_the_public_call(add_graph, public_calls, monkeypatch):
    from mindspore_serving.worker import model_backend

    def broken(self, cell, tensors, compiled):
        raise RuntimeError("internals changed")

    monkeypatch.setattr(model_backend._CompiledRunner, "__call__", broken)
    x1, x2 = pairs(1)[0]
    np.testing.assert_array_equal(add_graph.run([x1, x2])[0], x1 + x2)
    assert len(public_calls) == 1


# ---------------------------------------------------------------- encrypted MindIR (export(..., enc_key=...))

KEY = b"0123456789abcdef0123456789abcdef"


def export_encrypted(ms, directory, enc_mode):
    """The add model of servables/add exported with `enc_key=KEY`: not a parseable protobuf any more."""
    import importlib.util
    import sys

    name = "_test_model_backend_add_export"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "servables", "add", "export_model.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # MindSpore's graph parser looks modules up by name
        spec.loader.exec_module(module)
    x = ms.Tensor(np.ones((2, 2), np.float32))
    base = os.path.join(str(directory), "tensor_add")
    ms.export(module._build_net(), x, x, file_name=base, file_format="MINDIR", enc_key=KEY, enc_mode=enc_mode)
    return base + ".mindir"


@pytest.mark.parametrize("mode", ["AES-GCM", "AES-CBC"])
def test_an_encrypted_model_loads_with_its_key(ms, tmp_path, mode):
    from mindspore_serving.common.mindir_info import read_mindir_input_infos
    from mindspore_serving.worker.model_backend import Subgraph

    path = export_encrypted(ms, tmp_path, mode)
    assert read_mindir_input_infos(path) is None  # without the key it is no protobuf
    graph = Subgraph(path, KEY, mode)
    assert [(info.shape, info.dtype) for info in graph.inputs] == [((2, 2), np.float32)] * 2
    assert [(info.shape, info.dtype) for info in graph.outputs] == [((2, 2), np.float32)]
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    np.testing.assert_array_equal(graph.run([x, x])[0], x * 2)


def test_a_wrong_key_fails_with_mindspore_s_reason(ms, tmp_path):
    from mindspore_serving.worker.model_backend import Subgraph

    path = export_encrypted(ms, tmp_path, "AES-GCM")
    with pytest.raises(
        RuntimeError,
        match="Load MindIR failed. The file may be encrypted and decrypt failed, you can "
        "check whether the values of the arguments 'dec_key' and 'dec_mode' are "
        "the same as when exported MindIR file, or check the file integrity.",
    ):
        Subgraph(path, b"x" * 32, "AES-GCM")
    with pytest.raises(RuntimeError, match="Load MindIR failed"):
        Subgraph(path, KEY, "AES-CBC")


# ---------------------------------------------------------------- batch size of a loaded model (no MindSpore needed)


class _Graph:
    def __init__(self, inputs, outputs):
        from mindspore_serving.worker.model_backend import TensorInfo

        self.inputs = [TensorInfo(tuple(shape), np.dtype(np.float32)) for shape in inputs]
        self.outputs = [TensorInfo(tuple(shape), np.dtype(np.float32)) for shape in outputs]


def _model(graphs, with_batch_dim=True, without_batch_dim_inputs=()):
    from mindspore_serving.spec.servable import ModelSpec
    from mindspore_serving.worker.model_backend import LoadedModel

    model = LoadedModel.__new__(LoadedModel)  # the graphs as loading would have given them
    model.spec = ModelSpec("m.mindir", ("m.mindir",), "MindIR", with_batch_dim, tuple(without_batch_dim_inputs))
    model.subgraphs = graphs
    return model


def test_batch_size_checks_have_mindspore_serving_s_texts():
    assert _model([_Graph([[4, 3], [4]], [[4, 2]])])._check_batch_size() == 4
    assert _model([_Graph([[4, 3], []], [[4]])], without_batch_dim_inputs=[1])._check_batch_size() == 4
    assert _model([_Graph([[], [7]], [[]])], with_batch_dim=False)._check_batch_size() == 1
    cases = [
        (
            _model([_Graph([[4, 3], []], [[4]])], without_batch_dim_inputs=[0]),
            "The shape of model input 1 cannot be empty, when with_batch_dim is true and without_batch_dim_inputs is "
            "[0]",
        ),
        (_model([_Graph([[4, 3]], [[]])]), "The shape of model output 0 cannot be empty"),
        (
            _model([_Graph([[4, 3], [2, 3]], [[4]])]),
            "The shape [2, 3] of model input 1 does not match current batch size 4",
        ),
        (
            _model([_Graph([[4, 3]], [[4], [3, 1]])]),
            "The shape [3, 1] of model output 1 does not match current batch size 4",
        ),
        (_model([_Graph([[-1, 3]], [[4]])]), "The shape of model input 0 is invalid, shape: [-1, 3]"),
        (
            _model([_Graph([[4, 3]], [[4]]), _Graph([[2, 3]], [[2]])]),
            "Expect batch size to be same, last batch size: 4, subgraph 1 batch size: 2",
        ),
    ]
    for model, text in cases:
        with pytest.raises(RuntimeError) as info:
            model._check_batch_size()
        assert str(info.value) == text


def test_io_counts_of_register_method_must_match_the_model():
    from mindspore_serving.worker.servable_runtime import ServableRuntime

    model = _model([_Graph([[4, 3], [4, 3]], [[4], [4]])])
    runtime = ServableRuntime.__new__(ServableRuntime)
    runtime.models = {"m.mindir": model}
    model.spec.io_counts[0] = (3, 2)
    with pytest.raises(RuntimeError) as info:
        runtime._check_io_counts()
    assert str(info.value) == (
        "Raise failed: The inputs count 3 in register_method not equal to the count 2 defined in model, model "
        "info: m.mindir, subgraph: 0"
    )
    model.spec.io_counts[0] = (2, 3)
    with pytest.raises(RuntimeError) as info:
        runtime._check_io_counts()
    assert str(info.value) == (
        "Raise failed: The outputs count 3 in register_method not equal to the count 2 defined in model, "
        "model info: m.mindir, subgraph: 0"
    )


def test_the_graph_runs_on_zeros_the_calls_asked_within_the_budget(add_graph, monkeypatch):
    from mindspore_serving.worker.model_backend import TensorInfo

    seen = []
    run = add_graph.run

    def counting(inputs):
        seen.append([(value.shape, value.dtype, float(np.abs(value).sum())) for value in inputs])
        return run(inputs)

    monkeypatch.setattr(add_graph, "run", counting)
    assert add_graph.run_on_zeros(7, 60.0) == 7
    assert seen == [[((2, 2), np.float32, 0.0)] * 2] * 7
    assert add_graph.run_on_zeros(7, 0.0) == 1  # the budget is checked after each call
    add_graph.inputs = [TensorInfo((-1, 2), np.dtype(np.float32))] * 2
    assert add_graph.run_on_zeros(7, 60.0) == 0 and len(seen) == 8  # a dynamic shape: nothing to run
