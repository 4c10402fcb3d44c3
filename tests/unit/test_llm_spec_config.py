"""The export configuration of the dynamic-shape step graphs and speculative decoding: the export fields of the
per-shape graphs (buckets, verify graphs, a fixed cache size) are refused by name, in a model YAML's export section
and in an LLM YAML's `model.export`, with a message saying what replaced them and to delete them; `model.export`
still overrides the model file's export section (block_size); engine.speculative loads over any export (the step
graphs verify any number of proposed tokens), whatever the graphs' manifest says."""

import dataclasses
import json
import os
import re

import pytest
import yaml
from llm_setup import ROOT, SPEC_CONFIG, TP2_CONFIG, bundled_config, write_config

from mindspore_serving.models.llama import config as model_config
from mindspore_serving.models.llama.config import ExportConfig, ModelFile, load_config
from mindspore_serving.spec.llm_config import ConfigError, load_serving_config

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
TINY_MODEL = os.path.join(ROOT, "mindspore_serving", "models", "llama", "tiny", "config.yaml")
REMOVED = {
    "prefill_batch_buckets": [1, 2, 4],
    "prefill_len_buckets": [16, 64],
    "decode_batch_buckets": [1, 2, 4, 8, 16],
    "mixed_decode_buckets": [4],
    "mixed_len_buckets": [32, 64],
    "mixed_prefill_rows": [1],
    "score_len_buckets": [],
    "spec_tokens": 4,
    "spec_batch_buckets": [1, 4],
    "num_blocks": 64,
}
"""Every export field of the per-shape graphs, with a value it used to take."""


def config_path(tmp_path, export=None, speculative=None, manifest=None, model_config_file=None):
    """The bundled config with its graphs in tmp_path/graphs (holding `manifest`, when given), `model.export`,
    `engine.speculative` and `model.config` set as given."""
    data = bundled_config()
    graphs = tmp_path / "graphs"
    graphs.mkdir(exist_ok=True)
    if manifest is not None:
        (graphs / "manifest.json").write_text(json.dumps(manifest))
    data["model"]["graphs"] = [str(graphs)]
    if export is not None:
        data["model"]["export"] = export
    if speculative is not None:
        data["engine"]["speculative"] = speculative
    if model_config_file is not None:
        data["model"]["config"] = str(model_config_file)
    return write_config(tmp_path, data=data)


def removed_message(name):
    """The refusal of export field `name`: it names the field, what replaced it, and says to delete it."""
    if name == "num_blocks":
        replaced = "the KV cache's size is chosen when serving (engine.num_blocks or engine.kv_cache_memory)"
    else:
        replaced = (
            "one dynamic-shape export computes every step of any batch, prompt length and speculative proposal; "
            "the tokens of a step are bounded by engine.max_num_batched_tokens"
        )
    return f"export.{name} was removed: {replaced}; delete it"


def tiny_model_yaml(tmp_path, **export):
    """The bundled tiny model's YAML with `export` added to its export section."""
    with open(TINY_MODEL, encoding="utf-8") as stream:
        data = yaml.safe_load(stream)
    data["export"].update(export)
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_removed_fields_are_those_of_the_per_shape_graphs():
    assert set(model_config.REMOVED_EXPORT_FIELDS) == set(REMOVED)
    assert [f.name for f in dataclasses.fields(ExportConfig)] == ["block_size"]
    assert ExportConfig().to_dict() == {"block_size": 16}
    for name in REMOVED:
        assert model_config.removed_export_field(name) == removed_message(name)
        assert not hasattr(ExportConfig(), name)
    for gone in ("score_lengths", "spec_batches", "max_blocks_per_seq"):
        assert not hasattr(ExportConfig(), gone)


@pytest.mark.parametrize("name", sorted(REMOVED))
def test_a_removed_field_is_refused_by_name(tmp_path, name):
    with pytest.raises(ValueError, match=re.escape(removed_message(name))):
        ExportConfig.from_dict({"block_size": 16, name: REMOVED[name]})
    model_yaml = tiny_model_yaml(tmp_path, **{name: REMOVED[name]})
    with pytest.raises(ValueError, match=re.escape(f"{model_yaml}: {removed_message(name)}")):
        load_config(str(model_yaml))
    # a model YAML served by an LLM YAML
    with pytest.raises(ConfigError, match=re.escape(f"'model.config' ({model_yaml}): {model_yaml}: export.{name}")):
        load_serving_config(config_path(tmp_path, model_config_file=model_yaml))
    # an LLM YAML's model.export over the model file's export section
    with pytest.raises(ConfigError, match=re.escape(f"'model.export': {removed_message(name)}")):
        load_serving_config(config_path(tmp_path, export={name: REMOVED[name]}))


def test_model_export_overrides_the_model_files_export_fields(tmp_path):
    config = load_serving_config(config_path(tmp_path, export={"block_size": 32}))
    plain = load_serving_config(config_path(tmp_path))
    assert config.model_file().export == ExportConfig(block_size=32) and config.engine.block_size == 32
    assert plain.model_file().export == ExportConfig(block_size=16) and plain.engine.block_size == 16
    assert config.model_file().model == plain.model_file().model


def test_stale_graphs_compares_with_the_merged_export(tmp_path):
    export = {"block_size": 32}
    merged = load_serving_config(config_path(tmp_path, export=export)).model_file().to_dict()
    manifest = {"model": merged["model"], "export": merged["export"], "tensor_parallel": {"size": 1, "rank": 0}}
    assert load_serving_config(config_path(tmp_path, export=export, manifest=manifest)).stale_graphs() is None
    assert "exported with another model config" in load_serving_config(config_path(tmp_path)).stale_graphs()
    # graphs of the per-shape format (their export section holds buckets): exported with another model config
    old = dict(manifest, export={**merged["export"], "prefill_len_buckets": [16, 64], "spec_tokens": 4})
    path = config_path(tmp_path, export=export, manifest=old)
    assert "exported with another model config" in load_serving_config(path).stale_graphs()


@pytest.mark.parametrize(
    "export, message",
    [
        ("block_size", "'model.export' must be a mapping of export fields"),
        ({"block_sise": 32}, r"'model.export': ExportConfig: unknown field\(s\) \['block_sise'\]"),
        ({"block_size": 0}, "'model.export': ExportConfig.block_size must be >= 1, got 0"),
        ({"block_size": 24}, "'model.export': ExportConfig.block_size=24 does not divide LlamaConfig.max_seq_len=256"),
    ],
)
def test_bad_model_export_is_named(tmp_path, export, message):
    with pytest.raises(ConfigError, match=message):
        load_serving_config(config_path(tmp_path, export=export))


@pytest.mark.parametrize("check_graphs", [True, False])
def test_speculation_loads_with_any_export(tmp_path, check_graphs):
    """No export field nor manifest entry stands between engine.speculative and the graphs: the step graphs verify
    the proposals of any row in the step that computes them."""
    config = load_serving_config(config_path(tmp_path, speculative=SPECULATIVE), check_graphs=check_graphs)
    assert config.engine.speculative.num_speculative_tokens == 4
    assert config.model_file().export == ExportConfig()
    many = dict(SPECULATIVE, num_speculative_tokens=16, prompt_lookup_max=8)
    path = config_path(tmp_path, export={"block_size": 32}, speculative=many)
    assert load_serving_config(path, check_graphs=check_graphs).engine.speculative.num_speculative_tokens == 16
    # exported graphs: what their manifest says (even an old verify length) does not limit the speculation
    merged = config.model_file().to_dict()
    for manifest in ({"format_version": 3, **merged}, {"spec_tokens": 0}):
        path = config_path(tmp_path, speculative=SPECULATIVE, manifest=manifest)
        assert load_serving_config(path, check_graphs=check_graphs).engine.speculative.num_speculative_tokens == 4
    with pytest.raises(ConfigError, match="'engine': SpeculativeConfig.prompt_lookup_max must be >= 1"):
        load_serving_config(
            config_path(tmp_path, speculative=dict(SPECULATIVE, prompt_lookup_max=0)), check_graphs=check_graphs
        )


def test_the_shipped_configs():
    """llama_tiny_spec.yaml speculates over the tiny model's own export (no model.export); llama_tiny_tp2.yaml
    serves the same export split over two ranks, without speculation; none caps the prompts of a step."""
    tiny = load_config(TINY_MODEL)
    assert tiny.export == ExportConfig(block_size=16)
    spec = load_serving_config(SPEC_CONFIG, check_graphs=False)
    assert spec.engine.speculative.num_speculative_tokens == 4 and spec.engine.speculative.disable_by_batch_size == 8
    assert spec.model.export == () and spec.model_file() == tiny
    assert spec.model.graphs[0].endswith(os.path.join("servables", "llama_tiny_spec", "1", "rank_0"))
    tp2 = load_serving_config(TP2_CONFIG, check_graphs=False)
    assert tp2.engine.speculative is None and tp2.model.tensor_parallel == 2
    assert tp2.model.export == () and tp2.model_file() == tiny
    assert [os.path.basename(g) for g in tp2.model.graphs] == ["rank_0", "rank_1"]
    for path in (os.path.join(ROOT, "config", "llama_tiny.yaml"), SPEC_CONFIG, TP2_CONFIG):
        with open(path, encoding="utf-8") as stream:
            data = yaml.safe_load(stream)
        assert "export" not in data["model"] and "max_prefills_per_decode_step" not in data["engine"], path
        assert load_serving_config(path, check_graphs=False).engine.max_prefills_per_decode_step is None
    assert ModelFile.from_dict(tiny.to_dict()) == tiny
