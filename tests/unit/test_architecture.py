"""The package's architecture: the import contracts of .importlinter hold, would fail on the cycles the
layout removed, and every import inside a function says why it is there."""

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mindspore_serving"
LINT_IMPORTS = pathlib.Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")


def lint(cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(cwd / ".importlinter")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


# each one a cycle or a leak the layout removed: (module that would import, what it would import)
VIOLATIONS = [
    ("master/master.py", "from mindspore_serving.server import stop"),
    ("master/master.py", "from mindspore_serving.server.master import context"),
    ("worker/method_runner.py", "from mindspore_serving.server.register import model"),
    ("server/register/method.py", "from mindspore_serving.worker import method_runner"),
    ("agent/process.py", "from mindspore_serving.worker import model_backend"),
    ("llm/engine.py", "from mindspore_serving.models.llama import config"),
    ("master/llm_backend.py", "from mindspore_serving.frontends import errors"),
    ("worker/llm/runtime.py", "from mindspore_serving.agent import process"),
    ("common/errors.py", "from mindspore_serving.llm import errors"),
]


@pytest.mark.parametrize("module,statement", VIOLATIONS)
def test_contracts_fail_on_a_removed_cycle(tmp_path, module, statement):
    shutil.copytree(PACKAGE, tmp_path / "mindspore_serving", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    with open(tmp_path / "mindspore_serving" / module, "a", encoding="utf-8") as source:
        # inside a function: import-linter sees those too
        source.write(f"\n\ndef _violation():\n    {statement}  # noqa\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout.upper() and "is not allowed to import" in result.stdout


def _function_imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    yield inner.lineno


def test_every_import_inside_a_function_gives_its_reason():
    missing = []
    for path in PACKAGE.rglob("*.py"):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for lineno in _function_imports(path):
            line, above = lines[lineno - 1], lines[lineno - 2].strip() if lineno > 1 else ""
            if "#" not in line and not above.startswith("#"):
                missing.append(f"{os.path.relpath(path, ROOT)}:{lineno}: {line.strip()}")
    assert not missing, "imports inside functions without a reason comment:\n" + "\n".join(sorted(set(missing)))


def test_test_modules_have_unique_names():
    """pytest imports test modules by their base name (the test folders are not packages): two files of one name in
    different folders stop the whole run at collection."""
    tests = os.path.join(ROOT, "tests")
    names = [
        name for _, _, files in os.walk(tests) for name in files if name.startswith("test_") and name.endswith(".py")
    ]
    assert sorted({n for n in names if names.count(n) > 1}) == []
