import pytest
from secured_server import ADMIN_KEY, KEY, READ_TIMEOUT
from serving_process import start_server


@pytest.fixture(scope="package")
def server_directory(tmp_path_factory):
    """The secured server's working directory (its sockets and logs)."""
    return tmp_path_factory.mktemp("secured")


@pytest.fixture(scope="package")
def secured(server_directory):
    """(process, gRPC address, RESTful URL) of the secured server (secured_server.py): the bundled servables as
    they ship (config/llama_tiny.yaml: the LLM agent on a unix socket the worker starts)."""
    directory = server_directory
    key_file = directory / "key"
    key_file.write_text(KEY + "\n")
    proc, grpc_addr, rest_addr = start_server(
        directory,
        servables=("add", "llama_tiny"),
        extra_args=[
            "--frontend_processes",
            "2",
            "--api_key_file",
            str(key_file),
            "--read_timeout",
            str(READ_TIMEOUT),
            "--restricted_api",
            f"model-repository,admin={ADMIN_KEY}",
            "--open_api",
            "metrics",
        ],
    )
    try:
        yield proc, grpc_addr, f"http://{rest_addr}"
    finally:
        proc.close()


@pytest.fixture(scope="package")
def server(secured):
    """(gRPC address, RESTful URL) of the secured server."""
    return secured[1:]


@pytest.fixture(scope="package")
def server_process(secured):
    return secured[0]
