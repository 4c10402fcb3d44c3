"""MethodRunner: instances flow stage by stage, errors stay with their instance, model queues are told what to expect.

Stages are real StageSpec/MethodSpec objects (built by hand or recorded from a servable_config.py written into
tmp_path) run by fake executors, or by a real ModelExecutor over a fake graph. No processes, no MindSpore.
"""

import importlib.util
import io
import itertools
import textwrap
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import numpy as np
import pytest
from stage_fakes import FakeLoadedModel, function_spec, method, model_spec, ref

from mindspore_serving.spec import model_call as model_module
from mindspore_serving.spec.registry import get_servable_spec, reset_registry
from mindspore_serving.spec.servable import STAGE_BUILTIN, STAGE_MODEL, StageSpec
from mindspore_serving.worker.executors import FunctionBatcher, ModelExecutor
from mindspore_serving.worker.method_runner import (
    ArgmaxStage,
    BatchFunctionStage,
    FunctionStage,
    InstanceError,
    MethodRunner,
    ModelStage,
)
from mindspore_serving.worker.model_backend import TensorInfo

_module_ids = itertools.count()


class InlineExecutor(Executor):
    """Runs submitted calls at once, in the caller's thread."""

    def submit(self, fn, *args, **kwargs):
        future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # pylint: disable=broad-except
            future.set_exception(err)
        return future


class RecordingCounter:
    """Stands in for ExpectedCounter and keeps every call."""

    def __init__(self):
        self.events = []

    def announce(self, count):
        self.events.append(("announce", count))

    def arrived(self, count=1):
        self.events.append(("arrived", count))

    def retract(self, count=1):
        self.events.append(("retract", count))

    def balance(self):
        return sum(count if kind == "announce" else -count for kind, count in self.events)


class FakeModelExecutor:
    """What ModelStage needs from a ModelExecutor: check, submit and the expected counter."""

    def __init__(self, function, reject=lambda inputs: None):
        self.function = function
        self.reject = reject
        self.expected = RecordingCounter()
        self.submitted = []

    def check(self, inputs):
        return self.reject(inputs)

    def submit(self, inputs):
        self.submitted.append(inputs)
        self.expected.arrived()
        return InlineExecutor().submit(lambda: tuple(self.function(*inputs)))


def errors_of(results):
    return [str(result) if isinstance(result, InstanceError) else None for result in results]


# ---------------------------------------------------------------- methods without stages


def test_echo_method_returns_the_inputs_unchanged():
    spec = method("echo", ["x", "s", "b"], ["b", "x", "s"], [], [ref(0, 2), ref(0, 0), ref(0, 1)])
    x = np.arange(4, dtype=np.float32)
    results = MethodRunner("svc", spec, []).run(
        [{"x": x, "s": "text", "b": b"\x00\xff"}, {"x": x * 2, "s": "", "b": b""}]
    )
    assert results[0]["x"] is x
    assert results[0]["s"] == "text"
    assert isinstance(results[0]["b"], bytes) and results[0]["b"] == b"\x00\xff"
    np.testing.assert_array_equal(results[1]["x"], x * 2)
    assert results[1]["b"] == b"" and isinstance(results[1]["b"], bytes)
    assert list(results[0]) == ["b", "x", "s"]


def test_echo_method_reports_missing_inputs_per_instance():
    spec = method("echo", ["x1", "x2"], ["y"], [], [ref(0, 1)])
    results = MethodRunner("svc", spec, []).run([{"x1": 1, "x2": 2}, {"x1": 1}, {"x2": 5}])
    assert results[0] == {"y": 2}
    assert errors_of(results) == [
        None,
        "Cannot find input x2 in instance input , servable svc, method echo",
        "Cannot find input x1 in instance input , servable svc, method echo",
    ]
    assert all(isinstance(result, InstanceError) for result in results[1:])


def test_empty_request_gives_no_results():
    spec = method("echo", ["x"], ["x"], [], [ref(0)])
    assert MethodRunner("svc", spec, []).run([]) == []


# ---------------------------------------------------------------- values seen by Python stages


def test_python_stages_see_bytes_as_uint8_arrays_and_str_as_str():
    seen = []

    def inspect_inputs(b, s):
        seen.append((b, s))
        return b.size, s.upper()

    spec = method(
        "m",
        ["b", "s"],
        ["n", "u", "b"],
        [function_spec(inspect_inputs, ref(0, 0), ref(0, 1), outputs_count=2)],
        [ref(1, 0), ref(1, 1), ref(0, 0)],
    )
    stages = [FunctionStage(inspect_inputs, 2, InlineExecutor())]
    results = MethodRunner("svc", spec, stages).run([{"b": b"\x01\x02\x03", "s": "abc"}])
    b, s = seen[0]
    assert isinstance(b, np.ndarray) and b.dtype == np.uint8 and b.shape == (3,)
    assert b.tobytes() == b"\x01\x02\x03"
    assert s == "abc" and isinstance(s, str)
    assert results[0]["n"].dtype == np.int64 and results[0]["n"].item() == 3
    assert results[0]["u"] == "ABC"
    # the method output that echoes the input is the original bytes, not the array the stage saw
    assert results[0]["b"] == b"\x01\x02\x03" and isinstance(results[0]["b"], bytes)


def test_bytes_from_an_earlier_stage_reach_python_stages_as_uint8_arrays():
    seen = []

    def make_bytes(x):
        return b"\x07\x08"

    def consume(b):
        seen.append(b)
        return 0

    spec = method("m", ["x"], ["y"], [function_spec(make_bytes, ref(0)), function_spec(consume, ref(1))], [ref(2)])
    stages = [FunctionStage(make_bytes, 1, InlineExecutor()), FunctionStage(consume, 1, InlineExecutor())]
    MethodRunner("svc", spec, stages).run([{"x": 1}])
    assert isinstance(seen[0], np.ndarray) and seen[0].dtype == np.uint8
    assert seen[0].tobytes() == b"\x07\x08"


def test_numeric_inputs_reach_stages_as_the_same_arrays():
    seen = []

    def keep(x):
        seen.append(x)
        return x

    spec = method("m", ["x"], ["y"], [function_spec(keep, ref(0))], [ref(1)])
    x = np.ones((2, 3), np.int16)
    results = MethodRunner("svc", spec, [FunctionStage(keep, 1, InlineExecutor())]).run([{"x": x}])
    assert seen[0] is x
    assert results[0]["y"] is x


# ---------------------------------------------------------------- per-instance errors


def test_a_failing_instance_gets_its_own_error_and_the_others_go_on():
    def check_value(x):
        if x.item() == 1:
            raise ValueError("one is not allowed")
        return x * 10

    spec = method("m", ["x"], ["y"], [function_spec(check_value, ref(0))], [ref(1)])
    results = MethodRunner("svc", spec, [FunctionStage(check_value, 1, InlineExecutor())]).run(
        [{"x": np.array(0)}, {"x": np.array(1)}, {"x": np.array(2)}]
    )
    assert errors_of(results) == [
        None,
        "Call Function 'svc.check_value' Failed, method: 'm', stage index(begin with "
        "1): 1, error msg: one is not allowed",
        None,
    ]
    assert results[0]["y"].item() == 0
    assert results[2]["y"].item() == 20


def test_a_stage_error_keeps_its_message_without_paths_or_reprs_and_its_exception_as_cause():
    def parse(x):
        raise TypeError(f"cannot read {io.BytesIO.__name__} from /usr/lib/servables/x.py: {io.BytesIO()!r}")

    spec = method("m", ["x"], ["y"], [function_spec(parse, ref(0))], [ref(1)])
    results = MethodRunner("svc", spec, [FunctionStage(parse, 1, InlineExecutor())]).run([{"x": np.array(0)}])
    assert errors_of(results) == [
        "Call Function 'svc.parse' Failed, method: 'm', stage index(begin with 1): 1, "
        "error msg: cannot read BytesIO from x.py: <_io.BytesIO object>"
    ]
    cause = results[0].__cause__
    assert isinstance(cause, TypeError) and "/usr/lib/servables/x.py" in str(cause) and " at 0x" in str(cause)
    assert cause.__traceback__ is not None  # the worker logs it, traceback and all


def test_an_instance_failing_at_stage_1_never_reaches_stage_2():
    reached = []

    def first(x):
        if x.item() < 0:
            raise RuntimeError(f"negative {x.item()}")
        return x + 1

    def second(x):
        reached.append(x.item())
        return x * 2

    spec = method(
        "m", ["x"], ["y"], [function_spec(first, ref(0)), function_spec(second, ref(1), tag="Post")], [ref(2)]
    )
    stages = [FunctionStage(first, 1, InlineExecutor()), FunctionStage(second, 1, InlineExecutor())]
    results = MethodRunner("svc", spec, stages).run([{"x": np.array(v)} for v in (3, -1, 4, -2)])
    assert reached == [4, 5]
    assert errors_of(results) == [
        None,
        "Call Function 'svc.first' Failed, method: 'm', stage index(begin with 1): 1, error msg: negative -1",
        None,
        "Call Function 'svc.first' Failed, method: 'm', stage index(begin with 1): 1, error msg: negative -2",
    ]
    assert [results[0]["y"].item(), results[2]["y"].item()] == [8, 10]


def test_the_stage_index_and_tag_of_a_later_stage_appear_in_its_error():
    def first(x):
        return x

    def second(x):
        raise KeyError("k")

    spec = method(
        "predict", ["x"], ["y"], [function_spec(first, ref(0)), function_spec(second, ref(1), tag="Post")], [ref(2)]
    )
    stages = [FunctionStage(first, 1, InlineExecutor()), FunctionStage(second, 1, InlineExecutor())]
    results = MethodRunner("svc", spec, stages).run([{"x": 1}])
    assert errors_of(results) == ["Call Post Failed, method: 'predict', stage index(begin with 1): 2, error msg: 'k'"]


def test_an_instance_error_raised_by_a_stage_keeps_its_text():
    def fail(x):
        raise InstanceError("exactly this text")

    spec = method("m", ["x"], ["y"], [function_spec(fail, ref(0))], [ref(1)])
    results = MethodRunner("svc", spec, [FunctionStage(fail, 1, InlineExecutor())]).run([{"x": 1}])
    assert errors_of(results) == ["exactly this text"]


def test_missing_input_never_reaches_any_stage():
    calls = []

    def record(x1, x2):
        calls.append((x1, x2))
        return x1

    spec = method("m", ["x1", "x2"], ["y"], [function_spec(record, ref(0, 0), ref(0, 1))], [ref(1)])
    results = MethodRunner("add", spec, [FunctionStage(record, 1, InlineExecutor())]).run(
        [{"x1": "a"}, {"x1": "b", "x2": "c"}]
    )
    assert calls == [("b", "c")]
    assert errors_of(results) == ["Cannot find input x2 in instance input , servable add, method m", None]
    assert results[1] == {"y": "b"}


def test_builtin_argmax_stage():
    spec = method(
        "m",
        ["x"],
        ["label"],
        [
            StageSpec(
                kind=STAGE_BUILTIN,
                tag="Function 'argmax_cpp'",
                inputs=[ref(0)],
                outputs_count=1,
                builtin_name="argmax_cpp",
            )
        ],
        [ref(1)],
    )
    results = MethodRunner("svc", spec, [ArgmaxStage()]).run(
        [{"x": np.array([0.1, 0.7, 0.2], np.float32)}, {"x": "text"}]
    )
    assert results[0]["label"].dtype == np.int64 and results[0]["label"].item() == 1
    assert errors_of(results) == [None, "argmax_cpp expects one numeric tensor input"]


# ---------------------------------------------------------------- model stages and their expected counters


def test_model_checks_fail_only_their_instance_with_the_check_text():
    executor = FakeModelExecutor(lambda x: (x + 1,), reject=lambda inputs: "bad size" if inputs[0].size != 4 else None)
    spec = method("m", ["x"], ["y"], [model_spec("add.mindir", ref(0))], [ref(1)])
    results = MethodRunner("svc", spec, [ModelStage(executor)]).run(
        [{"x": np.zeros(4)}, {"x": np.zeros(3)}, {"x": np.ones(4)}]
    )
    assert errors_of(results) == [None, "bad size", None]
    np.testing.assert_array_equal(results[2]["y"], np.full(4, 2.0))
    assert len(executor.submitted) == 2
    assert executor.expected.events == [("announce", 3), ("arrived", 1), ("retract", 1), ("arrived", 1)]


def test_expected_counters_are_announced_and_retracted_for_every_model_stage():
    def pre(x):
        if x.item() == 1:
            raise ValueError("pre failed")
        return x

    model_a = FakeModelExecutor(lambda x: (x + 100,), reject=lambda inputs: "a rejects 2" if inputs[0] == 2 else None)
    model_b = FakeModelExecutor(lambda x: (x * 2,))
    spec = method(
        "m",
        ["x"],
        ["y"],
        [function_spec(pre, ref(0)), model_spec("a.mindir", ref(1)), model_spec("b.mindir", ref(2))],
        [ref(3)],
    )
    runner = MethodRunner(
        "svc", spec, [FunctionStage(pre, 1, InlineExecutor()), ModelStage(model_a), ModelStage(model_b)]
    )
    results = runner.run([{"x": np.array(0)}, {"x": np.array(1)}, {"x": np.array(2)}, {"y": np.array(3)}])
    assert errors_of(results) == [
        None,
        "Call Function 'svc.pre' Failed, method: 'm', stage index(begin with 1): 1, error msg: pre failed",
        "a rejects 2",
        "Cannot find input x in instance input , servable svc, method m",
    ]
    assert results[0]["y"].item() == 200
    # 3 instances have all their inputs; the one failing at stage 1 is retracted from both model queues,
    # the one rejected by model a from a's queue and b's
    assert model_a.expected.events == [("announce", 3), ("retract", 1), ("arrived", 1), ("retract", 1)]
    assert model_b.expected.events == [("announce", 3), ("retract", 1), ("retract", 1), ("arrived", 1)]
    assert model_a.expected.balance() == 0 and model_b.expected.balance() == 0


def test_a_model_failure_retracts_the_later_model_stages():
    def explode(x):
        raise RuntimeError("model predict failed: boom")

    model_a = FakeModelExecutor(explode)
    model_b = FakeModelExecutor(lambda x: (x,))
    spec = method("m", ["x"], ["y"], [model_spec("a.mindir", ref(0)), model_spec("b.mindir", ref(1))], [ref(2)])
    results = MethodRunner("svc", spec, [ModelStage(model_a), ModelStage(model_b)]).run([{"x": 1}, {"x": 2}])
    text = (
        "Call Model 'a.mindir' Failed, method: 'm', stage index(begin with 1): 1, error msg: model predict failed: boom"
    )
    assert errors_of(results) == [text, text]
    assert model_b.submitted == []
    assert model_b.expected.events == [("announce", 2), ("retract", 1), ("retract", 1)]
    assert model_a.expected.balance() == 0 and model_b.expected.balance() == 0


@pytest.mark.timeout(60)
def test_request_instances_share_one_padded_model_batch():
    """The instance failing at stage 1 is retracted, so the two survivors make one batch padded with instance 0."""

    def pre(x):
        if x[0] < 0:
            raise ValueError("negative")
        return x

    model = FakeLoadedModel(4, [TensorInfo((2,), np.dtype(np.float32))], lambda x: (x * 2, x.sum(axis=1)))
    executor = ModelExecutor(model, 0, max_wait=5.0)
    try:
        spec = method(
            "m",
            ["x"],
            ["double", "total"],
            [function_spec(pre, ref(0)), model_spec("fake.mindir", ref(1), outputs_count=2)],
            [ref(2, 0), ref(2, 1)],
        )
        runner = MethodRunner("svc", spec, [FunctionStage(pre, 1, InlineExecutor()), ModelStage(executor)])
        inputs = [np.array([1, 2], np.float32), np.array([-1, 0], np.float32), np.array([3, 4], np.float32)]
        results = runner.run([{"x": x} for x in inputs])
    finally:
        executor.close()
    assert errors_of(results) == [
        None,
        "Call Function 'svc.pre' Failed, method: 'm', stage index(begin with 1): 1, error msg: negative",
        None,
    ]
    np.testing.assert_array_equal(results[0]["double"], [2, 4])
    assert results[0]["total"].item() == 3
    np.testing.assert_array_equal(results[2]["double"], [6, 8])
    assert results[2]["total"].item() == 7
    (batch,) = model.subgraphs[0].calls  # one call: both surviving instances, padded with instance 0
    np.testing.assert_array_equal(batch[0], [[1, 2], [3, 4], [1, 2], [1, 2]])
    assert not executor.expected()


@pytest.mark.timeout(60)
def test_model_executor_rejects_with_the_model_check_texts():
    model = FakeLoadedModel(2, [TensorInfo((2, 2), np.dtype(np.float32))], lambda x: (x,))
    executor = ModelExecutor(model, 0, max_wait=5.0)
    try:
        spec = method("m", ["x"], ["y"], [model_spec("fake.mindir", ref(0))], [ref(1)])
        results = MethodRunner("svc", spec, [ModelStage(executor)]).run(
            [{"x": np.zeros((2, 2), np.int32)}, {"x": np.zeros((3, 2), np.float32)}, {"x": np.ones(4, np.float32)}]
        )
    finally:
        executor.close()
    assert errors_of(results) == [
        "Given model input 0 data type kMSI_Int32 not match the data type kMSI_Float32 defined in model",
        "Given model input 0 size 24 not match the size 16 defined in model",
        None,
    ]
    np.testing.assert_array_equal(results[2]["y"], np.ones((2, 2)))


@pytest.mark.timeout(60)
def test_last_expected_instance_does_not_keep_its_batch_waiting():
    model = FakeLoadedModel(4, [TensorInfo((1,), np.dtype(np.float32))], lambda x: (x,))
    executor = ModelExecutor(model, 0, max_wait=30.0)
    try:
        # a lone instance: nothing else is on its way once it arrives (counted before it is queued, so the batch
        # thread never sees it queued and still expected)
        executor.expected.announce(1)
        future = executor.submit((np.ones(1, np.float32),))
        (value,) = future.result(timeout=2.0)  # raises TimeoutError while the batch waits 30 s
        np.testing.assert_array_equal(value, [1])
    finally:
        executor.close()


# ---------------------------------------------------------------- batched Python stages


@pytest.mark.timeout(60)
def test_batched_python_stage_fails_only_the_instance_whose_item_raises():
    def decode(instances):
        for (data,) in instances:
            if data.size == 0:
                raise ValueError("empty")
            yield int(data.sum())

    pool = ThreadPoolExecutor(2)
    batcher = FunctionBatcher("svc.decode", decode, batch_size=4, outputs_count=1, pool=pool, max_wait=0.0)
    try:
        spec = method("m", ["data"], ["total"], [function_spec(decode, ref(0), batch_size=4)], [ref(1)])
        results = MethodRunner("svc", spec, [BatchFunctionStage(batcher)]).run(
            [{"data": b"\x01\x02"}, {"data": b""}, {"data": b"\x05"}]
        )
    finally:
        batcher.close()
        pool.shutdown()
    assert results[0]["total"].item() == 3
    assert errors_of(results)[1] == (
        "Call Function 'svc.decode' Failed, method: 'm', stage index(begin with 1): 1, error msg: empty"
    )
    assert results[2]["total"].item() == 5


# ---------------------------------------------------------------- specs recorded from servable_config.py


@pytest.fixture
def registry():
    reset_registry()
    model_module.set_model_call_handler(None)
    yield
    reset_registry()
    model_module.set_model_call_handler(None)


def load_config(tmp_path, body, name="svc"):
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    path = directory / "servable_config.py"
    path.write_text("import numpy as np\nfrom mindspore_serving.server import register\n" + textwrap.dedent(body))
    spec = importlib.util.spec_from_file_location(f"_runner_config_{next(_module_ids)}", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return get_servable_spec(name)


def build_stages(method_spec, models):
    stages = []
    for stage in method_spec.stages:
        if stage.kind == STAGE_MODEL:
            stages.append(ModelStage(models[stage.model_key]))
        else:
            stages.append(FunctionStage(stage.function, stage.outputs_count, InlineExecutor()))
    return stages


def test_recorded_pipeline_runs_per_instance(tmp_path, registry):
    servable = load_config(
        tmp_path,
        """
        tensor_add = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR",
                                            with_batch_dim=False)

        def add_one(x1):
            if x1.dtype != np.float32:
                raise TypeError(f"x1 should be float32, got {x1.dtype}")
            return x1 + 1

        def double(y):
            return y * 2

        @register.register_method(output_names=["y", "echo"])
        def complex_add(x1, x2):
            x1 = register.add_stage(add_one, x1, outputs_count=1)
            y = register.add_stage(tensor_add, x1, x2, outputs_count=1)
            y = register.add_stage(double, y, outputs_count=1)
            return y, x2

        @register.register_method(output_names=["a"])
        def echo(a):
            return a
    """,
        name="adder",
    )
    add = FakeModelExecutor(lambda a, b: (a + b,))
    complex_add = servable.methods["complex_add"]
    runner = MethodRunner("adder", complex_add, build_stages(complex_add, {"tensor_add.mindir": add}))
    ones = np.ones((2, 2), np.float32)
    results = runner.run(
        [{"x1": ones, "x2": ones}, {"x1": ones.astype(np.int32), "x2": ones}, {"x1": ones * 3, "x2": ones * 5}]
    )
    np.testing.assert_array_equal(results[0]["y"], np.full((2, 2), 6.0))
    assert results[0]["echo"] is ones
    assert errors_of(results)[1] == (
        "Call Function 'adder.add_one' Failed, method: 'complex_add', stage index(begin "
        "with 1): 1, error msg: x1 should be float32, got int32"
    )
    np.testing.assert_array_equal(results[2]["y"], np.full((2, 2), 18.0))
    np.testing.assert_array_equal(results[2]["echo"], ones * 5)
    assert len(add.submitted) == 2
    assert add.expected.events == [("announce", 3), ("retract", 1), ("arrived", 1), ("arrived", 1)]

    echo = servable.methods["echo"]
    assert MethodRunner("adder", echo, build_stages(echo, {})).run([{"a": b"\x00"}, {"a": "s"}]) == [
        {"a": b"\x00"},
        {"a": "s"},
    ]
