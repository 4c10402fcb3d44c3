"""The bundled tiny LLaMA for tests: its configuration with absolute paths and chosen agent ports."""
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "config", "llama_tiny.yaml")


def bundled_config():
    """config/llama_tiny.yaml as a dict, its paths made absolute (so that a copy works from anywhere)."""
    with open(CONFIG, encoding="utf-8") as stream:
        data = yaml.safe_load(stream)
    base = os.path.dirname(CONFIG)
    model = data["model"]
    for key in ("config", "checkpoint", "tokenizer"):
        model[key] = os.path.normpath(os.path.join(base, model[key]))
    model["graphs"] = [os.path.normpath(os.path.join(base, g)) for g in model["graphs"]]
    return data


def write_config(directory, start_port=0, agents=None, data=None, **engine):
    """A copy of config/llama_tiny.yaml (or of `data`) in `directory` with absolute paths, `start_port`, agents
    overrides (a dict) and engine overrides."""
    data = data if data is not None else bundled_config()
    data["agents"]["start_port"] = start_port
    data["agents"].update(agents or {})
    data["engine"].update(engine)
    path = os.path.join(str(directory), "llm.yaml")
    with open(path, "w", encoding="utf-8") as stream:
        yaml.safe_dump(data, stream)
    return path


def write_servable(directory, config_path, name="llama_tiny"):
    """A servable directory whose servable_config.py declares the LLM of `config_path`."""
    servable = os.path.join(str(directory), "servables", name)
    os.makedirs(servable, exist_ok=True)
    with open(os.path.join(servable, "servable_config.py"), "w", encoding="utf-8") as stream:
        stream.write("from mindspore_serving.server import register\n"
                     f"register.declare_llm(config_file={config_path!r})\n")
    return os.path.dirname(servable)
