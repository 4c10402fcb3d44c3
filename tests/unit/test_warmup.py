"""Warm-up (worker/warmup.py): reading warm-up files, generating zeros, running the plan, and its errors."""

import base64
import json
from types import SimpleNamespace

import numpy as np
import pytest

from mindspore_serving.spec.servable import STAGE_FUNCTION, STAGE_MODEL, MethodSpec, ServableSpec, StageSpec, TensorRef
from mindspore_serving.worker.model_backend import TensorInfo
from mindspore_serving.worker.warmup import (
    WarmupError,
    generated_instances,
    read_warmup_files,
    run_warmup,
    warm_up,
    warmup_plan,
)


class FakeModel:
    def __init__(self, inputs):
        self.spec = SimpleNamespace(with_batch_dim=True)
        self._inputs = inputs

    def instance_inputs(self, subgraph):
        return self._inputs


def make_spec(generate=False):
    """Method `add(x1, x2)` straight into a model; method `classify(image)` through a Python stage first."""
    spec = ServableSpec(name="demo", warmup_generate=generate)
    spec.methods["add"] = MethodSpec(
        name="add",
        input_names=["x1", "x2"],
        output_names=["y"],
        stages=[StageSpec(STAGE_MODEL, "net", [TensorRef(0, 0), TensorRef(0, 1)], 1, model_key="net")],
        outputs=[TensorRef(1, 0)],
    )
    spec.methods["classify"] = MethodSpec(
        name="classify",
        input_names=["image"],
        output_names=["label"],
        stages=[StageSpec(STAGE_FUNCTION, "pre", [TensorRef(0, 0)], 1)],
        outputs=[TensorRef(1, 0)],
    )
    return spec


MODELS = {"net": FakeModel([TensorInfo((2, 2), np.dtype(np.float32)), TensorInfo((3,), np.dtype(np.int64))])}


def write(servable_path, name, content):
    folder = servable_path / "warmup"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))


class FakeRuntime:
    def __init__(self, spec, fail=None):
        self.spec = spec
        self.models = MODELS
        self.calls = []
        self.fail = fail

    def predict(self, method, instances):
        self.calls.append((method, instances))
        if self.fail == "raise":
            raise KeyError(method)
        if self.fail == "instance":
            return ["Call pre Failed, bad image"]
        return [{"y": 0} for _ in instances]


def test_files_in_the_restful_format_become_instances(tmp_path):
    image = base64.b64encode(b"\x89PNG").decode()
    write(tmp_path, "add.json", {"instances": [{"x1": [[1.0, 2.0], [3.0, 4.0]], "x2": [1, 2, 3]}]})
    write(tmp_path, "classify.json", {"instances": {"image": {"b64": image}}})
    write(tmp_path, "README.txt", "not a warm-up file: ignored")
    plan = read_warmup_files(str(tmp_path), make_spec())
    assert sorted(plan) == ["add", "classify"]
    (add,) = plan["add"]
    assert add["x1"].dtype == np.float32 and add["x1"].shape == (2, 2)
    assert add["x2"].dtype == np.int32 and add["x2"].tolist() == [1, 2, 3]
    assert plan["classify"] == [{"image": b"\x89PNG"}]


def test_without_a_warmup_folder_there_is_no_warmup(tmp_path):
    assert read_warmup_files(str(tmp_path), make_spec()) == {}
    assert warmup_plan(str(tmp_path), make_spec(generate=False), MODELS) == {}


def test_bad_json_fails_with_the_file_and_the_reason(tmp_path):
    write(tmp_path, "add.json", '{"instances": [')
    with pytest.raises(WarmupError, match=r"warmup/add\.json': Illegal JSON format"):
        read_warmup_files(str(tmp_path), make_spec())


def test_a_document_without_instances_fails(tmp_path):
    write(tmp_path, "add.json", {"inputs": []})
    with pytest.raises(WarmupError, match="key 'instances' expects to exist once"):
        read_warmup_files(str(tmp_path), make_spec())


def test_a_file_for_an_unknown_method_fails_naming_the_methods(tmp_path):
    write(tmp_path, "add_common.json", {"instances": [{"x1": 1.0, "x2": 2.0}]})
    with pytest.raises(
        WarmupError,
        match=r"servable 'demo' has no method 'add_common', its methods: \['add', "
        r"'classify'\]",
    ):
        read_warmup_files(str(tmp_path), make_spec())


@pytest.mark.parametrize("instance", [{"x1": 1.0}, {"x1": 1.0, "x2": 2.0, "x3": 3.0}, {"x1": 1.0, "y": 2.0}])
def test_input_names_must_be_those_of_the_method(tmp_path, instance):
    write(tmp_path, "add.json", {"instances": [{"x1": 1.0, "x2": 2.0}, instance]})
    with pytest.raises(WarmupError, match=r"instance 1 has inputs .* but method 'add' takes \['x1', 'x2'\]"):
        read_warmup_files(str(tmp_path), make_spec())


def test_zeros_are_generated_only_for_methods_whose_inputs_are_all_known():
    plan = generated_instances(make_spec(), MODELS)
    assert list(plan) == ["add"]
    (instance,) = plan["add"]
    assert instance["x1"].dtype == np.float32 and instance["x1"].shape == (2, 2) and not instance["x1"].any()
    assert instance["x2"].dtype == np.int64 and instance["x2"].shape == (3,)


def test_dynamic_shapes_are_not_generated():
    models = {"net": FakeModel([TensorInfo((-1, 2), np.dtype(np.float32)), TensorInfo((3,), np.dtype(np.int64))])}
    assert generated_instances(make_spec(), models) == {}


def test_files_win_over_generated_zeros_and_generation_needs_the_opt_in(tmp_path):
    write(tmp_path, "add.json", {"instances": [{"x1": 1.0, "x2": 2.0}]})
    plan = warmup_plan(str(tmp_path), make_spec(generate=True), MODELS)
    assert plan["add"][0]["x1"].shape == ()  # from the file
    assert list(plan) == ["add"]
    (tmp_path / "warmup" / "add.json").unlink()
    assert warmup_plan(str(tmp_path), make_spec(generate=False), MODELS) == {}
    assert list(warmup_plan(str(tmp_path), make_spec(generate=True), MODELS)) == ["add"]


def test_warm_up_runs_every_method_of_the_plan_and_logs_its_time(tmp_path, monkeypatch):
    from mindspore_serving.worker import warmup

    said = []
    monkeypatch.setattr(warmup.log, "info", said.append)  # the package's logger does not propagate to caplog
    write(tmp_path, "add.json", {"instances": [{"x1": 1.0, "x2": 2.0}, {"x1": 3.0, "x2": 4.0}]})
    runtime = FakeRuntime(make_spec())
    warm_up(runtime, str(tmp_path))
    assert [(method, len(instances)) for method, instances in runtime.calls] == [("add", 2)]
    assert any(text.startswith("warm-up of method add: 2 instances in") for text in said)


@pytest.mark.parametrize(
    "fail, reason",
    [
        ("raise", "warm-up of method 'add' failed: 'add'"),
        ("instance", "warm-up of method 'add' failed, instance 0: Call pre Failed"),
    ],
)
def test_a_failing_warmup_raises_the_reason(fail, reason):
    runtime = FakeRuntime(make_spec(), fail=fail)
    with pytest.raises(WarmupError, match=reason):
        run_warmup(runtime, {"add": [{"x1": 1.0, "x2": 2.0}]})


def test_llm_servables_refuse_a_warmup_folder(tmp_path):
    spec = make_spec()
    spec.extension = object()
    warm_up(FakeRuntime(spec), str(tmp_path))  # no folder: nothing happens
    write(tmp_path, "generate.json", {"instances": [{"prompt": "hi"}]})
    with pytest.raises(WarmupError, match="not supported for LLM servables"):
        warm_up(FakeRuntime(spec), str(tmp_path))
