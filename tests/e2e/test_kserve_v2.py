"""KServe v2 / Triton protocol end to end: a real server with `add` and `lenet`, driven by the real Triton
client (tritonclient) from .venv-clients, since tritonclient's protobuf range excludes the server's.
Each test runs one check of client_checks/triton_checks.py as a subprocess."""

import os

import pytest
from client_venv import MISSING, clients_missing, run_check
from serving_process import SERVABLES, start_server

if clients_missing():
    pytest.skip(MISSING, allow_module_level=True)


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
    run_check(
        "triton_checks.py",
        "--http",
        rest_addr,
        "--grpc",
        grpc_addr,
        "--images",
        os.path.join(SERVABLES, "lenet", "images"),
        check,
        cwd=str(tmp_path),
    )
