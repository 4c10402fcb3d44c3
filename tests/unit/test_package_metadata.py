"""pyproject.toml against the code and the pinned requirements: the runtime dependencies are exactly the
distributions the package imports (read from its sources, imports inside functions included), and
requirements*.txt pin versions inside the declared ranges. The fresh-venv install of tests/packaging proves the
same at run time; this finds it in a second, and also what a transitive dependency would hide there (starlette
arriving through fastapi)."""

import ast
import importlib.metadata
import pathlib
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mindspore_serving"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

# modules the package imports that no runtime dependency provides: (module, the only file importing it, why)
NOT_RUNTIME = {"grpc_tools": ("proto/generate.py", "`make proto` regenerates the protobuf modules (the [dev] extra)")}
# declared dependencies the package never names in an import: (why they are needed)
IMPORTED_INDIRECTLY = {"httptools": "frontends/http_protocol.py subclasses uvicorn's httptools protocol"}


def _requirements(extra: str | None = None) -> dict[str, Requirement]:
    items = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return {canonicalize_name(r.name): r for r in map(Requirement, items)}


def _pins(*files: str) -> dict[str, str]:
    """name -> pinned version of requirements files (`-r` lines are followed by listing the files)."""
    pins = {}
    for name in files:
        for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                requirement = Requirement(line)
                (spec,) = requirement.specifier
                assert spec.operator == "==", f"{name}: {line} is not pinned"
                pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def _imports() -> dict[str, set[str]]:
    """Top-level third-party module -> the package's files importing it."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".", 1)[0]
                if top not in sys.stdlib_module_names and top != PACKAGE.name:
                    found.setdefault(top, set()).add(path.relative_to(PACKAGE).as_posix())
    return found


def test_every_imported_distribution_is_a_runtime_dependency_and_nothing_else_is():
    providers = importlib.metadata.packages_distributions()
    declared = _requirements()
    used = set()
    for module, files in sorted(_imports().items()):
        if module in NOT_RUNTIME:
            assert files == {NOT_RUNTIME[module][0]}, f"{module} is imported at run time by {sorted(files)}"
            continue
        names = {canonicalize_name(d) for d in providers.get(module, [])}
        assert names & set(declared), f"{module} (imported by {sorted(files)}) comes from {names or '?'}: not declared"
        used |= names & set(declared)
    assert set(declared) - used == set(IMPORTED_INDIRECTLY), "declared but never imported"


def test_the_pinned_requirements_lie_inside_the_declared_ranges():
    runtime = _pins("requirements.txt")
    examples = _requirements("examples")
    assert set(runtime) == set(_requirements()) | set(examples), "requirements.txt is the runtime lock (+ examples)"
    for extra, files in (
        (None, ["requirements.txt"]),
        ("examples", ["requirements.txt"]),
        ("bench", ["requirements-bench.txt"]),
        ("dev", ["requirements.txt", "requirements-dev.txt"]),
    ):
        pins = _pins(*files)
        for name, requirement in _requirements(extra).items():
            assert name in pins, f"{requirement} ({extra or 'runtime'}) is not pinned in {files}"
            assert requirement.specifier.contains(pins[name]), f"{files}: {name}=={pins[name]} is not {requirement}"
    assert set(_pins("requirements-bench.txt")) == set(_requirements("bench"))


def test_requires_the_python_the_code_needs():
    # asyncio.timeout and BaseExceptionGroup are 3.11's
    assert PROJECT["requires-python"] == ">=3.11"
    assert PROJECT["scripts"] == {"mindspore-serving": "mindspore_serving.cli:main"}
