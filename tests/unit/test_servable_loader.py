"""Finding the version directory and importing servable_config.py inside a worker (no models are loaded)."""

import itertools
import os
import sys
import textwrap

import pytest

from mindspore_serving.spec import model_call as model_module
from mindspore_serving.spec.registry import reset_registry
from mindspore_serving.worker.servable_loader import (
    import_servable_config,
    load_servable,
    newest_version_number,
    resolve_version,
)

_names = itertools.count()
PREFIX = "loader_servable_"


@pytest.fixture(autouse=True)
def clean_imports():
    """Each test imports its own `<name>.servable_config`; forget it, the registry and the sys.path entry after."""
    path_before = list(sys.path)
    reset_registry()
    yield
    reset_registry()
    model_module.set_model_call_handler(None)
    sys.path[:] = path_before
    for name in [name for name in sys.modules if name.startswith(PREFIX)]:
        del sys.modules[name]


def unique_name():
    return f"{PREFIX}{os.getpid()}_{next(_names)}"


def write_config(directory, name, body):
    servable = directory / name
    servable.mkdir(parents=True, exist_ok=True)
    (servable / "servable_config.py").write_text(
        "from mindspore_serving.server import register\n" + textwrap.dedent(body)
    )
    return servable


# ---------------------------------------------------------------- newest_version_number


def test_newest_version_is_the_largest_numeric_directory(tmp_path):
    for name in ("1", "3", "10", "2", "abc", "v4", "-5"):
        (tmp_path / name).mkdir()
    (tmp_path / "99").write_text("a file, not a version directory")
    assert newest_version_number(str(tmp_path)) == 10


def test_newest_version_compares_numbers_not_text(tmp_path):
    for name in ("9", "10", "010"):
        (tmp_path / name).mkdir()
    assert newest_version_number(str(tmp_path)) == 10


def test_no_version_directory_gives_0(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "servable_config.py").write_text("")
    assert newest_version_number(str(tmp_path)) == 0


def test_missing_servable_directory_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        newest_version_number(str(tmp_path / "absent"))


# ---------------------------------------------------------------- resolve_version


def test_servable_without_models_needs_no_version_directory(tmp_path):
    assert resolve_version(str(tmp_path), "svc", 0, has_models=False) == 1
    assert resolve_version(str(tmp_path), "svc", 3, has_models=False) == 3


def test_version_0_means_newest(tmp_path):
    for name in ("1", "2", "7"):
        (tmp_path / "svc" / name).mkdir(parents=True)
    assert resolve_version(str(tmp_path), "svc", 0, has_models=True) == 7
    assert resolve_version(str(tmp_path), "svc", 2, has_models=True) == 2


def test_models_without_any_version_directory(tmp_path):
    (tmp_path / "svc").mkdir()
    with pytest.raises(RuntimeError) as info:
        resolve_version(str(tmp_path), "svc", 0, has_models=True)
    assert str(info.value) == (
        f"There is no valid version directory of models while there are models declared in "
        f"servable_config.py, servable directory: {tmp_path}, servable name: svc"
    )
    # MindSpore Serving looks for any version directory before the one asked for
    with pytest.raises(RuntimeError, match="There is no valid version directory of models"):
        resolve_version(str(tmp_path), "svc", 2, has_models=True)


def test_missing_specified_version_directory(tmp_path):
    (tmp_path / "svc" / "1").mkdir(parents=True)
    with pytest.raises(RuntimeError) as info:
        resolve_version(str(tmp_path), "svc", 2, has_models=True)
    assert str(info.value) == (
        f"Raise failed: Start servable failed: There is no specified version directory of models, specified "
        f"version number: 2, servable directory: '{tmp_path}', servable name: 'svc'"
    )


def test_a_file_named_like_the_version_is_not_a_version_directory(tmp_path):
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "1").write_text("not a directory")
    with pytest.raises(RuntimeError, match="There is no valid version directory of models"):
        resolve_version(str(tmp_path), "svc", 1, has_models=True)
    (tmp_path / "svc" / "2").mkdir()
    with pytest.raises(RuntimeError, match="specified version number: 1,"):
        resolve_version(str(tmp_path), "svc", 1, has_models=True)


# ---------------------------------------------------------------- import_servable_config


def test_import_returns_the_declarations(tmp_path):
    name = unique_name()
    write_config(
        tmp_path,
        name,
        """
        model = register.declare_model("net.mindir", "MindIR")

        @register.register_method(output_names="y")
        def predict(x):
            return register.add_stage(model, x, outputs_count=1)
    """,
    )
    spec = import_servable_config(str(tmp_path), name)
    assert spec.name == name
    assert list(spec.models) == ["net.mindir"]
    assert list(spec.methods) == ["predict"]
    assert sys.path[0] == str(tmp_path)


def test_import_does_not_add_the_directory_twice(tmp_path):
    name = unique_name()
    write_config(
        tmp_path,
        name,
        """
        @register.register_method(output_names="y")
        def echo(y):
            return y
    """,
    )
    sys.path.insert(0, str(tmp_path))
    import_servable_config(str(tmp_path), name)
    assert sys.path.count(str(tmp_path)) == 1


def test_import_error_in_servable_config(tmp_path):
    name = unique_name()
    write_config(
        tmp_path,
        name,
        """
        raise ValueError("broken config")
    """,
    )
    with pytest.raises(RuntimeError) as info:
        import_servable_config(str(tmp_path), name)
    assert str(info.value) == f"import {name}.servable_config failed, broken config"
    assert isinstance(info.value.__cause__, ValueError)


def test_register_error_in_servable_config(tmp_path):
    name = unique_name()
    write_config(
        tmp_path,
        name,
        """
        @register.register_method(output_names=["y", "z"])
        def predict(x):
            return x
    """,
    )
    with pytest.raises(RuntimeError) as info:
        import_servable_config(str(tmp_path), name)
    assert str(info.value) == (
        f"import {name}.servable_config failed, Method return output size 1 not match registered 2"
    )


def test_import_of_a_missing_servable(tmp_path):
    name = unique_name()
    with pytest.raises(RuntimeError) as info:
        import_servable_config(str(tmp_path), name)
    assert str(info.value) == f"import {name}.servable_config failed, No module named '{name}'"


def test_import_of_a_servable_directory_without_servable_config(tmp_path):
    name = unique_name()
    (tmp_path / name).mkdir()
    with pytest.raises(RuntimeError) as info:
        import_servable_config(str(tmp_path), name)
    assert str(info.value) == f"import {name}.servable_config failed, No module named '{name}.servable_config'"


def test_syntax_error_in_servable_config(tmp_path):
    name = unique_name()
    servable = tmp_path / name
    servable.mkdir()
    (servable / "servable_config.py").write_text("def broken(:\n")
    with pytest.raises(RuntimeError, match=rf"^import {name}\.servable_config failed, invalid syntax"):
        import_servable_config(str(tmp_path), name)


def test_config_that_declares_nothing_gives_none(tmp_path):
    name = unique_name()
    write_config(tmp_path, name, "X = 1\n")
    assert import_servable_config(str(tmp_path), name) is None


# ---------------------------------------------------------------- load_servable (errors raised before any model load)


def test_load_without_methods(tmp_path):
    name = unique_name()
    write_config(
        tmp_path,
        name,
        """
        model = register.declare_model("net.mindir", "MindIR")
    """,
    )
    with pytest.raises(RuntimeError) as info:
        load_servable(str(tmp_path), name, 0, "cpu", 0)
    assert str(info.value) == "Raise failed: There is no method registered for servable"


def test_load_with_an_empty_config(tmp_path):
    name = unique_name()
    write_config(tmp_path, name, "")
    with pytest.raises(RuntimeError) as info:
        load_servable(str(tmp_path), name, 0, "cpu", 0)
    assert str(info.value) == "Raise failed: There is no method registered for servable"


def test_load_with_models_but_no_version_directory(tmp_path):
    name = unique_name()
    write_config(
        tmp_path,
        name,
        """
        model = register.declare_model("net.mindir", "MindIR")

        @register.register_method(output_names="y")
        def predict(x):
            return register.add_stage(model, x, outputs_count=1)
    """,
    )
    with pytest.raises(RuntimeError) as info:
        load_servable(str(tmp_path), name, 0, "cpu", 0)
    assert str(info.value) == (
        f"There is no valid version directory of models while there are models declared in "
        f"servable_config.py, servable directory: {tmp_path}, servable name: {name}"
    )


def test_load_with_a_missing_version(tmp_path):
    name = unique_name()
    servable = write_config(
        tmp_path,
        name,
        """
        model = register.declare_model("net.mindir", "MindIR")

        @register.register_method(output_names="y")
        def predict(x):
            return register.add_stage(model, x, outputs_count=1)
    """,
    )
    (servable / "1").mkdir()
    with pytest.raises(RuntimeError, match=r"specified version number: 3, servable directory: "):
        load_servable(str(tmp_path), name, 3, "cpu", 0)


def test_load_failure_names_files_context_and_reason(tmp_path):
    pytest.importorskip("mindspore")
    name = unique_name()
    servable = write_config(
        tmp_path,
        name,
        """
        context = register.Context(thread_num=2)
        model = register.declare_model(["net.mindir", "net2.mindir"], "MindIR", context=context)

        @register.register_method(output_names="y")
        def predict(x):
            return register.add_stage(model, x, outputs_count=1)
    """,
    )
    (servable / "1").mkdir()
    with pytest.raises(RuntimeError) as info:
        load_servable(str(tmp_path), name, 1, "cpu", 0)
    assert str(info.value) == (
        f"Raise failed: Load model failed, servable directory: '{tmp_path}', servable name: '{name}', model "
        f"file: '[net.mindir, net2.mindir]', version number 1,model context: {{thread num: 2}}, "
        f"load error details: model file '{servable / '1' / 'net.mindir'}' not exist"
    )


def test_a_model_context_naming_a_core_the_worker_cannot_use_fails_the_load(tmp_path):
    pytest.importorskip("mindspore")
    name = unique_name()
    affinity = os.sched_getaffinity(0)
    core = min(affinity)
    servable = write_config(
        tmp_path,
        name,
        f"""
        model = register.declare_model("net.mindir", "MindIR",
                                       context=register.Context(thread_affinity_core_list=[{core}, 4096]))

        @register.register_method(output_names="y")
        def predict(x):
            return register.add_stage(model, x, outputs_count=1)
    """,
    )
    (servable / "1").mkdir()
    with pytest.raises(
        RuntimeError,
        match=rf"servable {name}: thread_affinity_core_list \[{core}, 4096\] names "
        rf"core\(s\) \[4096\] this worker cannot run on \(its cores: \[",
    ):
        load_servable(str(tmp_path), name, 1, "cpu", 0)
    assert os.sched_getaffinity(0) == affinity  # nothing was bound
