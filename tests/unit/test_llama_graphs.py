"""The exported dynamic-shape step graphs, run through GraphRunner, agree with the cache-free `forward_full`.

A very small random model (2 layers, GQA with 2 query heads per kv head) is exported once per module to a
temporary folder. Every comparison is on logits with atol 1e-4 (float32; the logits are O(1) thanks to a large
init std). Covered: the manifest, a prompt then decode steps on non-contiguous blocks, prompts of different lengths
prefilled together beside decode rows, chunked and prefix-cached prefill (start_pos > 0), a step split into several
calls, every position's logits (prompt logprobs, verified proposals), steps of many shapes through one set of
graphs, that padding only writes into the scratch block 0, and what the runner refuses.
"""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

ms = pytest.importorskip("mindspore")
from mindspore import Tensor  # noqa: E402

from mindspore_serving.agent.graph_runner import GraphRunner  # noqa: E402
from mindspore_serving.llm.model_io import SeqStep, StepLogits  # noqa: E402
from mindspore_serving.models.llama.config import ExportConfig, LlamaConfig, ModelFile  # noqa: E402
from mindspore_serving.models.llama.export import export_graphs, reusable_export  # noqa: E402
from mindspore_serving.models.llama.model import build_model  # noqa: E402

ATOL = 1e-4
VOCAB, BLOCK, MAX_LEN, NUM_BLOCKS = 96, 8, 64, 24
CFG = ModelFile(
    LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_seq_len=MAX_LEN,
        initializer_range=0.1,
        tie_word_embeddings=False,
    ),
    ExportConfig(block_size=BLOCK),
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("llama_graphs"))
    model = build_model(CFG.model, seed=3)
    model.set_train(False)
    lines = []
    manifest = export_graphs(CFG, out, model=model, log=lines.append)
    return out, model, manifest, lines


@pytest.fixture(scope="module")
def runner(exported):
    return GraphRunner(exported[0], num_blocks=NUM_BLOCKS)


def reference(model, tokens):
    """Logits of every token of `tokens`, computed without any cache."""
    return model.forward_full(Tensor(np.array([tokens], np.int32))).asnumpy()[0]


def tokens_of(seed, n):
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_manifest_lists_the_step_graphs_and_the_weights_once(exported):
    out, model, manifest, lines = exported
    assert manifest["format_version"] == 3
    assert sorted(manifest["graphs"]) == ["head", "layer", "layer_chunk", "layer_decode", "prepare"]
    assert all(os.path.isfile(os.path.join(out, g["file"])) for g in manifest["graphs"].values())
    assert manifest["graphs"]["layer"]["weights"][:3] == ["input_norm", "q_proj", "kv_proj"]
    assert manifest["graphs"]["head"]["weights"] == ["norm", "lm_head"]
    assert manifest["cache"]["shape"] == [-1, 2, 8] and manifest["block_size"] == BLOCK
    assert json.load(open(os.path.join(out, "manifest.json"))) == manifest
    stored = load_file(os.path.join(out, manifest["weights"]["file"]))
    assert sorted(stored) == sorted(manifest["weights"]["names"])
    np.testing.assert_array_equal(stored["embed_tokens"], model.embed_tokens.asnumpy())
    for name in manifest["graphs"]:  # no graph holds a weight
        data = open(os.path.join(out, f"{name}.mindir"), "rb").read()
        assert model.layers[0].q_proj.asnumpy()[3].tobytes() not in data
    # a line per phase of the export
    assert lines[1].startswith("weights: wrote")
    assert [line.split()[2] for line in lines[2:]] == [f"{name}.mindir" for name in manifest["graphs"]]


def test_a_reusable_export_is_the_same_network_weights_and_format(exported, tmp_path):
    out = exported[0]
    assert reusable_export(CFG, out, "in-memory model")
    assert not reusable_export(CFG, out, "random(seed=0)")  # other weights
    other = ModelFile(CFG.model, ExportConfig(block_size=16))
    assert not reusable_export(other, out, "in-memory model")
    assert not reusable_export(CFG, str(tmp_path), "in-memory model")  # nothing there


def test_prefill_then_decode_on_non_contiguous_blocks(exported, runner):
    model = exported[1]
    runner.reset_kv_caches()
    tokens = tokens_of(0, 11)
    table = [7, 3, 19]  # out of order, not adjacent; room for 24 tokens
    logits = runner.run([SeqStep(tokens, 0, table)])
    assert logits.shape == (1, VOCAB) and logits.dtype == np.float32
    assert_close(logits[0], reference(model, tokens)[-1])
    for _ in range(6):  # crosses from block 3 into block 19
        nxt = int(np.argmax(logits[0]))
        logits = runner.run([SeqStep([nxt], len(tokens), table)])
        tokens.append(nxt)
        assert_close(logits[0], reference(model, tokens)[-1])
    caches = [c.asnumpy().reshape(NUM_BLOCKS, BLOCK, -1) for c in runner.kv_caches]
    untouched = [b for b in range(1, NUM_BLOCKS) if b not in table]
    assert all(not c[untouched].any() for c in caches), "padding must only write into the scratch block 0"


def test_prompts_prefilled_together_beside_decode_rows_in_one_call(exported, runner):
    """Decoding sequences and new prompts of different lengths in one step: one graph call, every row's logits
    those of forward_full, also for a prompt chunk that continues a cached prefix (start_pos > 0)."""
    model = exported[1]
    runner.reset_kv_caches()
    a, b = tokens_of(20, 9), tokens_of(21, 3)
    tables = {"a": [2, 5], "b": [7], "c": [9, 11], "d": [13], "e": [15, 16, 17]}
    runner.run([SeqStep(a, 0, tables["a"]), SeqStep(b, 0, tables["b"])])
    c, d, e = tokens_of(22, 12), tokens_of(23, 2), tokens_of(24, 20)
    runner.run([SeqStep(e[:8], 0, tables["e"])])  # e's first 8 tokens are cached
    a.append(4)
    b.append(6)
    before, mixed = runner.calls, runner.mixed_calls
    logits = runner.run(
        [
            SeqStep(c, 0, tables["c"]),
            SeqStep([a[-1]], len(a) - 1, tables["a"]),
            SeqStep(d, 0, tables["d"]),
            SeqStep([b[-1]], len(b) - 1, tables["b"]),
            SeqStep(e[8:], 8, tables["e"]),
        ]
    )
    assert (runner.calls, runner.mixed_calls) == (before + 1, mixed + 1)
    for row, seq in zip(logits, (c, a, d, b, e)):
        assert_close(row, reference(model, seq)[-1])


def test_a_step_larger_than_a_call_is_split_and_long_prompts_chunked(exported):
    """max_num_tokens 8: the decode rows in the first call, then the prompts, cut where a call is full, each piece
    attending to the pieces before it through the cache."""
    model = exported[1]
    small = GraphRunner(exported[0], num_blocks=NUM_BLOCKS, max_num_tokens=8, warmup=False)
    prompts = [tokens_of(30, 19), tokens_of(31, 5)]
    tables = [[1, 2, 3], [4]]
    logits = small.run([SeqStep(p, 0, t) for p, t in zip(prompts, tables)])
    assert small.calls == 3  # 24 tokens in calls of 8
    for row, prompt in zip(logits, prompts):
        assert_close(row, reference(model, prompt)[-1])
    steps = [SeqStep([int(np.argmax(row))], len(p), t) for row, p, t in zip(logits, prompts, tables)]
    steps += [SeqStep([9], 0, [5 + i]) for i in range(9)]  # 11 decode rows: two calls
    logits = small.run(steps)
    assert small.calls == 5
    for row, step, prompt in zip(logits, steps, prompts):
        assert_close(row, reference(model, prompt + step.token_ids)[-1])


def test_every_position_logits_for_scored_and_verified_rows(exported, runner):
    """A prompt scored in chunks (prompt logprobs) and a decode row verifying 3 proposed tokens, beside plain rows:
    the logits of every position they compute, each equal to forward_full's; plain rows' last logits unchanged."""
    model = exported[1]
    runner.reset_kv_caches()
    scored, plain, verified = tokens_of(40, 20), tokens_of(41, 6), tokens_of(42, 10)
    runner.run([SeqStep(verified[:6], 0, [8, 9])])
    result = runner.run(
        [
            SeqStep(plain, 0, [1]),
            SeqStep(scored[:12], 0, [2, 3, 4], all_logits=True),
            SeqStep(verified[6:], 6, [8, 9], all_logits=True),
        ]
    )
    assert isinstance(result, StepLogits) and sorted(result.every) == [1, 2]
    assert_close(result.last[0], reference(model, plain)[-1])
    assert_close(result.every[1], reference(model, scored[:12]))
    assert_close(result.every[2], reference(model, verified)[6:])
    assert_close(result.last[1], result.every[1][-1])
    result = runner.run([SeqStep(scored[12:], 12, [2, 3, 4], all_logits=True)])  # the next chunk
    assert_close(result.every[0], reference(model, scored)[12:])


def test_steps_of_many_shapes_equal_the_reference(exported, runner):
    """One set of loaded graphs called at a different shape every step (rows, prompt lengths, contexts): each row's
    logits equal forward_full's."""
    model = exported[1]
    rng = np.random.default_rng(5)
    for step in range(6):
        runner.reset_kv_caches()
        rows, seqs, blocks = int(rng.integers(1, 5)), [], iter(rng.permutation(np.arange(1, NUM_BLOCKS)).tolist())
        for r in range(rows):
            length = int(rng.integers(1, 30))
            cached = int(rng.integers(0, length)) if step % 2 else 0
            tokens = tokens_of(100 * step + r, length)
            table = [next(blocks) for _ in range(-(-length // BLOCK))]
            if cached:
                runner.run([SeqStep(tokens[:cached], 0, table)])
            seqs.append((tokens, SeqStep(tokens[cached:], cached, table)))
        logits = runner.run([s for _, s in seqs])
        for row, (tokens, _) in zip(logits, seqs):
            assert_close(row, reference(model, tokens)[-1])


def test_greedy_rounds_equal_single_steps(exported, runner):
    runner.reset_kv_caches()
    prompts, tables = [tokens_of(50, 7), tokens_of(51, 12)], [[1, 2], [3, 4]]
    first = runner.run([SeqStep(p, 0, t) for p, t in zip(prompts, tables)])
    steps = [SeqStep([int(np.argmax(row))], len(p), t) for row, p, t in zip(first, prompts, tables)]
    tokens, logprobs = runner.run_greedy(steps, 4)
    assert tokens.shape == (2, 4) and logprobs.shape == (2, 4) and (logprobs <= 0).all()
    model = exported[1]
    for i, prompt in enumerate(prompts):
        seq = prompt + steps[i].token_ids
        for k in range(4):
            assert int(np.argmax(reference(model, seq)[-1])) == tokens[i, k]
            seq.append(int(tokens[i, k]))


def test_runner_rejects_what_the_graphs_cannot_hold(exported, runner, tmp_path):
    out = exported[0]
    with pytest.raises(ValueError, match="beyond the graphs' max_seq_len=64"):
        runner.run([SeqStep([1] * 10, 60, list(range(1, 10)))])
    with pytest.raises(ValueError, match="has 1 blocks; it needs 2"):
        runner.run([SeqStep([1] * 10, 0, [1])])
    with pytest.raises(ValueError, match="names a block outside the cache's 24 blocks"):
        runner.run([SeqStep([1] * 3, 0, [30])])
    with pytest.raises(ValueError, match="no tokens to compute"):
        runner.run([SeqStep([], 0, [1])])
    with pytest.raises(ValueError, match="differs from the exported block_size=8"):
        GraphRunner(out, num_blocks=8, block_size=BLOCK * 2, warmup=False)
    with pytest.raises(ValueError, match="must be >= 2"):
        GraphRunner(out, num_blocks=1, warmup=False)
    manifest = dict(exported[2], format_version=2)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="format_version 2 is not supported .* export the model again"):
        GraphRunner(str(tmp_path), num_blocks=12, warmup=False)
    with pytest.raises(FileNotFoundError, match="export the model first"):
        GraphRunner(str(tmp_path / "none"), num_blocks=12, warmup=False)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="block_size=5 does not divide"):
        ModelFile(CFG.model, ExportConfig(block_size=5))
    for name in ("prefill_len_buckets", "decode_batch_buckets", "spec_tokens", "mixed_len_buckets"):
        with pytest.raises(ValueError, match=f"export.{name} was removed: .*max_num_batched_tokens; delete it"):
            ExportConfig.from_dict({name: [1]})
    with pytest.raises(ValueError, match="export.num_blocks was removed: .*engine.num_blocks"):
        ExportConfig.from_dict({"num_blocks": 8})
    with pytest.raises(ValueError, match="unknown field"):
        ExportConfig.from_dict({"blok_size": 8})
