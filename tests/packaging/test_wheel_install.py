"""The wheel alone: installed into a fresh venv with nothing but its declared dependencies, every module of the
package imports and the `mindspore-serving` command runs, so a dependency the code imports but pyproject.toml does
not declare fails here. The wheel also carries the generated protobuf modules and the bundled tiny model.

`make package-test` builds the wheel (dist/) and passes it in MS_SERVING_WHEEL; run alone, the module builds one
from a copy of the sources. The venv is made by uv when it is installed (it links the packages from its cache: seconds),
else by venv and pip (minutes). requirements.txt constrains the versions resolved (it adds no package), so that the
venv holds the pinned versions the rest of the suite runs.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "mindspore_serving"
INSTALL_TIMEOUT_S = 900  # pip without a cache downloads MindSpore; uv from its cache takes seconds

pytestmark = pytest.mark.packaging

# Runs in the fresh venv: imports every module of the package, prints what failed and where it was imported from.
IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, traceback
import mindspore_serving
failed, imported = {}, 0
for info in pkgutil.walk_packages(mindspore_serving.__path__, "mindspore_serving.", onerror=lambda name: None):
    try:
        importlib.import_module(info.name)
        imported += 1
    except BaseException:
        failed[info.name] = traceback.format_exc(limit=-3)
print(json.dumps({"file": mindspore_serving.__file__, "imported": imported, "failed": failed}))
"""


def _clean_env() -> dict[str, str]:
    """This environment without what would let the venv see other packages (PYTHONPATH, an active venv)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(args, cwd, timeout=INSTALL_TIMEOUT_S) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def _build_wheel(out_dir: pathlib.Path) -> pathlib.Path:
    """A wheel built from a copy of the sources, so that neither the tree's build/ nor its egg-info is touched."""
    source = out_dir / "source"
    shutil.copytree(ROOT / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out_dir, source],
        out_dir,
    )
    (wheel,) = out_dir.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    given = os.environ.get("MS_SERVING_WHEEL")
    if given:
        return pathlib.Path(given).resolve()
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> pathlib.Path:
    """A fresh venv of this interpreter holding the wheel and what it declares, nothing else."""
    where = tmp_path_factory.mktemp("fresh")
    venv = where / "venv"
    python = venv / "bin" / "python"
    uv = shutil.which("uv", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    constraints = ["--constraint", ROOT / "requirements.txt"]
    if uv:
        _run([uv, "venv", "-q", "--python", sys.executable, venv], where)
        _run([uv, "pip", "install", "-q", "--python", python, *constraints, wheel], where)
    else:
        _run([sys.executable, "-m", "venv", venv], where)
        _run([python, "-m", "pip", "install", "-q", *constraints, wheel], where)
    return venv


def test_every_module_imports_with_the_declared_dependencies_alone(venv):
    # -I: neither the current directory nor PYTHONPATH on sys.path, so the installed copy is the one imported
    result = _run([venv / "bin" / "python", "-I", "-c", IMPORT_EVERY_MODULE], venv.parent, timeout=300)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert pathlib.Path(report["file"]).is_relative_to(venv), report["file"]
    assert report["failed"] == {}, "\n".join(f"{name}:\n{trace}" for name, trace in report["failed"].items())
    assert report["imported"] > 100


@pytest.mark.parametrize("command,flag", [("serve", "--servable_directory"), ("agent", "--config")])
def test_the_console_command_runs_from_the_venv(venv, command, flag):
    result = _run([venv / "bin" / "mindspore-serving", command, "--help"], venv.parent, timeout=120)
    assert result.stdout.startswith(f"usage: mindspore-serving {command}")
    assert flag in result.stdout


def test_the_wheel_holds_the_protobuf_modules_and_the_tiny_model(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    protos = sorted(p.stem for p in (ROOT / PACKAGE / "proto").glob("*.proto"))
    assert protos
    for stem in protos:
        for suffix in (".proto", "_pb2.py", "_pb2_grpc.py"):
            assert f"{PACKAGE}/proto/{stem}{suffix}" in names
    tiny = sorted(p.name for p in (ROOT / PACKAGE / "models" / "llama" / "tiny").iterdir())
    assert {f"{PACKAGE}/models/llama/tiny/{name}" for name in tiny} <= names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    assert "mindspore-serving = mindspore_serving.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
