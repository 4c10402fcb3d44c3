"""Prompt logprobs on the real exported graphs of the bundled tiny LLaMA equal log_softmax of the model's cache-free
forward (`LlamaModel.forward_full` on the same checkpoint), and scoring a prompt changes nothing for the requests
batched beside it.

The engine drives the bundled servable's graphs in this process (GraphRunner): the scored prompt is computed in
chunks of the token budget with every position's logits, its first block already in the prefix
cache (a scored request computes it anyway), beside plain greedy requests whose tokens must equal theirs alone.
"""

import numpy as np
import pytest
from llm_setup import CONFIG

from mindspore_serving.llm import LLMEngine, SchedulerConfig
from mindspore_serving.llm.prompt_scores import log_softmax
from mindspore_serving.llm.request import FinishReason
from mindspore_serving.spec.llm_config import load_serving_config

ATOL = 1e-4
TOP = 5
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model():
    from mindspore_serving.models.llama.config import load_config  # lazy: as above
    from mindspore_serving.models.llama.model import build_model  # lazy: as above

    config = load_serving_config(CONFIG).model
    net = build_model(load_config(config.config).model, checkpoint=config.checkpoint)
    net.set_train(False)
    return net


def forward_logprobs(model, prompt):
    """log_softmax of the cache-free forward's logits [len(prompt), vocab], float64."""
    from mindspore import Tensor  # lazy: as above

    return log_softmax(model.forward_full(Tensor(np.array([prompt], np.int32))).asnumpy()[0])


def tokens(seed, n, vocab):
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def make_engine(runner):
    config = SchedulerConfig.for_runner(
        runner,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=256,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        num_scheduler_steps=4,
    )
    return LLMEngine(runner, scheduler_config=config)


def test_prompt_logprobs_equal_the_full_forward_and_plain_requests_are_unchanged(runner, model):
    vocab = runner.vocab_size
    shared = tokens(0, 32, vocab)
    scored = shared + tokens(1, 118, vocab)  # 150 tokens: chunks of the 64-token budget
    plain = [(shared + tokens(2, 9, vocab), 12), (tokens(3, 40, vocab), 20), (tokens(4, 5, vocab), 9)]
    alone = [make_engine(runner).generate([prompt], dict(GREEDY, max_new_tokens=n))[0].token_ids for prompt, n in plain]

    engine = make_engine(runner)
    before = runner.calls
    ids = [engine.add_request(prompt_token_ids=plain[0][0], params=dict(GREEDY, max_new_tokens=plain[0][1]))]
    engine.step()  # the shared block is cached (and running) before the scored prompt arrives
    ids.append(engine.add_request(prompt_token_ids=scored, params=dict(GREEDY, max_new_tokens=4, prompt_logprobs=TOP)))
    ids += [engine.add_request(prompt_token_ids=p, params=dict(GREEDY, max_new_tokens=n)) for p, n in plain[1:]]
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert runner.calls > before

    first = outputs[ids[1]][0]
    want = forward_logprobs(model, scored)
    assert first.prompt_logprobs[0] is None and first.prompt_top_logprobs[0] == []
    got = np.array(first.prompt_logprobs[1:], np.float64)
    np.testing.assert_allclose(got, want[np.arange(len(scored) - 1), scored[1:]], rtol=0, atol=ATOL)
    for position in range(1, len(scored)):
        top = first.prompt_top_logprobs[position]
        row = want[position - 1]
        assert [t for t, _ in top] == np.argsort(-row, kind="stable")[:TOP].tolist(), position
        np.testing.assert_allclose([v for _, v in top], row[[t for t, _ in top]], rtol=0, atol=ATOL)
    assert first.metrics.num_cached_tokens == 0  # computed whole, though its first 32 tokens were cached
    assert outputs[ids[1]][-1].token_ids[0] == int(np.argmax(want[-1]))  # greedy after the whole prompt
    for request_id, expected in zip([ids[0]] + ids[2:], alone):
        assert outputs[request_id][-1].token_ids == expected
        assert all(out.prompt_logprobs is None for out in outputs[request_id])


def test_max_new_tokens_zero_scores_the_prompt_or_finishes_at_once(runner, model):
    prompt = tokens(5, 70, runner.vocab_size)
    engine = make_engine(runner)
    (scored,) = engine.generate([prompt], dict(GREEDY, max_new_tokens=0, prompt_logprobs=0))
    assert scored.finished and scored.finish_reason is FinishReason.LENGTH and scored.token_ids == []
    want = forward_logprobs(model, prompt)
    np.testing.assert_allclose(
        scored.prompt_logprobs[1:], want[np.arange(len(prompt) - 1), prompt[1:]], rtol=0, atol=ATOL
    )
    assert all(top == [] for top in scored.prompt_top_logprobs)
    before = runner.calls
    (nothing,) = engine.generate([prompt], dict(GREEDY, max_new_tokens=0))
    assert nothing.finish_reason is FinishReason.LENGTH and nothing.token_ids == [] and nothing.prompt_logprobs is None
    assert runner.calls == before
