"""The example clients servables/<name>/serving_client.py, each run as a script against serving_server.py."""

import os
import subprocess
import sys

import pytest
from serving_process import SERVABLES, start_server

EXAMPLES = ("add", "add_sub", "matmul", "lenet")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, grpc_addr, rest_addr = start_server(tmp_path_factory.mktemp("example_clients"), servables=EXAMPLES)
    try:
        yield grpc_addr, rest_addr
    finally:
        proc.close()


@pytest.mark.parametrize("servable", EXAMPLES)
def test_example_client_succeeds(server, servable, tmp_path):
    grpc_addr, rest_addr = server
    script = os.path.join(SERVABLES, servable, "serving_client.py")
    done = subprocess.run(
        [sys.executable, script, "--grpc", grpc_addr, "--rest", rest_addr],
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=180,
    )
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0, output
    assert "MISMATCH" not in output and "FAILED" not in output, output
