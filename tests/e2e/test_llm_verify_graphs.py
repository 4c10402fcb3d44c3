"""The verify graphs of the bundled speculative servable (servables/llama_tiny_spec, `make models`), run through
GraphRunner: a verified row gets the logits of every position it computes, equal to the score graph's and the
prefill graph's for the same tokens, and a step of verified rows and one-token decode rows is one graph call whose
decode rows get the decode graph's logits. Rows past the largest verify bucket, and steps that also prefill, still
get every row's logits right.
"""

import numpy as np
import pytest
from llm_setup import CONFIG, SPEC_CONFIG

from mindspore_serving.agent.process import AgentServicer
from mindspore_serving.llm.model_io import SeqStep, StepLogits
from mindspore_serving.models.llama.export import graph_specs, reusable_graphs
from mindspore_serving.models.llama.manifest import read_manifest
from mindspore_serving.spec.llm_config import load_serving_config

ATOL = 1e-4
K = 4  # the servable's export.spec_tokens
BLOCK = 16


@pytest.fixture(scope="module")
def config():
    return load_serving_config(SPEC_CONFIG)


def tokens(seed, n, vocab=2048):
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def score(runner, token_ids, block):
    """The score graph's logits of every position of `token_ids` (a prompt from position 0, in blocks from
    `block` on)."""
    blocks = list(range(block, block + -(-len(token_ids) // BLOCK)))
    return runner.run([SeqStep(token_ids, 0, blocks, all_logits=True)]).every[0]


def decode_alone(runner, token, block):
    """The decode graph's logits of one token at position 0 of `block`."""
    return runner.run([SeqStep([token], 0, [block])])[0]


def test_the_export_has_one_verify_graph_per_decode_batch_and_reuses_llama_tiny(config, runner):
    manifest = read_manifest(config.model.graphs[0])
    batches = config.model_file().export.decode_batch_buckets
    assert manifest["spec_tokens"] == K and runner.spec_tokens == K and runner.verify_batches == list(batches)
    verify = sorted(g["file"] for g in manifest["graphs"] if g["phase"] == "verify")
    assert verify == sorted(f"verify_b{b}_l{K + 1}.mindir" for b in batches)
    assert verify == sorted(s.file for s in graph_specs(config.model_file()) if s.phase == "verify")
    # llama_tiny's export has every other graph of it: the spec export compiles only the verify graphs
    base = load_serving_config(CONFIG).model.graphs[0]
    reused = reusable_graphs(config.model_file(), base, config.model.checkpoint)
    assert sorted(reused) == sorted(g["file"] for g in manifest["graphs"] if g["phase"] != "verify")
    assert reusable_graphs(config.model_file(), base, "random(seed=0)") is None
    assert reusable_graphs(config.model_file(), base, config.model.checkpoint, (2, 0)) is None
    assert AgentServicer(runner, 0, "CPU", lambda reason: None).Info(None, None).spec_tokens == K


def test_a_verify_step_is_one_call_with_the_score_and_decode_graphs_logits(runner):
    """A row continuing a 20-token context with its last token and 4 proposed ones, beside two one-token decode
    rows: one graph call; the verified row's logits of every position are the score graph's (and its last the
    prefill graph's) for the whole sequence, the decode rows' the decode graph's."""
    sequence = tokens(1, 25)
    runner.run([SeqStep(sequence[:20], 0, [1, 2])])  # the context, in the cache
    before = runner.calls
    result = runner.run(
        [SeqStep([7], 0, [3]), SeqStep(sequence[20:], 20, [1, 2], all_logits=True), SeqStep([9], 0, [4])]
    )
    assert runner.calls == before + 1
    assert isinstance(result, StepLogits) and list(result.every) == [1] and result.every[1].shape == (K + 1, 2048)
    whole = score(runner, sequence, 10)
    assert_close(result.every[1], whole[20:])
    assert_close(result.last[1], whole[-1])
    assert_close(result.last[1], runner.run([SeqStep(sequence, 0, [20, 21])])[0])  # the prefill graph's
    assert_close(result.last[0], decode_alone(runner, 7, 30))
    assert_close(result.last[2], decode_alone(runner, 9, 31))


def test_short_verify_rows_and_a_prefill_row_in_one_step(runner):
    """Verified rows of 1 and 3 tokens, a decode row and a prompt: a verify call and a prefill call (no mixed
    one), every row's logits as computed alone; a row asking for the logits of more than k + 1 tokens (prompt
    logprobs) goes to the score graphs."""
    one, three, prompt, scored = tokens(2, 1), tokens(3, 3), tokens(4, 12), tokens(5, K + 3)
    before = runner.calls
    result = runner.run(
        [
            SeqStep(one, 0, [40], all_logits=True),
            SeqStep(prompt, 0, [41]),
            SeqStep(three, 0, [42], all_logits=True),
            SeqStep([11], 0, [43]),
        ]
    )
    assert runner.calls == before + 2 and sorted(result.every) == [0, 2]
    assert_close(result.every[0], score(runner, one, 50))
    assert_close(result.every[2], score(runner, three, 51))
    assert_close(result.last[2], result.every[2][-1])
    assert_close(result.last[1], runner.run([SeqStep(prompt, 0, [52])])[0])
    assert_close(result.last[3], decode_alone(runner, 11, 53))
    before = runner.calls
    longer = runner.run([SeqStep(scored, 0, [54], all_logits=True), SeqStep([11], 0, [55])])
    assert runner.calls == before + 2 and len(runner.score_buckets) >= 1
    assert_close(longer.every[0], score(runner, scored, 56))
    assert_close(longer.last[1], decode_alone(runner, 11, 57))


def test_rows_past_the_largest_verify_bucket(runner):
    """3 verified rows and 14 decode rows (17 > 16): the verified rows in verify_b4 with one decode row in its
    padding row, the other 13 in decode_b16; each row's logits as computed alone."""
    verified = [tokens(10 + i, K + 1) for i in range(3)]
    decode = tokens(20, 14)
    seqs = [SeqStep(t, 0, [60 + i], all_logits=True) for i, t in enumerate(verified)] + [
        SeqStep([t], 0, [70 + i]) for i, t in enumerate(decode)
    ]
    before = runner.calls
    result = runner.run(seqs)
    assert runner.calls == before + 2 and sorted(result.every) == [0, 1, 2]
    for i, t in enumerate(verified):
        assert_close(result.every[i], score(runner, t, 85 + i))
    alone = runner.run([SeqStep([t], 0, [70 + i]) for i, t in enumerate(decode)])
    assert_close(result.last[3:], alone)
