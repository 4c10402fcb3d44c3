"""The exported paged LLaMA graphs, run through GraphRunner, agree with the cache-free `forward_full`.

A very small random model (2 layers, GQA with 2 query heads per kv head) is exported once per module to a
temporary folder, its weights once beside the graphs, which take them as inputs. Every comparison is on logits
with atol 1e-4 (float32; the logits are O(1) thanks to a large init std). Covered: a prompt + several decode steps
on non-contiguous blocks, a mixed-length batch with padding, chunked and prefix-cached prefill (start_pos > 0),
prompts longer than the largest length bucket, batches larger than the largest bucket, that padding only ever
writes into the scratch block 0, and the score graphs' logits of every position.
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
from mindspore_serving.models.llama.export import GraphSpec, example_inputs, export_graphs  # noqa: E402
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
    ExportConfig(
        block_size=BLOCK,
        prefill_batch_buckets=(1, 2),
        prefill_len_buckets=(8, 16),
        decode_batch_buckets=(1, 4),
        mixed_decode_buckets=(2,),
        mixed_len_buckets=(8, 16),
        mixed_prefill_rows=(1, 2),
    ),
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("llama_graphs"))
    model = build_model(CFG.model, seed=3)
    model.set_train(False)
    manifest = export_graphs(CFG, out, model=model, log=lambda *_: None)
    return out, model, manifest


@pytest.fixture(scope="module")
def runner(exported):
    return GraphRunner(exported[0], num_blocks=NUM_BLOCKS)


def reference(model, tokens):
    """Logits of the last token of `tokens`, computed without any cache."""
    return model.forward_full(Tensor(np.array([tokens], np.int32))).asnumpy()[0, -1]


def tokens_of(seed, n):
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_manifest_lists_every_bucket(exported):
    _, _, manifest = exported
    files = sorted(g["file"] for g in manifest["graphs"])
    assert files == sorted(
        [
            "prefill_b1_l8.mindir",
            "prefill_b1_l16.mindir",
            "prefill_b2_l8.mindir",
            "prefill_b2_l16.mindir",
            "decode_b1.mindir",
            "decode_b4.mindir",
            "mixed_b2_l8.mindir",
            "mixed_b2_l16.mindir",
            "mixed_b2_r2_l8.mindir",
            "mixed_b2_r2_l16.mindir",
            "score_b1_l8.mindir",
            "score_b1_l16.mindir",
        ]
    )
    assert manifest["max_blocks_per_seq"] == MAX_LEN // BLOCK
    assert manifest["inputs"][:5] == ["input_ids", "positions", "block_tables", "slot_mapping", "query_lens"]
    assert manifest["inputs"][5:] == ["key_cache_0", "value_cache_0", "key_cache_1", "value_cache_1"]


def test_the_weights_are_stored_once_and_no_graph_holds_them(exported, runner):
    """Manifest format 2: weights.safetensors holds the weights under the names the graphs take them in, and no
    graph embeds any (a row of the random embedding is in none of the files); the runner loaded them once and
    passes the same Tensors to every graph after the caches."""
    out, model, manifest = exported
    assert manifest["format_version"] == 2 and manifest["weights"]["file"] == "weights.safetensors"
    assert manifest["weights"]["names"] == model.weight_names()
    stored = load_file(os.path.join(out, "weights.safetensors"))
    for name, weight in zip(model.weight_names(), model.weights()):
        np.testing.assert_array_equal(stored[name], weight.asnumpy())
    row = model.embed_tokens.asnumpy()[5].tobytes()
    for graph in manifest["graphs"]:
        with open(os.path.join(out, graph["file"]), "rb") as f:
            assert row not in f.read(), graph["file"]
    assert runner.state[len(runner.kv_caches) :] == tuple(runner.weights)
    assert len(runner.weights) == len(model.weight_names())


def test_exports_that_embed_their_weights_still_run(exported, runner, tmp_path):
    """A format 1 export (every graph embeds the weights: LlamaModel itself exported) runs without weight inputs
    and computes the logits of the format 2 graphs."""
    _, model, manifest = exported
    specs = [GraphSpec("prefill", 1, 8), GraphSpec("decode", 1, 1)]
    for spec in specs:
        ms.export(
            model,
            *example_inputs(CFG, spec),
            file_name=str(tmp_path / spec.file[: -len(".mindir")]),
            file_format="MINDIR",
        )
    assert model.embed_tokens.asnumpy()[5].tobytes() in (tmp_path / "decode_b1.mindir").read_bytes()
    old = {k: v for k, v in manifest.items() if k != "weights"}
    old.update(
        format_version=1,
        graphs=[{"file": s.file, "phase": s.phase, "batch": s.batch, "length": s.length, "rows": 1} for s in specs],
    )
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    embedded = GraphRunner(str(tmp_path), num_blocks=NUM_BLOCKS, warmup=False)
    assert embedded.weights == [] and embedded.state == tuple(embedded.kv_caches)
    assert "no score graphs" in embedded.score_refusal()  # it serves all but prompt logprobs
    tokens = tokens_of(40, 7)
    runner.reset_kv_caches()
    for steps in ([SeqStep(tokens, 0, [3])], [SeqStep([5], 7, [3])]):
        assert_close(embedded.run(steps), runner.run(steps))


def test_prefill_then_decode_on_non_contiguous_blocks(exported, runner):
    model = exported[1]
    runner.reset_kv_caches()
    tokens = tokens_of(0, 11)
    table = [7, 3, 19]  # out of order, not adjacent; room for 24 tokens
    logits = runner.run([SeqStep(tokens, 0, table)])
    assert logits.shape == (1, VOCAB) and logits.dtype == np.float32
    assert_close(logits[0], reference(model, tokens))
    for _ in range(6):  # crosses from block 3 into block 19
        nxt = int(np.argmax(logits[0]))
        logits = runner.run([SeqStep([nxt], len(tokens), table)])
        tokens.append(nxt)
        assert_close(logits[0], reference(model, tokens))
    caches = [c.asnumpy() for c in runner.kv_caches]
    untouched = [b for b in range(1, NUM_BLOCKS) if b not in table]
    assert all(not c[untouched].any() for c in caches), "padding must only write into the scratch block 0"


def test_mixed_lengths_with_padding_then_batched_decode(exported, runner):
    model = exported[1]
    prompts = [tokens_of(1, 3), tokens_of(2, 9), tokens_of(3, 16)]
    tables = [[2], [5, 6], [9, 1, 4]]
    seqs = [SeqStep(p, 0, t) for p, t in zip(prompts, tables)]
    logits = runner.run(seqs)
    for row, prompt in zip(logits, prompts):
        assert_close(row, reference(model, prompt))
    # one decode step for all three: the decode bucket of 4 with one padding row
    steps = []
    for prompt, table, row in zip(prompts, tables, logits):
        nxt = int(np.argmax(row))
        steps.append(SeqStep([nxt], len(prompt), table))
        prompt.append(nxt)
    before = runner.calls
    logits = runner.run(steps)
    assert runner.calls == before + 1
    for row, prompt in zip(logits, prompts):
        assert_close(row, reference(model, prompt))


def test_mixed_steps_compute_decode_rows_and_prompts_in_one_call(exported, runner):
    """Decoding sequences and new prompts in one step: the decode rows and the longest prompts that fit go
    through one mixed graph (up to two prompt rows here), the rest through prefill graphs; all logits match
    forward_full, also for a prompt chunk that continues a cached prefix (start_pos > 0) and when the prompt
    is longer than every mixed bucket (no mixed call)."""
    model = exported[1]
    runner.reset_kv_caches()
    a, b = tokens_of(20, 9), tokens_of(21, 3)
    tables = {"a": [2, 5], "b": [7], "c": [9, 11], "d": [13], "e": [15, 16, 17], "f": [18]}
    runner.run([SeqStep(a, 0, tables["a"]), SeqStep(b, 0, tables["b"])])
    a.append(4)
    b.append(6)
    c, d, f = tokens_of(22, 12), tokens_of(23, 5), tokens_of(26, 3)
    before = (runner.calls, runner.mixed_calls)
    logits = runner.run(
        [
            SeqStep([a[-1]], len(a) - 1, tables["a"]),
            SeqStep(c, 0, tables["c"]),
            SeqStep([b[-1]], len(b) - 1, tables["b"]),
            SeqStep(d, 0, tables["d"]),
            SeqStep(f, 0, tables["f"]),
        ]
    )
    # one mixed call (a, b, c, d: the two longest prompts) and one prefill call (f)
    assert (runner.calls - before[0], runner.mixed_calls - before[1]) == (2, 1)
    for row, tokens in enumerate([a, c, b, d, f]):
        assert_close(logits[row], reference(model, tokens))
    # the rest of prompt c after a cached prefix of 12 tokens, mixed with a decode row of a: one prompt row
    c_more = tokens_of(24, 3)
    a.append(8)
    logits = runner.run([SeqStep(c_more, len(c), tables["c"]), SeqStep([a[-1]], len(a) - 1, tables["a"])])
    assert runner.mixed_calls - before[1] == 2
    assert_close(logits[0], reference(model, c + c_more))
    assert_close(logits[1], reference(model, a))
    # a prompt longer than the longest mixed bucket: a decode call and a prefill call
    e = tokens_of(25, 20)
    b.append(1)
    logits = runner.run([SeqStep([b[-1]], len(b) - 1, tables["b"]), SeqStep(e, 0, tables["e"])])
    assert runner.mixed_calls - before[1] == 2
    assert_close(logits[0], reference(model, b))
    assert_close(logits[1], reference(model, e))


def test_chunked_and_prefix_cached_prefill(exported, runner):
    model = exported[1]
    prompt = tokens_of(4, 21)
    table = [11, 3, 8]
    runner.run([SeqStep(prompt[:13], 0, table)])  # first chunk
    logits = runner.run([SeqStep(prompt[13:], 13, table)])  # second chunk reads the first from the cache
    assert_close(logits[0], reference(model, prompt))
    # a second sequence sharing the first full block (prefix cache): only its tail is computed
    other = prompt[:BLOCK] + tokens_of(5, 6)
    logits = runner.run([SeqStep(other[BLOCK:], BLOCK, [11, 14])])
    assert_close(logits[0], reference(model, other))


def test_long_prompt_and_large_batch_are_split(exported, runner):
    model = exported[1]
    # 40 tokens > largest length bucket (16): chunks of 16, 16, 8 in three rounds; the short prompt goes in the
    # first round, in a call of its own length bucket (8)
    long_prompt, short_prompt = tokens_of(6, 40), tokens_of(7, 5)
    before = runner.calls
    logits = runner.run([SeqStep(long_prompt, 0, [1, 2, 3, 4, 5]), SeqStep(short_prompt, 0, [6])])
    assert runner.calls - before == 4
    assert_close(logits[0], reference(model, long_prompt))
    assert_close(logits[1], reference(model, short_prompt))
    # 3 prompts > largest prefill batch (2) and 5 decodes > largest decode batch (4)
    prompts = [tokens_of(10 + i, 4 + i) for i in range(5)]
    tables = [[7 + 2 * i, 8 + 2 * i] for i in range(5)]
    logits = runner.run([SeqStep(p, 0, t) for p, t in zip(prompts[:3], tables[:3])])
    for row, prompt in zip(logits, prompts[:3]):
        assert_close(row, reference(model, prompt))
    runner.run([SeqStep(p, 0, t) for p, t in zip(prompts[3:], tables[3:])])
    steps = []
    for prompt, table in zip(prompts, tables):
        steps.append(SeqStep([5], len(prompt), table))
        prompt.append(5)
    before = runner.calls
    logits = runner.run(steps)
    assert runner.calls - before == 2
    for row, prompt in zip(logits, prompts):
        assert_close(row, reference(model, prompt))


def test_runner_rejects_what_the_graphs_cannot_hold(exported, runner):
    with pytest.raises(ValueError, match="max_seq_len"):
        runner.run([SeqStep([1, 2], MAX_LEN - 1, list(range(1, 9)))])
    with pytest.raises(ValueError, match="blocks"):
        runner.run([SeqStep(tokens_of(8, 10), 0, [1])])
    with pytest.raises(ValueError, match="block_size"):
        GraphRunner(exported[0], num_blocks=8, block_size=BLOCK * 2, warmup=False)
    with pytest.raises(ValueError, match="scratch"):
        GraphRunner(exported[0], num_blocks=1, warmup=False)


def test_runner_keeps_a_block_count_fixed_at_export(exported, tmp_path):
    manifest = dict(exported[2], num_blocks=10)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="fixed in the exported graphs"):
        GraphRunner(str(tmp_path), num_blocks=12, warmup=False)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_heads"):
        LlamaConfig(
            vocab_size=8, hidden_size=30, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=8, max_seq_len=16
        )
    with pytest.raises(ValueError, match="num_kv_heads"):
        LlamaConfig(
            vocab_size=8, hidden_size=24, num_layers=1, num_heads=6, num_kv_heads=4, intermediate_size=8, max_seq_len=16
        )
    with pytest.raises(ValueError, match="unknown field"):
        LlamaConfig.from_dict({"vocab_size": 8, "hidden": 16})
    with pytest.raises(ValueError, match="block_size"):
        ModelFile(CFG.model, ExportConfig(block_size=7))


def test_greedy_rounds_equal_single_steps(exported, runner):
    """run_greedy's decode loop (one bucket, tables filled once) gives the tokens and logprobs of single steps
    through run(), across a block boundary and for a batch that pads its bucket."""
    from mindspore_serving.llm.model_io import run_greedy_steps
    from mindspore_serving.llm.sampler import greedy_with_logprobs

    prompts = {0: (tokens_of(30, 6), [3, 9]), 1: (tokens_of(31, 7), [4, 10]), 2: (tokens_of(32, 2), [5, 11])}
    results = []
    for loop in (runner.run_greedy, lambda seqs, steps: run_greedy_steps(runner, seqs, steps)):
        runner.reset_kv_caches()
        logits = runner.run([SeqStep(p, 0, table) for p, table in prompts.values()])
        first, _ = greedy_with_logprobs(logits)
        seqs = [SeqStep([int(t)], len(p), table) for t, (p, table) in zip(first, prompts.values())]
        results.append(loop(seqs, 5))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="it needs"):  # 5 more tokens after 8 do not fit one block of 8
        runner.run_greedy([SeqStep([1], 8, [3])], 5)


def test_score_graphs_return_every_position_beside_an_ordinary_batch(exported, runner):
    """A sequence with all_logits gets the logits of every token it computes from the score graphs (loaded on
    first use), in chunks of the largest score length, continuing a cached chunk; the other rows of the step
    are computed as without it."""
    model = exported[1]
    runner.reset_kv_caches()
    prompt, other = tokens_of(50, 37), tokens_of(51, 9)
    full = model.forward_full(Tensor(np.array([prompt], np.int32))).asnumpy()[0]
    runner.run([SeqStep(prompt[:5], 0, [2, 3, 4, 5, 6], all_logits=True)])
    before = runner.calls
    result = runner.run([SeqStep(prompt[5:], 5, [2, 3, 4, 5, 6], all_logits=True), SeqStep(other, 0, [7, 8])])
    assert isinstance(result, StepLogits) and sorted(result.every) == [0]
    assert runner.calls - before == 3  # 32 tokens in score chunks of 16, 16; the plain prompt in a prefill call
    assert sorted(runner.score_buckets) == [8, 16]
    assert_close(result.every[0], full[5:])
    assert_close(result.last[0], full[-1])
    assert_close(result.last[1], reference(model, other))
    assert runner.score_refusal() is None
