"""Weights stored once per export directory: the agent's loader (agent/graph_weights.py) and the staleness of exports
of an older manifest format (models/llama/manifest.py, the bundled servables' exporter). No graphs are compiled."""

import importlib.util
import json
import os

import numpy as np
import pytest
from llm_setup import ROOT, bundled_config, write_config
from safetensors.numpy import save_file

from mindspore_serving.models.llama.manifest import MANIFEST_VERSION, outdated_format

ms = pytest.importorskip("mindspore")
from mindspore_serving.agent.graph_weights import load_graph_weights  # noqa: E402

NAMES = ["embed_tokens", "layers.0.q_proj", "norm"]


def export_dir(tmp_path, names=NAMES, version=MANIFEST_VERSION, file="weights.safetensors"):
    """A directory with a manifest naming `names` as the weight inputs and a weights file holding NAMES."""
    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal((4, 3)).astype(np.float32) for name in NAMES}
    save_file(arrays, str(tmp_path / "weights.safetensors"))
    manifest = {"format_version": version, "weights": {"file": file, "names": names}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return str(tmp_path), manifest, arrays


def test_weights_load_by_name(tmp_path):
    directory, manifest, arrays = export_dir(tmp_path, names=["norm", "embed_tokens", "layers.0.q_proj"])
    tensors = load_graph_weights(directory, manifest)
    assert list(tensors) == manifest["weights"]["names"]
    for name, tensor in tensors.items():
        np.testing.assert_array_equal(tensor.asnumpy(), arrays[name])


def test_a_missing_or_incomplete_weights_file_asks_for_an_export(tmp_path):
    directory, manifest, _ = export_dir(tmp_path, names=NAMES + ["lm_head"])
    with pytest.raises(
        ValueError,
        match=r"lacks the weight\(s\) \['lm_head'\] that the graphs take; export the "
        "model again",
    ):
        load_graph_weights(directory, manifest)
    (tmp_path / "weights.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{not a header}")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_graph_weights(directory, manifest)
    os.remove(tmp_path / "weights.safetensors")
    with pytest.raises(FileNotFoundError, match="is incomplete; export the model again"):
        load_graph_weights(directory, manifest)


@pytest.mark.parametrize("file", ["../weights.safetensors", "/etc/passwd", ""])
def test_the_weights_file_is_a_name_inside_the_export(tmp_path, file):
    directory, manifest, _ = export_dir(tmp_path, file=file)
    with pytest.raises(ValueError, match="is not a file name in the export directory"):
        load_graph_weights(directory, manifest)


def test_a_manifest_without_weight_names_asks_for_an_export(tmp_path):
    directory, manifest, _ = export_dir(tmp_path, names=[])
    with pytest.raises(ValueError, match="lists no weight names; re-export the model"):
        load_graph_weights(directory, manifest)


def test_an_export_of_an_older_format_is_stale_for_the_bundled_exporter(tmp_path):
    """servables/export_models.py exports the bundled LLM again when its graphs are of an older manifest format
    (a format 1 export embeds the weights in every graph), as when they are missing."""
    graphs = tmp_path / "rank_0"
    graphs.mkdir()
    assert "has no readable manifest.json" in outdated_format(str(graphs))
    (graphs / "manifest.json").write_text(json.dumps({"format_version": 1}))
    assert outdated_format(str(graphs)) == (
        f"{graphs} holds manifest format 1, the exporter writes format {MANIFEST_VERSION}"
    )
    data = bundled_config()
    data["model"]["graphs"] = [str(graphs)]
    spec = importlib.util.spec_from_file_location(
        "_test_llama_tiny_export_model", os.path.join(ROOT, "servables", "llama_tiny", "export_model.py")
    )
    exporter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exporter)
    assert exporter.stale(write_config(tmp_path, data=data)) == outdated_format(str(graphs))
