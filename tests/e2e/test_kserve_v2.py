"""KServe v2 / Triton protocol end to end: a real server with `add` and `lenet`, driven by the real Triton
client (tritonclient) from .venv-clients, since tritonclient's protobuf range excludes the server's.
Each test runs one check of client_checks/triton_checks.py as a subprocess."""

import os
import subprocess

import pytest
from serving_process import ROOT, SERVABLES, start_server

CLIENT_PYTHON = os.path.join(ROOT, ".venv-clients", "bin", "python")
CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client_checks", "triton_checks.py")

if not os.path.exists(CLIENT_PYTHON):
    if os.environ.get("MAKELEVEL"):  # `make test` builds .venv-clients first: its absence is a failure there
        raise RuntimeError(f"{CLIENT_PYTHON} is missing although make should have built it")
    pytest.skip(
        "the Triton client virtualenv .venv-clients is missing: run `make clients` (or `make test`)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, grpc_addr, rest_addr = start_server(
        tmp_path_factory.mktemp("kserve_v2"), servables=("add", "lenet"), extra_args=("--model_control", "explicit")
    )
    try:
        yield grpc_addr, rest_addr
    finally:
        proc.close()


@pytest.mark.parametrize("check", ["metadata", "http_infer", "async_http", "grpc_infer", "bad_inputs", "repository"])
def test_triton_client(server, check, tmp_path):
    grpc_addr, rest_addr = server
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [
            CLIENT_PYTHON,
            CHECKS,
            "--http",
            rest_addr,
            "--grpc",
            grpc_addr,
            "--images",
            os.path.join(SERVABLES, "lenet", "images"),
            check,
        ],
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=120,
    )
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0 and f"PASS {check}" in output, output
