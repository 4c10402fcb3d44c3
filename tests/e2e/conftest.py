"""Servers shared by the end-to-end modules whose tests only read from them."""

import pytest
from llm_setup import SPEC_CONFIG, write_config, write_servable
from serving_process import start_server


@pytest.fixture(scope="session")
def llm_server(tmp_path_factory):
    """serving_server.py with the bundled tiny LLM (its shipped engine settings): (process, gRPC address, REST
    address, LLM config path)."""
    directory = tmp_path_factory.mktemp("llm")
    config = write_config(directory, start_port=0, agents={"warmup": True})  # the shipped default, kept here
    servables = write_servable(directory, config)
    proc, grpc_addr, rest_addr = start_server(
        directory, servables=("llama_tiny",), extra_args=["--servable_directory", servables]
    )
    try:
        yield proc, grpc_addr, rest_addr, config
    finally:
        proc.close()


@pytest.fixture(scope="session")
def runner():
    """The bundled tiny LLaMA's graphs in this process (GraphRunner, 256 KV blocks, each compiled on first use):
    those of llama_tiny_spec, the same as llama_tiny's. Shared by the modules that drive the engine on
    the real graphs; each engine allocates its own blocks, and what they count of the runner they count as
    differences."""
    from mindspore_serving.agent.graph_runner import GraphRunner  # lazy: MindSpore only where a model runs
    from mindspore_serving.spec.llm_config import load_serving_config  # lazy: as above

    return GraphRunner(load_serving_config(SPEC_CONFIG).model.graphs[0], num_blocks=256, warmup=False)
