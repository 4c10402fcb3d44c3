"""Servers shared by the end-to-end modules whose tests only read from them."""
import pytest

from llm_setup import write_config, write_servable
from serving_process import start_server


@pytest.fixture(scope="session")
def llm_server(tmp_path_factory):
    """serving_server.py with the bundled tiny LLM (its shipped engine settings): (process, gRPC address, REST
    address, LLM config path)."""
    directory = tmp_path_factory.mktemp("llm")
    config = write_config(directory, start_port=0)
    servables = write_servable(directory, config)
    proc, grpc_addr, rest_addr = start_server(directory, servables=("llama_tiny",),
                                              extra_args=["--servable_directory", servables])
    try:
        yield proc, grpc_addr, rest_addr, config
    finally:
        proc.close()
