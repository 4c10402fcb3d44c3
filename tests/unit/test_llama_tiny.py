"""The bundled tiny model (tokenizer, config, checkpoint), the tokenizer wrapper, and the export CLI."""

import json
import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import Tensor  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from mindspore_serving.models.llama import export  # noqa: E402
from mindspore_serving.models.llama.config import load_config  # noqa: E402
from mindspore_serving.models.llama.manifest import MANIFEST_VERSION, WEIGHTS_FILE  # noqa: E402
from mindspore_serving.models.llama.model import build_model  # noqa: E402
from mindspore_serving.models.llama.step_graphs import HEAD_INPUTS, LAYER_INPUTS, PREPARE_INPUTS  # noqa: E402
from mindspore_serving.models.llama.tokenizer import TextTokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "mindspore_serving", "models", "llama", "tiny")
CORPUS = os.path.join(ROOT, "data", "kjv_narrative.txt")


def test_bundled_tokenizer_and_config_agree():
    cfg = load_config(os.path.join(TINY, "config.yaml"))
    tok = TextTokenizer.from_file(os.path.join(TINY, "tokenizer.json"))
    assert tok.vocab_size == cfg.model.vocab_size
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert (cfg.model.pad_token_id, cfg.model.bos_token_id, cfg.model.eos_token_id) == (0, 1, 2)
    text = "And the LORD said unto Moses, Go in unto Pharaoh."
    ids = tok.encode(text)  # the post-processor prepends <s>, as in training
    assert ids[0] == tok.bos_id and len(ids) < len(text) // 2
    assert tok.encode(text, add_bos=True) == ids
    assert tok.encode(text, add_special_tokens=False) == ids[1:]
    assert tok.decode(ids) == text


def test_bundled_checkpoint_has_learned_the_corpus():
    """Mean next-token loss on the corpus' first verses is far below chance (ln 2048 = 7.6)."""
    cfg = load_config(os.path.join(TINY, "config.yaml"))
    tok = TextTokenizer.from_file(os.path.join(TINY, "tokenizer.json"))
    model = build_model(cfg.model, checkpoint=os.path.join(TINY, "llama_tiny.ckpt"))
    model.set_train(False)
    with open(CORPUS, encoding="utf-8") as f:
        text = "".join(next(f) for _ in range(4))
    ids = tok.encode(text, add_bos=True)[:128]
    logits = model.forward_full(Tensor(np.array([ids[:-1]], np.int32))).asnumpy()[0].astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(ids) - 1), ids[1:]].mean()
    assert nll < 4.0, nll


def _tiny_tokenizer(tmp_path, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["hello world, hello tokenizer"] * 20, trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_any_tokenizer_json_is_accepted(tmp_path):
    path = _tiny_tokenizer(tmp_path, ["<|endoftext|>", "<|pad|>"])
    tok = TextTokenizer.from_file(str(path))
    assert tok.eos_id == 0 and tok.pad_id == 1 and tok.bos_id is None
    assert tok.encode("hello", add_bos=True) == tok.encode("hello")
    assert tok.decode(tok.encode("hello world")) == "hello world"
    # a tokenizer_config.json beside it names the specials; explicit ids win over everything
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"content": "<|pad|>"}, "bos_token": "<|endoftext|>"})
    )
    tok = TextTokenizer.from_file(str(tmp_path))
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    assert TextTokenizer.from_file(str(path), eos_id=5).eos_id == 5
    with pytest.raises(ValueError, match="outside"):
        TextTokenizer.from_file(str(path), eos_id=10_000)
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(ValueError, match="not a valid"):
        TextTokenizer.from_file(str(tmp_path / "broken.json"))


def test_export_cli_writes_the_weights_the_step_graphs_and_the_manifest(tmp_path):
    (tmp_path / "model.yaml").write_text(
        "model: {vocab_size: 32, hidden_size: 16, num_layers: 1, num_heads: 2, num_kv_heads: 1,\n"
        "        intermediate_size: 32, max_seq_len: 32}\n"
        "export: {block_size: 8}\n"
    )
    out = tmp_path / "graphs"
    export.main(["--config", str(tmp_path / "model.yaml"), "--out", str(out)])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == MANIFEST_VERSION == 3
    assert manifest["export"] == {"block_size": 8} and manifest["block_size"] == 8
    assert manifest["model"] == load_config(str(tmp_path / "model.yaml")).model.to_dict()
    assert (manifest["max_seq_len"], manifest["vocab_size"]) == (32, 32)
    assert manifest["tensor_parallel"] == {"size": 1, "rank": 0}
    # the cache's size is the runner's: per layer a key and a value tensor of [slots, kv heads, head dim]
    assert manifest["cache"] == {
        "num_layers": 1,
        "num_kv_heads": 1,
        "head_dim": 8,
        "dtype": "float32",
        "shape": [-1, 1, 8],
    }
    assert "max_blocks_per_seq" not in manifest and "spec_tokens" not in manifest
    assert manifest["weights"]["file"] == WEIGHTS_FILE and manifest["weights"]["source"] == "random(seed=0)"
    assert manifest["weights"]["bytes"] == (out / WEIGHTS_FILE).stat().st_size
    # the graphs of any step, each taking its inputs then its weights (a layer's relative to "layers.<i>."): the
    # layer of both row groups, and of decode rows or chunk rows alone
    assert list(manifest["graphs"]) == ["prepare", "layer", "layer_decode", "layer_chunk", "head"]
    layers = [(name, LAYER_INPUTS) for name in ("layer", "layer_decode", "layer_chunk")]
    for name, inputs in [("prepare", PREPARE_INPUTS), *layers, ("head", HEAD_INPUTS)]:
        graph = manifest["graphs"][name]
        assert graph["file"] == f"{name}.mindir" and (out / graph["file"]).is_file()
        assert graph["inputs"] == list(inputs)
    assert manifest["graphs"]["prepare"]["weights"] == ["embed_tokens"]
    assert manifest["graphs"]["head"]["weights"] == ["norm", "embed_tokens"]  # tied embeddings: the default
    layer = manifest["graphs"]["layer"]["weights"]
    assert layer and all(f"layers.0.{w}" in manifest["weights"]["names"] for w in layer)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", WEIGHTS_FILE] + [f"{name}.mindir" for name in manifest["graphs"]]
    )
    # the bucket fields of the per-shape graphs are refused by name
    (tmp_path / "buckets.yaml").write_text(
        "model: {vocab_size: 32, hidden_size: 16, num_layers: 1, num_heads: 2, num_kv_heads: 1,\n"
        "        intermediate_size: 32, max_seq_len: 32}\n"
        "export: {block_size: 8, prefill_len_buckets: [8], decode_batch_buckets: [2]}\n"
    )
    with pytest.raises(ValueError, match=r"export.prefill_len_buckets was removed: .*; delete it"):
        export.main(["--config", str(tmp_path / "buckets.yaml"), "--out", str(tmp_path / "other")])
    (tmp_path / "bad.yaml").write_text(
        "model: {vocab_size: 32, hidden_size: 16, num_layers: 1, num_heads: 3,\n"
        "        num_kv_heads: 1, intermediate_size: 32, max_seq_len: 32}\n"
    )
    with pytest.raises(ValueError, match="hidden_size=16 is not a multiple of num_heads=3"):
        export.main(["--config", str(tmp_path / "bad.yaml"), "--out", str(out)])
    with pytest.raises(SystemExit):  # one process exports the three graphs: no --jobs
        export.main(["--config", str(tmp_path / "model.yaml"), "--out", str(out), "--jobs", "1"])
