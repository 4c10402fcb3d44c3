"""declare_model, register_method, add_stage, Model.call and the deprecated call_* interfaces.

Each test writes a servable_config.py into tmp_path/<name>/ and imports it: the servable name is the
name of that directory, found on the call stack.
"""

import importlib.util
import itertools
import os
import re
import textwrap

import numpy as np
import pytest

from mindspore_serving import log
from mindspore_serving.server import register
from mindspore_serving.spec import model_call as model_module
from mindspore_serving.spec.registry import get_servable_spec, reset_registry
from mindspore_serving.spec.servable import STAGE_BUILTIN, STAGE_FUNCTION, STAGE_MODEL, TensorRef

_module_ids = itertools.count()


@pytest.fixture(autouse=True)
def clean_registry():
    reset_registry()
    model_module.set_model_call_handler(None)
    yield
    reset_registry()
    model_module.set_model_call_handler(None)


@pytest.fixture
def warnings(monkeypatch):
    messages = []
    monkeypatch.setattr(log, "warning", lambda msg, *args, **kwargs: messages.append(msg))
    return messages


def raises(text):
    return pytest.raises(RuntimeError, match=re.escape(text))


HEADER = """\
import numpy as np
from mindspore_serving.server import register
"""


def load(tmp_path, body, name="svc"):
    """Writes tmp_path/<name>/servable_config.py and imports it; returns the module."""
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    path = directory / "servable_config.py"
    path.write_text(HEADER + textwrap.dedent(body))
    spec = importlib.util.spec_from_file_location(f"_servable_config_{next(_module_ids)}", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- servable name


def test_servable_name_is_the_directory_name(tmp_path):
    load(
        tmp_path,
        """
        model = register.declare_model("add.mindir", "MindIR")
        @register.register_method(output_names="y")
        def predict(x):
            return register.add_stage(model, x, outputs_count=1)
    """,
        name="my_servable",
    )
    spec = get_servable_spec("my_servable")
    assert spec.name == "my_servable"
    assert list(spec.models) == ["add.mindir"]
    assert list(spec.methods) == ["predict"]
    assert get_servable_spec("svc") is None


def test_outside_servable_config_fails():
    with raises("Failed to obtain the directory of servable_config.py"):
        register.declare_model("add.mindir", "MindIR")
    with raises("Failed to obtain the directory of servable_config.py"):
        register.register_method("y")(lambda x: x)


# ---------------------------------------------------------------- recording a pipeline


def test_pipeline_is_recorded(tmp_path):
    module = load(
        tmp_path,
        """
        model = register.declare_model(model_file=["a.mindir", "b.mindir"], model_format="mindir",
                                       with_batch_dim=True, without_batch_dim_inputs=1)

        def preprocess(x1, x2):
            return x1 + 1, x2

        def postprocess(instances):
            for y, in instances:
                yield y

        @register.register_method(output_names=["y", "label"])
        def predict(x1, x2):
            a, b = register.add_stage(preprocess, x1, x2, outputs_count=2)
            y = register.add_stage(model, a, b, outputs_count=1)
            y = register.add_stage(postprocess, y, outputs_count=1, batch_size=4, tag="Post")
            label = register.add_stage("argmax_cpp", y, outputs_count=1)
            return y, label
    """,
    )
    spec = get_servable_spec("svc")
    model_spec = spec.models["a.mindir;b.mindir"]
    assert model_spec.model_files == ("a.mindir", "b.mindir")
    assert model_spec.model_format == "MindIR"
    assert model_spec.with_batch_dim is True
    assert model_spec.without_batch_dim_inputs == (1,)
    assert model_spec.io_counts == {0: (2, 1)}
    assert module.model.model_key == "a.mindir;b.mindir"
    assert module.model.subgraph_count == 2

    method = spec.methods["predict"]
    assert method.input_names == ["x1", "x2"]
    assert method.output_names == ["y", "label"]
    assert not method.only_model_stage
    kinds = [stage.kind for stage in method.stages]
    assert kinds == [STAGE_FUNCTION, STAGE_MODEL, STAGE_FUNCTION, STAGE_BUILTIN]
    pre, infer, post, argmax = method.stages
    assert pre.inputs == [TensorRef(0, 0), TensorRef(0, 1)]
    assert pre.outputs_count == 2 and pre.batch_size is None
    assert pre.function is module.preprocess and pre.function_key == "svc.preprocess"
    assert pre.tag == "Function 'svc.preprocess'"
    assert infer.inputs == [TensorRef(1, 0), TensorRef(1, 1)]
    assert infer.model_key == "a.mindir;b.mindir" and infer.subgraph == 0
    assert infer.tag == "Model 'a.mindir;b.mindir'"
    assert post.inputs == [TensorRef(2, 0)] and post.batch_size == 4 and post.tag == "Post"
    assert argmax.builtin_name == "argmax_cpp" and argmax.inputs == [TensorRef(3, 0)]
    assert method.outputs == [TensorRef(3, 0), TensorRef(4, 0)]


def test_method_without_stages_echoes_inputs(tmp_path):
    load(
        tmp_path,
        """
        @register.register_method(output_names=["b", "a"])
        def swap(a, b):
            return b, a
    """,
    )
    method = get_servable_spec("svc").methods["swap"]
    assert method.stages == [] and method.only_model_stage
    assert method.outputs == [TensorRef(0, 1), TensorRef(0, 0)]


def test_only_model_stages(tmp_path):
    load(
        tmp_path,
        """
        add = register.declare_model("add.mindir", "MindIR")
        sub = register.declare_model("sub.mindir", "MindIR")
        @register.register_method(output_names="y")
        def add_sub(x1, x2, x3):
            y = register.add_stage(add, x1, x2, outputs_count=1)
            return register.add_stage(sub, y, x3, outputs_count=1)
    """,
    )
    method = get_servable_spec("svc").methods["add_sub"]
    assert method.only_model_stage
    assert method.stages[1].inputs == [TensorRef(1, 0), TensorRef(0, 2)]


def test_batch_size_is_kept_as_given(tmp_path):
    load(
        tmp_path,
        """
        def batch(instances):
            return [instance[0] for instance in instances]
        @register.register_method(output_names="y")
        def zero(x):
            return register.add_stage(batch, x, outputs_count=1, batch_size=0)
        @register.register_method(output_names="y")
        def three(x):
            return register.add_stage(batch, x, outputs_count=1, batch_size=3)
    """,
    )
    methods = get_servable_spec("svc").methods
    assert methods["zero"].stages[0].batch_size == 0
    assert methods["three"].stages[0].batch_size == 3


def test_several_outputs_return_a_tuple(tmp_path):
    load(
        tmp_path,
        """
        def three(x):
            return x, x, x
        seen = []
        @register.register_method(output_names=["a", "b", "c"])
        def split(x):
            outputs = register.add_stage(three, x, outputs_count=3)
            seen.append(outputs)
            return outputs
    """,
    )
    assert len(get_servable_spec("svc").methods["split"].outputs) == 3


# ---------------------------------------------------------------- declare_model


def test_declare_model_parameters(tmp_path):
    cases = [
        (
            "register.declare_model(1, 'MindIR')",
            "Parameter 'model_file' should be str or tuple/list of str, but actually <class 'int'>",
        ),
        (
            "register.declare_model(['a.mindir', ''], 'MindIR')",
            "The item of parameter 'model_file' should not be empty str",
        ),
        (
            "register.declare_model(['a.mindir', 'a.mindir'], 'MindIR')",
            "The item value 'a.mindir' in parameter 'model_file' should not be repeated",
        ),
        (
            "register.declare_model('a.mindir', 'onnx')",
            "model format can only be OM, MindIR or MindIR_Lite, case ignored",
        ),
        ("register.declare_model('a.mindir', None)", "Parameter 'model_format' should be str, but actually"),
        (
            "register.declare_model('a.mindir', 'MindIR', with_batch_dim=1)",
            "Parameter 'with_batch_dim' should be bool, but actually <class 'int'>",
        ),
        (
            "register.declare_model('a.mindir', 'MindIR', without_batch_dim_inputs=-1)",
            "The item value '-1' in parameter 'without_batch_dim_inputs' should be >= 0",
        ),
        (
            "register.declare_model('a.mindir', 'MindIR', without_batch_dim_inputs='0')",
            "Parameter 'without_batch_dim_inputs' should be int or tuple/list of int, but actually <class 'str'>",
        ),
        (
            "register.declare_model('a.mindir', 'MindIR', context=1)",
            "Parameter 'context' should be Context, but gotten <class 'int'>",
        ),
        (
            "register.declare_model('a.mindir', 'MindIR', options=1)",
            "Parameter 'options' should be None, GpuOptions or AclOptions, but gotten <class 'int'>",
        ),
        (
            "register.declare_model('a.mindir', 'MindIR', config_file='')",
            "Parameter 'config_file' should not be empty str",
        ),
    ]
    for index, (statement, text) in enumerate(cases):
        reset_registry()
        with raises(text):
            load(tmp_path, statement + "\n", name=f"svc{index}")


def test_declare_model_formats_and_options(tmp_path, warnings):
    load(
        tmp_path,
        """
        om = register.declare_model("a.om", "OM")
        lite = register.declare_model("b.ms", "mindir_lite")
        opt = register.declare_model("c.ms", "MindIR_Opt")
        context = register.Context(thread_num=2)
        with_context = register.declare_model("d.mindir", "MindIR", context=context, config_file="cfg.ini",
                                              options=register.GpuOptions(precision_mode="fp16"))
        with_options = register.declare_model("e.mindir", "MindIR", options=register.AclOptions(output_type="FP16"),
                                              config_file="/abs/cfg.ini")
        plain = register.declare_model("f.mindir", "MindIR", with_batch_dim=False, without_batch_dim_inputs=[0, 2])
    """,
    )
    models = get_servable_spec("svc").models
    assert models["a.om"].model_format == "OM"
    assert models["b.ms"].model_format == "MindIR_Lite"
    assert models["c.ms"].model_format == "MindIR_Lite"
    assert models["d.mindir"].context.model_context.thread_num == 2
    assert models["d.mindir"].config_file == os.path.join(str(tmp_path), "svc", "cfg.ini")
    assert models["e.mindir"].context.model_context.device_list == [{"output_type": "FP16", "device_type": "ascend"}]
    assert models["e.mindir"].config_file == "/abs/cfg.ini"
    assert models["f.mindir"].with_batch_dim is False
    assert models["f.mindir"].without_batch_dim_inputs == (0, 2)
    assert models["f.mindir"].context is None
    assert any("'options' will be ignored" in msg for msg in warnings)


def test_declare_model_conflicts(tmp_path):
    # MindSpore Serving checks the files first: declaring a model twice reports its file as used
    with raises("Declare model [a.mindir] failed, model file 'a.mindir' has already been used"):
        load(
            tmp_path,
            """
            register.declare_model("a.mindir", "MindIR")
            register.declare_model("a.mindir", "MindIR")
        """,
            name="same",
        )
    with raises("Declare model [tensor_add.mindir] failed, model file 'tensor_add.mindir' has already been used"):
        load(
            tmp_path,
            """
            register.declare_model(["tensor_add.mindir", "tensor_sub.mindir"], "MindIR")
            register.declare_model("tensor_add.mindir", "MindIR")
        """,
            name="subgraph",
        )
    with raises("Declare model [b.mindir, a.mindir] failed, model file 'a.mindir' has already been used"):
        load(
            tmp_path,
            """
            register.declare_model("a.mindir", "MindIR")
            register.declare_model(["b.mindir", "a.mindir"], "MindIR")
        """,
            name="reuse",
        )
    load(tmp_path, "register.declare_model('a.mindir', 'MindIR')\n", name="other")  # another servable may


def test_declare_model_after_distributed(tmp_path):
    from mindspore_serving.spec.registry import get_or_create_servable_spec

    get_or_create_servable_spec("svc").distributed = True
    with raises("Declare model failed, servable has already been declared as distributed servable"):
        load(tmp_path, "register.declare_model('a.mindir', 'MindIR')\n")


# ---------------------------------------------------------------- register_method


def test_register_method_signatures(tmp_path):
    cases = [
        ("def method(x, *args): return x", "'method' input args cannot be VAR_POSITIONAL !"),
        ("def method(x, **kwargs): return x", "'method' input kwargs cannot be VAR_KEYWORD !"),
        ("def method(x, *, y): return x", "'method' input y cannot be KEYWORD_ONLY !"),
    ]
    for index, (definition, text) in enumerate(cases):
        with raises(text):
            load(tmp_path, f"@register.register_method(output_names='y')\n{definition}\n", name=f"svc{index}")


def test_register_method_output_names(tmp_path):
    with raises("Parameter 'output_names' should be str or tuple/list of str, but actually <class 'int'>"):
        load(tmp_path, "@register.register_method(output_names=1)\ndef m(x): return x\n")
    with raises("The item value 'y' in parameter 'output_names' should not be repeated"):
        load(tmp_path, "@register.register_method(output_names=['y', 'y'])\ndef m(x): return x, x\n")


def test_register_method_returns(tmp_path):
    text = (
        "Each value returned is a placeholder for data and must come from the method inputs or the outputs of add_stage"
    )
    for index, body in enumerate(["return 1", "return None", "return x, 2", "return [x, np.ones(1)]"]):
        with raises(text):
            load(tmp_path, f"@register.register_method(output_names='y')\ndef m(x):\n    {body}\n", name=f"svc{index}")
    with raises("Method return output size 2 not match registered 1"):
        load(tmp_path, "@register.register_method(output_names='y')\ndef m(x, z):\n    return x, z\n", name="count1")
    with raises("Method return output size 1 not match registered 2"):
        load(tmp_path, "@register.register_method(output_names=['y', 'z'])\ndef m(x):\n    return x\n", name="count2")


def test_placeholder_from_another_method_is_refused(tmp_path):
    with raises("Each value returned is a placeholder"):
        load(
            tmp_path,
            """
            saved = []
            @register.register_method(output_names="y")
            def first(x):
                saved.append(x)
                return x
            @register.register_method(output_names="y")
            def second(x):
                return saved[0]
        """,
        )


def test_duplicate_method(tmp_path):
    with raises("Method predict has been registered more than once."):
        load(
            tmp_path,
            """
            @register.register_method(output_names="y")
            def predict(x):
                return x
            @register.register_method(output_names="y")
            def predict(x):
                return x
        """,
        )


def test_register_method_returns_the_function(tmp_path):
    module = load(
        tmp_path,
        """
        @register.register_method(output_names="y")
        def predict(x):
            return x
    """,
    )
    assert module.predict.__name__ == "predict"


def test_failed_method_is_not_registered(tmp_path):
    with raises("function fun input args count 1 not match the count 2 registered in method"):
        load(
            tmp_path,
            """
            def fun(x):
                return x
            @register.register_method(output_names="y")
            def predict(x1, x2):
                return register.add_stage(fun, x1, x2, outputs_count=1)
        """,
        )
    assert not get_servable_spec("svc").methods


# ---------------------------------------------------------------- add_stage


def test_add_stage_outside_register_method(tmp_path):
    with raises("'add_stage' should be invoked in the function registered by register_method"):
        load(tmp_path, "def f(x): return x\nregister.add_stage(f, 1, outputs_count=1)\n")


def test_add_stage_parameters(tmp_path):
    placeholder = (
        "Each value of parameter *args is a placeholder for data and must come from the method inputs "
        "or the outputs of add_stage"
    )
    cases = [
        ("register.add_stage(fun, x, 1, outputs_count=1)", placeholder),
        ("register.add_stage(fun, np.ones(2), outputs_count=1)", placeholder),
        (
            "register.add_stage(1, x, outputs_count=1)",
            "Check failed in method 'm', the parameter 'stage' of add_stage must be function or Model returned by "
            "declare_model, now is <class 'int'>",
        ),
        (
            "register.add_stage(register.Model('other.mindir', 'svc', 1), x, outputs_count=1)",
            "Check failed in method 'm', the parameter 'stage' of add_stage must be function or Model returned by "
            "declare_model, and ensure that interface 'declare_model' can take effect when importing "
            "servable_config.py by the serving server",
        ),
        ("register.add_stage(fun, x, outputs_count=0)", "Parameter 'outputs_count' should be >= 1"),
        ("register.add_stage(fun, x, outputs_count='1')", "Parameter 'outputs_count' should be int"),
        ("register.add_stage(fun, x, outputs_count=1, batch_size=-1)", "Parameter 'batch_size' should be >= 0"),
        (
            "register.add_stage(fun, x, outputs_count=1, batch_size=True)",
            "Parameter 'batch_size' should be int, but actually <class 'bool'>",
        ),
        ("register.add_stage(fun, x, outputs_count=1, tag=1)", "Parameter 'tag' should be str, but actually"),
        ("register.add_stage(fun, x, outputs_count=1, tag='')", "Parameter 'tag' should not be empty str"),
        ("register.add_stage('no_such_stage', x, outputs_count=1)", "Stage function 'no_such_stage' is not defined"),
        (
            "register.add_stage(fun, x, x, outputs_count=1)",
            "function fun input args count 1 not match the count 2 registered in method",
        ),
    ]
    for index, (statement, text) in enumerate(cases):
        with raises(text):
            load(
                tmp_path,
                f"""
                def fun(x):
                    return x
                @register.register_method(output_names="y")
                def m(x):
                    return {statement}
            """,
                name=f"svc{index}",
            )


def test_batch_function_arity_is_not_checked(tmp_path):
    load(
        tmp_path,
        """
        def batch(instances):
            return instances
        @register.register_method(output_names="y")
        def m(x1, x2):
            y, z = register.add_stage(batch, x1, x2, outputs_count=2, batch_size=2)
            return y
    """,
    )
    assert get_servable_spec("svc").methods["m"].stages[0].batch_size == 2


def test_stage_function_reuse(tmp_path):
    base = """
        def fun(*args):
            return args
        @register.register_method(output_names="y")
        def first(x1, x2):
            return register.add_stage(fun, x1, x2, outputs_count=1)
        @register.register_method(output_names="y")
        def second(x1, x2):
            return {}
    """
    load(tmp_path, base.format("register.add_stage(fun, x2, x1, outputs_count=1)"), name="ok")
    with raises("Stage function 'inputs.fun' inputs count 1 not match last registered count 2, method name 'second'"):
        load(tmp_path, base.format("register.add_stage(fun, x1, outputs_count=1)"), name="inputs")
    with raises("Stage function 'outputs.fun' outputs count 2 not match last registered count 1, method name 'second'"):
        load(tmp_path, base.format("register.add_stage(fun, x1, x2, outputs_count=2)[0]"), name="outputs")
    with raises(
        "Failed to add stage function batch.fun: parameter 'batch_size' in multiple 'add_stage' should be "
        "enabled or disabled consistently"
    ):
        load(tmp_path, base.format("register.add_stage(fun, x1, x2, outputs_count=1, batch_size=0)"), name="batch")


def test_stage_function_reuse_within_one_method(tmp_path):
    with raises(
        "Failed to add stage function svc.fun: parameter 'batch_size' in multiple 'add_stage' should be "
        "enabled or disabled consistently"
    ):
        load(
            tmp_path,
            """
            def fun(x):
                return x
            @register.register_method(output_names="y")
            def m(x):
                y = register.add_stage(fun, x, outputs_count=1)
                return register.add_stage(fun, y, outputs_count=1, batch_size=1)
        """,
        )


def test_model_io_counts(tmp_path):
    base = """
        model = register.declare_model("add.mindir", "MindIR")
        @register.register_method(output_names="y")
        def first(x1, x2):
            return register.add_stage(model, x1, x2, outputs_count=1)
        @register.register_method(output_names="y")
        def second(x1, x2):
            return {}
    """
    load(tmp_path, base.format("register.add_stage(model, x2, x1, outputs_count=1)"), name="ok")
    assert get_servable_spec("ok").models["add.mindir"].io_counts == {0: (2, 1)}
    with raises("RegisterInputOutputInfo failed, inputs count 1 not match old count 2"):
        load(tmp_path, base.format("register.add_stage(model, x1, outputs_count=1)"), name="inputs")
    with raises("RegisterInputOutputInfo failed, outputs count 2 not match old count 1"):
        load(tmp_path, base.format("register.add_stage(model, x1, x2, outputs_count=2)[0]"), name="outputs")


# ---------------------------------------------------------------- Model.call


class FakeHandler:
    """Runs 'models' whose outputs are (sum of inputs, sum + 1)."""

    def __init__(self, outputs_count=1, error=None):
        self.outputs_count = outputs_count
        self.error = error
        self.calls = []

    def __call__(self, model_key, subgraph, instances):
        self.calls.append((model_key, subgraph, instances))
        if self.error:
            raise RuntimeError(self.error)
        results = []
        for instance in instances:
            total = sum(instance)
            results.append(tuple(total + index for index in range(self.outputs_count)))
        return results


def make_model(subgraph_count=1):
    return register.Model("add.mindir", "svc", subgraph_count)


def test_model_call_single_instance():
    handler = FakeHandler()
    model_module.set_model_call_handler(handler)
    x1, x2 = np.ones((2, 2), np.float32), np.full((2, 2), 2, np.float32)
    y = make_model().call(x1, x2)
    assert isinstance(y, np.ndarray) and np.array_equal(y, np.full((2, 2), 3))
    key, subgraph, instances = handler.calls[0]
    assert key == "add.mindir" and subgraph == 0
    assert len(instances) == 1 and isinstance(instances[0], tuple) and instances[0][0] is x1


def test_model_call_several_outputs_and_instances():
    handler = FakeHandler(outputs_count=2)
    model_module.set_model_call_handler(handler)
    model = make_model(subgraph_count=2)
    y0, y1 = model.call(np.array(1), np.array(2))
    assert (int(y0), int(y1)) == (3, 4)
    results = model.call([[np.array(1), np.array(2)], (np.array(10), np.array(20))], subgraph=1)
    assert isinstance(results, tuple) and len(results) == 2
    assert [tuple(int(v) for v in item) for item in results] == [(3, 4), (30, 31)]
    assert handler.calls[-1][1] == 1


def test_model_call_converts_inputs():
    handler = FakeHandler()
    model_module.set_model_call_handler(handler)

    class TensorLike:
        def asnumpy(self):
            return np.array([1.5], np.float32)

    make_model().call(TensorLike(), 2, 1.5, True, np.float32(3))
    instance = handler.calls[0][2][0]
    assert all(isinstance(value, np.ndarray) for value in instance)
    assert instance[0].dtype == np.float32 and instance[1].dtype == np.int64 and instance[3].dtype == np.bool_


def test_model_call_errors():
    model_module.set_model_call_handler(FakeHandler())
    model = make_model(subgraph_count=2)
    prefix = "Model(add.mindir).call() failed: "
    with raises(prefix + "no inputs provided"):
        model.call()
    with raises(prefix + "inputs format invalid"):
        model.call([np.ones(2), np.ones(2)])
    with raises(prefix + "inputs format invalid"):
        model.call(np.ones(2), "text")
    with raises(prefix + "inputs format invalid"):
        model.call([[np.ones(2)], [b"bytes"]])
    with raises(prefix + "Input instances count is 0"):
        model.call([])
    with raises(
        "Model(add.mindir, subgraph=2).call() failed: The model does not have subgraph of index 2, the "
        "subgraph count of the model is 2"
    ):
        model.call(np.ones(2), subgraph=2)
    with raises("Model(add.mindir, subgraph=1).call() failed: no inputs provided"):
        model.call(subgraph=1)
    with raises("Model(add.mindir, subgraph=-1).call() failed: Parameter 'subgraph' should be >= 0"):
        model.call(np.ones(2), subgraph=-1)


def test_model_call_without_handler():
    with raises("Model(add.mindir).call() failed: the model is not declared"):
        make_model().call(np.ones(2))


def test_model_call_handler_errors_propagate():
    text = (
        "Model(add.mindir).call() failed: The inputs count 1 of instance 0 is not equal to the inputs count 2 of "
        "the model"
    )
    model_module.set_model_call_handler(FakeHandler(error=text))
    with pytest.raises(RuntimeError) as info:
        make_model().call(np.ones(2))
    assert str(info.value) == text


def test_model_call_refuses_placeholders(tmp_path):
    with raises("Model(add.mindir).call() failed: inputs format invalid"):
        load(
            tmp_path,
            """
            model = register.declare_model("add.mindir", "MindIR")
            @register.register_method(output_names="y")
            def m(x):
                return model.call(x)
        """,
        )


def test_model_call_from_declared_model(tmp_path):
    module = load(
        tmp_path,
        """
        model = register.declare_model(["m0.mindir", "m1.mindir"], "MindIR")
        def process(x1, x2):
            return model.call(x1, subgraph=0), model.call(x2, subgraph=1)
        @register.register_method(output_names=["y1", "y2"])
        def predict(x1, x2):
            return register.add_stage(process, x1, x2, outputs_count=2)
    """,
    )
    handler = FakeHandler()
    model_module.set_model_call_handler(handler)
    y1, y2 = module.process(np.array(1), np.array(2))
    assert (int(y1), int(y2)) == (1, 2)
    assert [(key, subgraph) for key, subgraph, _ in handler.calls] == [
        ("m0.mindir;m1.mindir", 0),
        ("m0.mindir;m1.mindir", 1),
    ]
    assert get_servable_spec("svc").models["m0.mindir;m1.mindir"].io_counts == {}


# ---------------------------------------------------------------- deprecated interfaces


def test_declare_servable(tmp_path, warnings):
    load(tmp_path, "model = register.declare_servable('add.mindir', 'MindIR', with_batch_dim=False)\n")
    assert get_servable_spec("svc").models["add.mindir"].with_batch_dim is False
    assert (
        "'declare_servable' is deprecated from version 1.5.0 and will be removed in a future version, use "
        "'mindspore_serving.server.register.declare_model' instead."
    ) in warnings


LEGACY = textwrap.dedent("""
    model = register.declare_servable("add.mindir", "MindIR")

    def preprocess(x1, x2):
        return x1, x2

    def preprocess_batch(instances):
        return instances

    def postprocess(y):
        return y

    def postprocess_batch(instances):
        return instances

""")


def test_legacy_pipeline(tmp_path, warnings):
    load(
        tmp_path,
        LEGACY
        + textwrap.dedent("""
        @register.register_method(output_names=["y", "z"])
        def predict(x1, x2):
            \"\"\"A docstring is fine.\"\"\"
            x1, x2 = register.call_preprocess(preprocess, x1, x2)
            y, z = register.call_servable(x1, x2)
            y = register.call_postprocess(postprocess, y)
            return y, z

        @register.register_method(output_names="y")
        def pipeline(x1, x2):
            x1, x2 = register.call_preprocess_pipeline(preprocess_batch, x1, x2)
            y, z = register.call_servable(x1, x2)
            y = register.call_postprocess_pipeline(postprocess_batch, y)
            return y

        @register.register_method(output_names=["y", "z"])
        def servable_only(x1, x2):
            return register.call_servable(x1, x2)
    """),
    )
    methods = get_servable_spec("svc").methods
    pre, infer, post = methods["predict"].stages
    assert (pre.tag, pre.outputs_count, pre.batch_size) == ("Preprocess", 2, None)
    assert (infer.kind, infer.model_key, infer.outputs_count) == (STAGE_MODEL, "add.mindir", 2)
    assert (post.tag, post.outputs_count, post.batch_size) == ("Postprocess", 1, None)
    assert methods["predict"].outputs == [TensorRef(3, 0), TensorRef(2, 1)]
    pre, _, post = methods["pipeline"].stages
    assert pre.batch_size == 0 and post.batch_size == 0
    assert methods["servable_only"].stages[0].outputs_count == 2
    for name in (
        "call_preprocess",
        "call_preprocess_pipeline",
        "call_servable",
        "call_postprocess",
        "call_postprocess_pipeline",
    ):
        assert (
            f"'{name}' is deprecated from version 1.5.0 and will be removed in a future version, use "
            f"'mindspore_serving.server.register.add_stage' instead."
        ) in warnings


def _complex(interface):
    return (
        f"Failed to parse method 'm', complex statements such as conditions and loops are not supported in "
        f"register_method when the interface '{interface}' is used, use 'add_stage' to replace '{interface}'"
    )


@pytest.mark.parametrize(
    "body, text",
    [
        (
            "y = register.call_servable(x1, x2)\n    x1 = register.call_preprocess(preprocess1, x1)\n    return y",
            "Check failed in method 'm', call_servable should be invoked after call_preprocess",
        ),
        (
            "y = register.call_servable(x1, x2)\n    x1 = register.call_preprocess_pipeline(preprocess1, x1)\n"
            "    return y",
            "Check failed in method 'm', call_servable should be invoked after call_preprocess_pipeline",
        ),
        (
            "x1 = register.call_preprocess(preprocess1, x1)\n"
            "    x1 = register.call_preprocess_pipeline(preprocess1, x1)\n"
            "    return register.call_servable(x1, x2)",
            "Check failed in method 'm', call_preprocess or call_preprocess_pipeline should not be invoked more than "
            "once",
        ),
        (
            "x1 = register.call_preprocess_pipeline(preprocess1, x1)\n"
            "    x1 = register.call_preprocess(preprocess1, x1)\n"
            "    return register.call_servable(x1, x2)",
            "Check failed in method 'm', call_preprocess or call_preprocess_pipeline should not be invoked more than "
            "once",
        ),
        (
            "y = register.call_servable(x1, x2)\n    y = register.call_servable(x1, x2)\n    return y",
            "Check failed in method 'm', call_servable should not be invoked more than once",
        ),
        (
            "y = register.call_postprocess(postprocess, x1)\n    y = register.call_servable(x1, x2)\n    return y",
            "Check failed in method 'm', call_postprocess or call_postprocess_pipeline should be invoked after "
            "call_servable",
        ),
        (
            "y = register.call_postprocess_pipeline(postprocess, x1)\n    y = register.call_servable(x1, x2)\n"
            "    return y",
            "Check failed in method 'm', call_postprocess or call_postprocess_pipeline should be invoked after "
            "call_servable",
        ),
        (
            "y = register.call_postprocess(postprocess, x2)\n    x1 = register.call_preprocess(preprocess1, x1)\n"
            "    y = register.call_servable(x1, x2)\n    return y",
            "Check failed in method 'm', call_postprocess or call_postprocess_pipeline should be invoked after "
            "call_preprocess",
        ),
        (
            "y = register.call_postprocess_pipeline(postprocess, x2)\n"
            "    x1 = register.call_preprocess_pipeline(preprocess1, x1)\n    y = register.call_servable(x1, x2)\n"
            "    return y",
            "Check failed in method 'm', call_postprocess or call_postprocess_pipeline should be invoked after "
            "call_preprocess_pipeline",
        ),
        (
            "y = register.call_servable(x1, x2)\n    y = register.call_postprocess(postprocess, y)\n"
            "    y = register.call_postprocess_pipeline(postprocess, y)\n    return y",
            "Check failed in method 'm', call_postprocess or call_postprocess_pipeline should not be invoked more "
            "than once",
        ),
        (
            "x1 = register.call_preprocess(preprocess1, x1)\n    y = register.call_postprocess(postprocess, x1)\n"
            "    return y",
            "Not find the invoke of 'call_servable'",
        ),
        # a call_* only inside a condition: the call itself fails, naming its interface
        (
            "if True:\n        y = register.call_servable(x1, x2)\n        return y\n    return x1",
            _complex("call_servable"),
        ),
        (
            "if True:\n        y = register.call_preprocess(preprocess1, x1)\n        return y\n    return x1",
            _complex("call_preprocess"),
        ),
        (
            "if True:\n        y = register.call_preprocess_pipeline(preprocess1, x1)\n        return y\n    return x1",
            _complex("call_preprocess_pipeline"),
        ),
        (
            "if True:\n        y = register.call_postprocess(postprocess, x1)\n        return y\n    return x1",
            _complex("call_postprocess"),
        ),
        (
            "if True:\n        y = register.call_postprocess_pipeline(postprocess, x1)\n        return y\n"
            "    return x1",
            _complex("call_postprocess_pipeline"),
        ),
        # top-level call_* beside a condition: the parse fails, naming the top-level calls
        (
            "y = register.call_preprocess(preprocess1, x1)\n    if True:\n"
            "        y = register.call_postprocess(postprocess, y)"
            "\n        return y\n    return y",
            _complex("call_preprocess"),
        ),
        (
            "if True:\n        y = register.call_postprocess(postprocess, x1)\n        return y\n"
            "    y = register.call_preprocess(preprocess1, x1)\n    return y",
            _complex("call_preprocess"),
        ),
        ("for _ in range(1):\n        y = register.call_servable(x1, x2)\n    return y", _complex("call_servable")),
        # mixed with add_stage
        (
            "y = register.call_preprocess(preprocess1, x1)\n    y = register.call_servable(y, x2)\n"
            "    y = register.call_postprocess(postprocess, y)\n"
            "    y = register.add_stage(preprocess1, y, outputs_count=1)\n"
            "    return y",
            _complex("call_preprocess;call_servable;call_postprocess"),
        ),
        (
            "y = register.add_stage(preprocess1, x1, outputs_count=1)\n"
            "    y = register.call_preprocess(preprocess1, y)\n"
            "    y = register.call_servable(y, x2)\n    return y",
            _complex("call_preprocess;call_servable"),
        ),
        (
            "if True:\n        y = register.call_postprocess(postprocess, x1)\n        return y\n"
            "    y = register.add_stage(preprocess1, x1, outputs_count=1)\n    return y",
            _complex("call_postprocess"),
        ),
        (
            "y = register.call_preprocess(preprocess1)\n    return register.call_servable(y, x2)",
            "Invalid 'call_preprocess' invoke args",
        ),
    ],
)
def test_legacy_order_and_statement_checks(tmp_path, warnings, body, text):
    with raises(text):
        load(
            tmp_path,
            LEGACY + "def preprocess1(x):\n    return x\n"
            "@register.register_method(output_names='y')\n"
            f"def m(x1, x2):\n    {body}\n",
        )


def test_legacy_complex_statement_names_the_code(tmp_path, warnings):
    with pytest.raises(RuntimeError) as info:
        load(
            tmp_path,
            LEGACY
            + textwrap.dedent("""
            @register.register_method(output_names='y')
            def m(x1, x2):
                y = register.call_servable(x1, x2)
                if True:
                    y = x1
                return y
        """),
        )
    lines = (tmp_path / "svc" / "servable_config.py").read_text().split("\n")
    line = lines.index("    if True:") + 1
    assert str(info.value) == (
        _complex("call_servable") + f", code <class 'ast.If'>: line {line}~{line + 1} in m, "
        f"code: \n    if True:\n        y = x1\n"
    )


def test_legacy_stage_count_must_match_the_source(tmp_path, warnings):
    with raises(
        "Failed to parse method m, the number of stages obtained through the AST 1 is inconsistent with the "
        "running result 2. Condition and loop statements are not supported in methods currently."
    ):
        load(
            tmp_path,
            LEGACY
            + textwrap.dedent("""
            def helper(x):
                return register.add_stage(postprocess, x, outputs_count=1)

            @register.register_method(output_names='y')
            def m(x1, x2):
                y = register.call_servable(x1, x2)
                helper(y)
                return y
        """),
        )


def test_legacy_call_from_a_helper_is_refused(tmp_path, warnings):
    with raises(_complex("call_servable")):
        load(
            tmp_path,
            LEGACY
            + textwrap.dedent("""
            def helper(x1, x2):
                return register.call_servable(x1, x2)

            @register.register_method(output_names='y')
            def m(x1, x2):
                return helper(x1, x2)
        """),
        )


def test_legacy_call_servable_without_model(tmp_path, warnings):
    with raises("There is no model declared, you can use declare_model to declare models."):
        load(
            tmp_path,
            """
            @register.register_method(output_names="y")
            def m(x1, x2):
                return register.call_servable(x1, x2)
        """,
        )
    reset_registry()
    with raises(
        "There are more than one servable declared when the interface 'call_servable' is used, use "
        "'add_stage' to replace 'call_servable'"
    ):
        load(
            tmp_path,
            """
            a = register.declare_model("a.mindir", "MindIR")
            b = register.declare_model("b.mindir", "MindIR")
            @register.register_method(output_names="y")
            def m(x1, x2):
                return register.call_servable(x1, x2)
        """,
            name="two",
        )


def test_legacy_outside_register_method(tmp_path, warnings):
    with raises("'call_servable' should be invoked in the function registered by register_method"):
        load(tmp_path, "register.call_servable(1)\n")
