"""The LLM configuration reference: the fields of an LLM servable's YAML (`spec/llm_config.py`: model, engine,
agents) and of the model YAML it points at (`models/llama/config.py`: model, export), with their types, defaults
and the docstrings written beside them."""

import ast
import dataclasses
import inspect
import os
import re
import textwrap

from mindspore_serving.llm.config import SchedulerConfig, SpeculativeConfig
from mindspore_serving.models.llama import config as model_config
from mindspore_serving.spec import llm_config
from reference_gen.markdown import GENERATED_NOTE, cell, code, fence, table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join("config", "llama_tiny.yaml")

# What the loader (spec/llm_config.py, _engine_section) puts in place of SchedulerConfig's own defaults.
ENGINE_YAML_DEFAULTS = {
    "max_model_len": "the model's max_seq_len",
    "block_size": "the graphs' export.block_size (a different value is refused)",
}


def attribute_docs(cls) -> dict[str, tuple[str, str]]:
    """{field: (annotation as written, the docstring under it)} of a dataclass, from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for index, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            following = body[index + 1] if index + 1 < len(body) else None
            doc = ""
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                doc = inspect.cleandoc(following.value.value)
            docs[node.target.id] = (ast.unparse(node.annotation), doc)
    return docs


def yaml_value(value) -> str:
    """A default as it is written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    return str(value)


def default_of(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return code(yaml_value(field.default))
    if field.default_factory is not dataclasses.MISSING:
        return code(yaml_value(field.default_factory()))
    return "required"


def _docstring_entries(doc: str) -> dict[tuple[str, str], str]:
    """{(section, field): text} of spec/llm_config.py's docstring, whose sections list `field: value  meaning`
    lines (continuations indented deeper); the value, before the first wide gap, is written as code."""
    entries: dict[tuple[str, str], str] = {}
    section, key = "", None
    for line in doc.splitlines():
        top = re.match(r"^    (\w+):", line)
        entry = re.match(r"^      (\w+):\s*(.*)$", line)
        if top:
            section, key = top.group(1), None
        elif entry:
            key = (section, entry.group(1))
            text = entry.group(2).strip()
            value, gap, meaning = (
                re.split(r"(\s{2,})", text, maxsplit=1) if re.search(r"\s{2,}", text) else (text, "", "")
            )
            entries[key] = f"{code(value)} {meaning}" if gap else text
        elif key and line.startswith("       ") and line.strip():
            entries[key] += " " + line.strip()
        else:
            key = None
    return {k: " ".join(v.split()) for k, v in entries.items()}


def dataclass_table(cls, defaults: dict[str, str] | None = None, skip=()) -> str:
    docs = attribute_docs(cls)
    rows = []
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        annotation, doc = docs[field.name]
        default = defaults.get(field.name) if defaults else None
        rows.append([code(field.name), code(annotation), cell(default) if default else default_of(field), cell(doc)])
    return table(["field", "type", "default", "meaning"], rows)


def _model_section(entries) -> str:
    docs = attribute_docs(llm_config.ModelSection)
    rows = []
    for field in dataclasses.fields(llm_config.ModelSection):
        if field.name == "generation_defaults":  # read from generation_config, not a YAML field
            continue
        rows.append([code(field.name), cell(entries.get(("model", field.name)) or docs[field.name][1])])
    return table(["field", "value and meaning"], rows)


def _agents_section(entries) -> str:
    docs = attribute_docs(llm_config.AgentSection)
    rows = []
    for field in dataclasses.fields(llm_config.AgentSection):
        rows.append(
            [
                code(field.name),
                code(docs[field.name][0]),
                default_of(field),
                cell(entries.get(("agents", field.name), "")),
            ]
        )
    return table(["field", "type", "default", "value and meaning"], rows)


def _engine_extras(entries) -> str:
    serving_fields = {f.name: f for f in dataclasses.fields(llm_config.LlmServingConfig)}
    rows = []
    for name in llm_config._ENGINE_EXTRA:
        default = default_of(serving_fields[name]) if name in serving_fields else ""
        rows.append([code(name), default, cell(entries.get(("engine", name), ""))])
    return table(["field", "default", "value and meaning"], rows)


def render() -> str:
    entries = _docstring_entries(llm_config.__doc__)
    with open(os.path.join(ROOT, EXAMPLE), encoding="utf-8") as stream:
        example = stream.read()
    parts = [
        GENERATED_NOTE,
        "# LLM configuration\n",
        "An LLM servable is served from a YAML file of three sections: `model` (the model file, its exported "
        "graphs, tokenizer and templates), `engine` (the scheduler) and `agents` (the processes that run the "
        "graphs). Relative paths are relative to the YAML file's own directory; an unknown field is refused, and "
        "every error names the field and how to fix it. `serving_server.py --model` writes one for a Hugging Face "
        "directory. The bundled one, " + code(EXAMPLE) + ":\n",
        fence(example, "yaml"),
        "## model\n",
        _model_section(entries),
        "## engine\n",
        "The scheduler's fields (`mindspore_serving.llm.config.SchedulerConfig`):\n",
        dataclass_table(SchedulerConfig, ENGINE_YAML_DEFAULTS),
        "Fields of the engine section that are not the scheduler's:\n",
        _engine_extras(entries),
        "At most one of `num_blocks`, `kv_cache_memory` and `kv_cache_memory_fraction` is given.\n",
        "### engine.speculative\n",
        "N-gram speculative decoding (`SpeculativeConfig`); any export verifies the proposed tokens in the step "
        "that computes them.\n",
        dataclass_table(SpeculativeConfig),
        "## agents\n",
        _agents_section(entries),
        "## The model file (model.config)\n",
        "The YAML that `model.config` names describes the network and how its graphs are exported "
        "(`mindspore_serving/models/llama/config.py`):\n",
        fence(textwrap.dedent(model_config.__doc__.split("::", 1)[1].split("Unknown keys", 1)[0]).strip("\n"), "yaml"),
        "### model: the network (`LlamaConfig`)\n",
        cell(inspect.getdoc(model_config.LlamaConfig)) + "\n",
        dataclass_table(model_config.LlamaConfig),
        "### export: the graphs (`ExportConfig`)\n",
        cell(inspect.getdoc(model_config.ExportConfig)) + "\n",
        dataclass_table(model_config.ExportConfig),
    ]
    return "\n".join(parts)
