"""Hugging Face model directories (tests/fixtures/hf) read by models.llama.hf compute what transformers computed.

For every fixture: the model built by `build_hf_model` gives transformers' first-step logits (logits.npy) within
LOGIT_RTOL times the logits' scale (their largest magnitude, ~12-16 here; measured differences are below 2e-6 of
it) and the same 16 greedy tokens (expected.json) for each of the three prompts. forward_full runs compiled
(`ms.jit`) on the prompts right-padded to one width, so that each model compiles once: attention is causal, so
the padding after a row's last token changes none of its logits.

Tensor parallelism 2 without a cluster: each rank's shard (shard_weights) runs in a one-rank model of the shard's
shape, and the row-parallel partial sums (o_proj, down_proj) are added here as the AllReduce adds them; the
logits must again be transformers'. Then the refusals: unknown architecture, unsupported RoPE scaling, too short a
sliding window, a missing or misshapen tensor, and tensor parallelism not dividing the heads.
"""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import Tensor, ops  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from mindspore_serving.llm.generation_defaults import GenerationDefaults  # noqa: E402
from mindspore_serving.models.llama.config import (  # noqa: E402
    LlamaConfig,
    check_tensor_parallel,
)
from mindspore_serving.models.llama.hf.config import UnsupportedModelError, read_hf_config, read_json  # noqa: E402
from mindspore_serving.models.llama.hf.loader import build_hf_model  # noqa: E402
from mindspore_serving.models.llama.hf.weights import bfloat16_to_float32, load_hf_weights  # noqa: E402
from mindspore_serving.models.llama.model import LlamaModel, linear, rms_norm, rotary_cos_sin, shard_weights  # noqa: E402

# NOTE: MindSpore's first PyNative op in a process initialises its NumPy C API, which fails once here (an extension
# built for NumPy 1.x); a pyboost op (*, //) then raises SystemError, while a Tensor slice absorbs it.
Tensor(np.zeros(2, np.int32))[:1]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")
NAMES = sorted(n for n in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, n, "expected.json")))
LOGIT_RTOL = 1e-5
GREEDY_STEPS = 16


def expected(name):
    with open(os.path.join(FIXTURES, name, "expected.json"), encoding="utf-8") as f:
        return json.load(f), np.load(os.path.join(FIXTURES, name, "logits.npy"))


def assert_logits_close(got, want):
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=LOGIT_RTOL * scale)


def greedy(step, prompts, steps):
    """Greedy decoding of every prompt at once, without a cache: each step runs `step` (ids [B, W] -> logits
    [B, W, vocab]) on all rows right-padded to W. Returns the first step's last-position logits and the tokens."""
    rows = [list(p) for p in prompts]
    width = max(len(r) for r in rows) + steps - 1
    first = None
    for s in range(steps):
        ids = np.zeros((len(rows), width), np.int32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        logits = step(Tensor(ids)).asnumpy()
        last = logits[np.arange(len(rows)), [len(r) - 1 for r in rows]]
        first = last if s == 0 else first
        for row, row_logits in zip(rows, last):
            row.append(int(row_logits.argmax()))
    return first, [row[len(p) :] for row, p in zip(rows, prompts)]


def test_fixtures_are_present():
    assert NAMES == ["llama2_linear", "llama3", "mistral", "qwen2", "qwen3"]


@pytest.mark.parametrize("name", NAMES)
def test_logits_and_greedy_tokens_equal_transformers(name):
    exp, want = expected(name)
    model = build_hf_model(os.path.join(FIXTURES, name))
    assert model.cfg.max_seq_len == 1024  # max_position_embeddings
    prompts = [p["input_ids"] for p in exp["prompts"]]
    first, tokens = greedy(ms.jit(model.forward_full, jit_level="O0"), prompts, GREEDY_STEPS)
    for i, p in enumerate(exp["prompts"]):
        assert_logits_close(first[i], want[i])
        assert tokens[i] == p["greedy_ids"], f"prompt {i}"


def test_configs_map_each_family():
    cfgs = {name: read_hf_config(os.path.join(FIXTURES, name)) for name in NAMES}
    llama3, extras = cfgs["llama3"]
    assert llama3.rope_scaling == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    assert llama3.tie_word_embeddings and llama3.rope_theta == 500000.0 and llama3.head_dim == 16
    assert extras["eos_token_ids"] == [508, 511] and extras["torch_dtype"] == "bfloat16"
    generation = GenerationDefaults.from_config(read_json(os.path.join(FIXTURES, "llama3"), "generation_config.json"))
    assert list(generation.eos_token_ids) == [508, 511] and generation.sampling == {"temperature": 0.6, "top_p": 0.9}
    linear_cfg = cfgs["llama2_linear"][0]
    assert linear_cfg.head_dim == 32 and linear_cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert not linear_cfg.tie_word_embeddings
    assert cfgs["mistral"][0].sliding_window == 4096
    assert cfgs["qwen2"][0].qkv_bias and not cfgs["qwen2"][0].qk_norm
    assert cfgs["qwen3"][0].qk_norm and cfgs["qwen3"][0].head_dim == 32 and not cfgs["qwen3"][0].qkv_bias
    for cfg, _ in cfgs.values():  # the config round-trips through its dict
        assert LlamaConfig.from_dict(cfg.to_dict()) == cfg


def test_bfloat16_widens_exactly():
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0001, 0x3E4D], np.uint16)
    assert bfloat16_to_float32(bits).tolist() == [1.0, -2.0, np.inf, np.float32(2.0**-133), 0.2001953125]


def slots(table, positions, block_size):
    return [table[p // block_size] * block_size + p % block_size for p in positions]


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_step_graphs_equal_transformers(name, tmp_path):
    """The exported step graphs apply the q/k/v biases (qwen2) and the q/k norms (qwen3) as forward_full does:
    prompt 0 but its last token is prefilled, then one step decodes that last token beside the whole of prompt 1;
    both rows' logits are transformers' first-step logits."""
    from mindspore_serving.agent.graph_runner import GraphRunner
    from mindspore_serving.llm.model_io import SeqStep
    from mindspore_serving.models.llama.config import ExportConfig, ModelFile
    from mindspore_serving.models.llama.export import export_graphs

    exp, want = expected(name)
    model = build_hf_model(os.path.join(FIXTURES, name))
    export_graphs(ModelFile(model.cfg, ExportConfig(block_size=8)), str(tmp_path), model=model, log=lambda _: None)
    runner = GraphRunner(str(tmp_path), num_blocks=17, warmup=False)
    first, second = exp["prompts"][0]["input_ids"], exp["prompts"][1]["input_ids"]
    tables = [list(range(1, 9)), list(range(9, 17))]
    n = len(first) - 1
    runner.run([SeqStep(first[:n], 0, tables[0])])
    logits = runner.run([SeqStep([first[n]], n, tables[0]), SeqStep(second, 0, tables[1])])
    assert runner.mixed_calls == 1
    assert_logits_close(logits[0], want[0])
    assert_logits_close(logits[1], want[1])


def forward_tp2(cfg, whole, input_ids):
    """forward_full over the two tensor-parallel shards of `whole`, the AllReduce of the row-parallel o_proj and
    down_proj outputs done here as a sum of the ranks' partial products."""
    tp = 2
    shard_cfg = dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // tp,
        num_kv_heads=cfg.num_kv_heads // tp,
        intermediate_size=cfg.intermediate_size // tp,
    )
    ranks = []
    for rank in range(tp):
        model = LlamaModel(shard_cfg)  # one rank's shapes, without the AllReduce (no cluster here)
        params = dict(model.parameters_and_names())
        for name, value in shard_weights(cfg, whole, tp, rank).items():
            params[name].set_data(Tensor(value))
        ranks.append(model)
    model = ranks[0]
    b, t = input_ids.shape
    keys = model.position_table[:t]  # as forward_full builds them (see its note on ops.arange)
    cos, sin = rotary_cos_sin(ops.expand_dims(keys, 0), model.inv_freq)
    mask = model.mask_bias(ops.expand_dims(ops.expand_dims(keys, 0) <= ops.expand_dims(keys, 1), 0))
    x = ops.gather(model.embed_tokens, Tensor(input_ids), 0)
    for i in range(cfg.num_layers):
        layers = [r.layers[i] for r in ranks]
        x = x + sum(linear(lay.attend(*lay.qkv(lay.weights(), x, cos, sin), mask), lay.o_proj) for lay in layers)
        partial = []
        for lay in layers:
            gate, up = ops.split(
                linear(rms_norm(x, lay.post_attn_norm, cfg.rms_norm_eps), lay.gate_up_proj),
                cfg.intermediate_size // tp,
                -1,
            )
            partial.append(linear(ops.silu(gate) * up, lay.down_proj))
        x = x + sum(partial)
    return model.logits(model.weights(), x.reshape(b * t, -1)).asnumpy().reshape(b, t, -1)


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_tensor_parallel_shards_sum_to_transformers_logits(name):
    """qwen2 shards q/k/v biases with their rows, qwen3 replicates its q/k norms."""
    exp, want = expected(name)
    cfg, _ = read_hf_config(os.path.join(FIXTURES, name))
    whole = load_hf_weights(os.path.join(FIXTURES, name), cfg)
    ids = exp["prompts"][0]["input_ids"]
    logits = forward_tp2(cfg, whole, np.array([ids], np.int32))
    assert_logits_close(logits[0, -1], want[0])


# --- refusals ---


@pytest.fixture
def qwen2_dir(tmp_path):
    path = tmp_path / "qwen2"
    shutil.copytree(os.path.join(FIXTURES, "qwen2"), path)
    return path


def edit_config(model_dir, **changes):
    """Sets config.json's fields; a field set to None is removed."""
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg.update(changes)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (model_dir / "config.json").write_text(json.dumps(cfg))


def refusal(model_dir, max_seq_len=None):
    with pytest.raises(UnsupportedModelError) as err:
        build_hf_model(str(model_dir), max_seq_len)
    assert str(model_dir) not in str(err.value)
    return str(err.value)


def test_unknown_architecture_is_refused(qwen2_dir):
    edit_config(qwen2_dir, architectures=["GPTNeoXForCausalLM"])
    msg = refusal(qwen2_dir)
    assert "'GPTNeoXForCausalLM' is not supported" in msg and "Qwen2ForCausalLM" in msg


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 'rope_scaling.rope_type="yarn"'),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 'rope_scaling.rope_type="dynamic"'),
        ({"hidden_act": "gelu"}, 'hidden_act="gelu"'),
        ({"mlp_bias": True}, "mlp_bias=true"),
        ({"attention_bias": True}, "attention_bias=true"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config="),
        ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types="),
    ],
)
def test_fields_that_change_the_math_are_refused(qwen2_dir, changes, named):
    edit_config(qwen2_dir, **changes)
    assert named in refusal(qwen2_dir)


def test_a_sliding_window_shorter_than_the_served_length_is_refused(qwen2_dir, tmp_path):
    edit_config(qwen2_dir, use_sliding_window=True, sliding_window=64, layer_types=None, max_window_layers=1)
    msg = refusal(qwen2_dir)
    assert "sliding_window=64 (enabled by use_sliding_window)" in msg and "max length 1024" in msg
    assert build_hf_model(str(qwen2_dir), max_seq_len=64).cfg.sliding_window == 64
    edit_config(qwen2_dir, max_window_layers=2)  # layers from max_window_layers on slide: none
    assert build_hf_model(str(qwen2_dir)).cfg.sliding_window is None
    edit_config(qwen2_dir, layer_types=["full_attention", "sliding_attention"])
    assert "sliding_window=64 (used by the sliding_attention layers of layer_types)" in refusal(qwen2_dir)
    mistral = tmp_path / "mistral"
    shutil.copytree(os.path.join(FIXTURES, "mistral"), mistral)
    edit_config(mistral, sliding_window=512)
    assert "sliding_window=512" in refusal(mistral)


def test_a_max_length_beyond_max_position_embeddings_is_refused(qwen2_dir):
    assert "max_position_embeddings=1024" in refusal(qwen2_dir, max_seq_len=2048)


def test_a_missing_tensor_is_refused(qwen2_dir):
    tensors = load_file(str(qwen2_dir / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, str(qwen2_dir / "model.safetensors"))
    assert "lacks 1 tensor(s) the config needs: model.layers.1.self_attn.k_proj.bias" in refusal(qwen2_dir)


def test_an_unexpected_tensor_is_refused(qwen2_dir):
    tensors = load_file(str(qwen2_dir / "model.safetensors"))
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)
    save_file(tensors, str(qwen2_dir / "model.safetensors"))
    assert "does not use: model.layers.0.self_attn.o_proj.bias" in refusal(qwen2_dir)


def test_a_misshapen_tensor_is_refused(qwen2_dir):
    edit_config(qwen2_dir, intermediate_size=96)
    assert "tensor model.layers.0.mlp.down_proj.weight has shape [64, 128], config.json implies [64, 96]" in refusal(
        qwen2_dir
    )


def test_a_missing_shard_is_refused(tmp_path):
    model_dir = tmp_path / "llama2_linear"
    shutil.copytree(os.path.join(FIXTURES, "llama2_linear"), model_dir)
    os.remove(model_dir / "model-00002-of-00003.safetensors")
    assert "weight file model-00002-of-00003.safetensors is missing" in refusal(model_dir)


def test_tensor_parallelism_must_divide_the_heads():
    cfg, _ = read_hf_config(os.path.join(FIXTURES, "qwen3"))
    check_tensor_parallel(cfg, 2)
    with pytest.raises(
        ValueError,
        match=r"tensor_parallel=4 does not divide the model's num_kv_heads=2 .*"
        r"valid tensor_parallel values: \[1, 2\]",
    ):
        check_tensor_parallel(cfg, 4)
    with pytest.raises(ValueError, match="tensor_parallel=3 does not divide the model's num_heads=4"):
        build_hf_model(os.path.join(FIXTURES, "qwen3"), tp=3)
