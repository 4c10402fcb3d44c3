"""The bundled tiny LLaMA for tests: its configuration with absolute paths and chosen agent ports."""

import functools
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "config", "llama_tiny.yaml")
TP2_CONFIG = os.path.join(ROOT, "config", "llama_tiny_tp2.yaml")
SPEC_CONFIG = os.path.join(ROOT, "config", "llama_tiny_spec.yaml")


def bundled_config(path=CONFIG):
    """config/llama_tiny.yaml (or another bundled LLM YAML) as a dict, its paths made absolute (so that a copy
    works from anywhere)."""
    with open(path, encoding="utf-8") as stream:
        data = yaml.safe_load(stream)
    base = os.path.dirname(path)
    model = data["model"]
    for key in ("config", "checkpoint", "tokenizer"):
        model[key] = os.path.normpath(os.path.join(base, model[key]))
    model["graphs"] = [os.path.normpath(os.path.join(base, g)) for g in model["graphs"]]
    return data


def write_config(directory, start_port=0, agents=None, data=None, name="llm.yaml", **engine):
    """A copy of config/llama_tiny.yaml (or of `data`) in `directory` with absolute paths, `start_port`, agents
    overrides (a dict) and engine overrides. Its agents compile the graphs on the first step (agents.warmup false,
    unless `agents` or `data` says otherwise), which saves every agent start of the suite its warm-up steps."""
    data = data if data is not None else bundled_config()
    data["agents"]["start_port"] = start_port
    data["agents"].setdefault("warmup", False)
    data["agents"].update(agents or {})
    data["engine"].update(engine)
    path = os.path.join(str(directory), name)
    with open(path, "w", encoding="utf-8") as stream:
        yaml.safe_dump(data, stream)
    return path


def write_servable(directory, config_path, name="llama_tiny"):
    """A servable directory whose servable_config.py declares the LLM of `config_path`."""
    servable = os.path.join(str(directory), "servables", name)
    os.makedirs(servable, exist_ok=True)
    with open(os.path.join(servable, "servable_config.py"), "w", encoding="utf-8") as stream:
        stream.write(
            f"from mindspore_serving.server import register\nregister.declare_llm(config_file={config_path!r})\n"
        )
    return os.path.dirname(servable)


@functools.cache
def offline_engine(config_path):
    """The graphs of rank 0 of `config_path` driven in-process by the engine (a single-rank model)."""
    from mindspore_serving.agent.graph_runner import GraphRunner
    from mindspore_serving.llm import LLMEngine
    from mindspore_serving.models.llama.tokenizer import TextTokenizer
    from mindspore_serving.spec.llm_config import load_serving_config

    config = load_serving_config(config_path)
    tokenizer = TextTokenizer.from_file(config.model.tokenizer)
    runner = GraphRunner(config.model.graphs[0], num_blocks=config.engine.num_blocks, warmup=False)
    return LLMEngine(runner, tokenizer, config.engine, eos_token_id=tokenizer.eos_id)


def offline_greedy(config_path, prompt, max_new_tokens):
    """One request alone, in-process on the graphs of `config_path`."""
    return offline_engine(config_path).generate([prompt], {"temperature": 0.0, "max_new_tokens": max_new_tokens})[0]


def llm_worker_registry(channel, facts, batch_size=1):
    """A master's WorkerRegistry holding one LLM worker, servable "tiny" version 1, reached on `channel` (a gRPC
    channel to a fake or in-process LlmWorker), registered with `facts` (ipc.llm_session.registration_facts)."""
    from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry  # lazy: for the tests using it
    from mindspore_serving.spec.llm import GENERATE_METHOD, LLM_EXTENSION

    registry = WorkerRegistry()
    registry.add(
        WorkerRecord(
            key="tiny@0",
            pid=4242,
            address="",
            servable_name="tiny",
            version_number=1,
            batch_size=batch_size,
            methods={GENERATE_METHOD: None},
            extensions={LLM_EXTENSION: facts},
            channel=channel,
        )
    )
    return registry
