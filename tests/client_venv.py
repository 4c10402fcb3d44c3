"""The real clients' own virtualenv, .venv-clients (`make clients`, requirements-clients.txt: their pins cannot share
.venv with MindSpore's), and running a script of tests/e2e/client_checks in it."""

import os
import subprocess

import pytest
from serving_process import ROOT

CLIENT_PYTHON = os.path.join(ROOT, ".venv-clients", "bin", "python")
CHECKS = os.path.join(ROOT, "tests", "e2e", "client_checks")
MISSING = "the clients' virtualenv .venv-clients is missing: run `make clients` (or `make test`)"


def clients_missing() -> bool:
    """Whether .venv-clients is missing; under make, which builds it first, its absence is an error."""
    if os.path.exists(CLIENT_PYTHON):
        return False
    if os.environ.get("MAKELEVEL"):
        raise RuntimeError(f"{CLIENT_PYTHON} is missing although make should have built it")
    return True


def require_clients() -> None:
    """Skips the calling test where .venv-clients is missing (outside make)."""
    if clients_missing():
        pytest.skip(MISSING)


def run_check(script: str, *args: str, cwd=None) -> None:
    """Runs client_checks/`script` with `args` in .venv-clients and asserts it printed `PASS <its last arg>`."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [CLIENT_PYTHON, os.path.join(CHECKS, script), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=120,
        check=False,
    )
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0 and f"PASS {args[-1]}" in output, output
