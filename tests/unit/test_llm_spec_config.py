"""The configuration of verify graphs (speculative decoding): ExportConfig.spec_tokens / spec_batch_buckets, an LLM
YAML's `model.export` over its model file's export section, and engine.speculative refused unless the graphs verify
that many proposed tokens."""

import json
import os

import pytest
from llm_setup import ROOT, TP2_CONFIG, bundled_config, write_config

from mindspore_serving.models.llama.config import ExportConfig, LlamaConfig, ModelFile
from mindspore_serving.spec.llm_config import ConfigError, load_serving_config

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


def config_path(tmp_path, export=None, speculative=None, manifest=None):
    """The bundled config with its graphs in tmp_path/graphs (holding `manifest`, when given), `model.export` and
    `engine.speculative` set as given."""
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
    return write_config(tmp_path, data=data)


def test_spec_fields_are_validated_and_kept_out_of_exports_without_them():
    assert ExportConfig().spec_batches == () and "spec_tokens" not in ExportConfig().to_dict()
    assert ExportConfig(spec_tokens=3).spec_batches == ExportConfig().decode_batch_buckets
    spec = ExportConfig(spec_tokens=3, spec_batch_buckets=(1, 4))
    assert spec.spec_batches == (1, 4) and spec.to_dict()["spec_batch_buckets"] == [1, 4]
    assert ExportConfig.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="spec_tokens must be >= 0"):
        ExportConfig(spec_tokens=-1)
    with pytest.raises(ValueError, match="spec_tokens must be an int"):
        ExportConfig(spec_tokens=True)
    with pytest.raises(ValueError, match="spec_batch_buckets must be strictly increasing"):
        ExportConfig(spec_tokens=2, spec_batch_buckets=(4, 1))
    model = LlamaConfig(
        vocab_size=8, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=8, max_seq_len=16
    )
    small = {"block_size": 8, "prefill_len_buckets": (8,), "decode_batch_buckets": (1,)}
    with pytest.raises(ValueError, match="spec_tokens=16: a verified row of spec_tokens \\+ 1 tokens exceeds"):
        ModelFile(model, ExportConfig(spec_tokens=16, **small))
    with pytest.raises(ValueError, match="spec_batch_buckets holds 32 > max_seq_len=16"):
        ModelFile(model, ExportConfig(spec_tokens=2, spec_batch_buckets=(1, 32), **small))


def test_model_export_overrides_the_model_files_export_fields(tmp_path):
    config = load_serving_config(config_path(tmp_path, export={"spec_tokens": 4, "spec_batch_buckets": [1, 4]}))
    export = config.model_file().export
    plain = load_serving_config(config_path(tmp_path)).model_file().export
    assert (export.spec_tokens, export.spec_batches) == (4, (1, 4))
    assert export.prefill_len_buckets == plain.prefill_len_buckets and plain.spec_tokens == 0


def test_stale_graphs_compares_with_the_merged_export(tmp_path):
    export = {"spec_tokens": 4}
    merged = load_serving_config(config_path(tmp_path, export=export)).model_file().to_dict()
    manifest = {"model": merged["model"], "export": merged["export"], "tensor_parallel": {"size": 1, "rank": 0}}
    assert load_serving_config(config_path(tmp_path, export=export, manifest=manifest)).stale_graphs() is None
    assert "exported with another model config" in load_serving_config(config_path(tmp_path)).stale_graphs()


@pytest.mark.parametrize(
    "export, message",
    [
        ("spec_tokens", "'model.export' must be a mapping of export fields"),
        ({"spec_tokenz": 4}, r"'model.export': ExportConfig: unknown field\(s\) \['spec_tokenz'\]"),
        ({"spec_tokens": 300}, "'model.export': ExportConfig.spec_tokens=300"),
    ],
)
def test_bad_model_export_is_named(tmp_path, export, message):
    with pytest.raises(ConfigError, match=message):
        load_serving_config(config_path(tmp_path, export=export))


def test_speculation_needs_verify_graphs_of_as_many_tokens(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"num_speculative_tokens' is 4 but the graphs' export.spec_tokens is 0: "
        r"set 'model.export: \{spec_tokens: 4\}'",
    ):
        load_serving_config(config_path(tmp_path, speculative=SPECULATIVE))
    with pytest.raises(ConfigError, match="export.spec_tokens is 2"):
        load_serving_config(config_path(tmp_path, export={"spec_tokens": 2}, speculative=SPECULATIVE))
    # not exported yet: the export config decides
    config = load_serving_config(config_path(tmp_path, export={"spec_tokens": 4}, speculative=SPECULATIVE))
    assert config.engine.speculative.num_speculative_tokens == 4
    with pytest.raises(ConfigError, match="'engine': SpeculativeConfig.prompt_lookup_max must be >= 1"):
        load_serving_config(
            config_path(tmp_path, export={"spec_tokens": 4}, speculative=dict(SPECULATIVE, prompt_lookup_max=0))
        )


def test_speculation_needs_the_exported_graphs_to_verify_as_many_tokens(tmp_path):
    path = config_path(tmp_path, export={"spec_tokens": 4}, speculative=SPECULATIVE, manifest={"spec_tokens": 0})
    with pytest.raises(ConfigError, match=r"were exported with export.spec_tokens 0: re-export them"):
        load_serving_config(path)
    assert load_serving_config(path, check_graphs=False).engine.speculative is not None  # what the exporter loads
    path = config_path(tmp_path, export={"spec_tokens": 4}, speculative=SPECULATIVE, manifest={"spec_tokens": 4})
    assert load_serving_config(path).engine.speculative.num_speculative_tokens == 4


def test_the_shipped_configs():
    """llama_tiny_spec.yaml speculates over verify graphs of 4 proposed tokens; llama_tiny_tp2.yaml exports verify
    graphs of two batch sizes but does not speculate."""
    spec = load_serving_config(os.path.join(ROOT, "config", "llama_tiny_spec.yaml"), check_graphs=False)
    assert spec.engine.speculative.num_speculative_tokens == 4 and spec.engine.speculative.disable_by_batch_size == 8
    assert spec.model_file().export.spec_batches == spec.model_file().export.decode_batch_buckets
    assert spec.model.graphs[0].endswith(os.path.join("servables", "llama_tiny_spec", "1", "rank_0"))
    tp2 = load_serving_config(TP2_CONFIG, check_graphs=False)
    assert tp2.engine.speculative is None and tp2.model_file().export.spec_batches == (1, 4)
