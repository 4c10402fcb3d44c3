"""Prompt logprobs (SamplingParams.prompt_logprobs) and max_new_tokens 0 in the engine, over the fake runner.

The oracle: a prompt's logprobs equal log_softmax of the fake runner's logits after each prefix of the prompt
(`FakeModelRunner.logits_for`, a pure function of the tokens read back from the cache), whatever the chunking,
the prefix cache, preemption, the requests batched beside it or an agent process between engine and model; and the
requests batched beside a scored one get the tokens they get alone.
"""

from concurrent import futures

import grpc
import numpy as np
import pytest

from mindspore_serving.agent.process import AgentServicer
from mindspore_serving.agent.testing import AheadRunner
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.engine import LLMEngine
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.model_io import SeqStep, StepLogits
from mindspore_serving.llm.prompt_scores import PromptScores, log_softmax, top_logprobs
from mindspore_serving.llm.request import FinishReason
from mindspore_serving.llm.testing import FakeModelRunner, reference_greedy
from mindspore_serving.proto import agent_pb2_grpc
from mindspore_serving.worker.llm.agent_client import AgentRunner

VOCAB, BS, MAX_LEN = 64, 4, 96
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def make_engine(runner_class=FakeModelRunner, num_blocks=128, **overrides):
    runner = runner_class(num_blocks=num_blocks, block_size=BS, max_seq_len=MAX_LEN, vocab_size=VOCAB)
    values = dict(max_num_seqs=8, max_num_batched_tokens=8, enable_prefix_caching=True)
    values.update(overrides)
    return LLMEngine(runner, None, SchedulerConfig.for_runner(runner, **values), eos_token_id=1, seed=0), runner


def expected_scores(prompt, k):
    """(logprobs, top) of `prompt` from the fake model's logits after each of its prefixes."""
    reference = FakeModelRunner(vocab_size=VOCAB)
    logprobs, tops = [None], [[]]
    for i in range(1, len(prompt)):
        row = log_softmax(reference.logits_for(prompt[:i]))
        logprobs.append(float(row[prompt[i]]))
        tops.append(top_logprobs(row, k) if k else [])
    return logprobs, tops


def assert_scores(output, prompt, k):
    logprobs, tops = expected_scores(prompt, k)
    assert output.prompt_logprobs[0] is None and output.prompt_top_logprobs[0] == []
    np.testing.assert_allclose(output.prompt_logprobs[1:], logprobs[1:], rtol=0, atol=1e-6)
    assert [[t for t, _ in top] for top in output.prompt_top_logprobs] == [[t for t, _ in top] for top in tops]
    for got, want in zip(output.prompt_top_logprobs[1:], tops[1:]):
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=0, atol=1e-6)


def prompt_of(seed, n):
    return np.random.default_rng(seed).integers(2, VOCAB, n).tolist()


def drive(engine, requests):
    """Adds (prompt, params) one per step; returns every output of each request id, in order."""
    outputs, ids, pending = {}, [], list(requests)
    while pending or engine.has_unfinished():
        if pending:
            prompt, params = pending.pop(0)
            ids.append(engine.add_request(None, params, prompt_token_ids=prompt))
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return [outputs[i] for i in ids]


@pytest.mark.parametrize(
    "runner_class, extra", [(FakeModelRunner, {}), (AheadRunner, dict(async_scheduling=True, num_scheduler_steps=4))]
)
def test_scored_prompt_in_chunks_beside_plain_requests(runner_class, extra):
    """A 23-token prompt computed in chunks of the token budget, joining a running batch, its first block in the
    prefix cache already (a scored request computes it anyway): its first output carries every position's
    logprob and top 3; the plain requests around it get their tokens alone; a request sharing its prefix
    afterwards still hits the cache."""
    engine, runner = make_engine(runner_class, **extra)
    shared = prompt_of(1, 8)
    scored = shared + prompt_of(2, 15)
    plain = [(shared + prompt_of(3, 3), 6), (prompt_of(4, 5), 9), (shared + prompt_of(5, 2), 4)]
    requests = [
        (plain[0][0], dict(GREEDY, max_new_tokens=plain[0][1])),
        (scored, dict(GREEDY, max_new_tokens=3, prompt_logprobs=3)),
        (plain[1][0], dict(GREEDY, max_new_tokens=plain[1][1])),
        (plain[2][0], dict(GREEDY, max_new_tokens=plain[2][1])),
    ]
    outputs = drive(engine, requests)
    scored_outputs = outputs[1]
    assert_scores(scored_outputs[0], scored, 3)
    assert all(out.prompt_logprobs is None for out in scored_outputs[1:])
    assert all(out.prompt_logprobs is None for outs in outputs[:1] + outputs[2:] for out in outs)
    assert scored_outputs[-1].token_ids == reference_greedy(
        lambda: FakeModelRunner(block_size=BS, max_seq_len=MAX_LEN, vocab_size=VOCAB), scored, 3
    )
    for outs, (prompt, n) in zip(outputs[:1] + outputs[2:], plain):
        assert outs[-1].token_ids == reference_greedy(
            lambda: FakeModelRunner(block_size=BS, max_seq_len=MAX_LEN, vocab_size=VOCAB), prompt, n
        )
    steps = [seq for call in runner.calls for seq in call if seq.all_logits]
    assert steps[0].start_pos == 0 and sum(s.query_len for s in steps) == len(scored)  # no cache hit, chunked
    assert len(steps) > 2
    assert outputs[3][-1].metrics.num_cached_tokens == 8  # the shared block is still shared


def test_a_scored_request_decodes_in_the_runners_rounds_after_its_prompt():
    engine, runner = make_engine(num_scheduler_steps=4, max_num_batched_tokens=32)
    prompt = prompt_of(3, 10)
    rounds = []
    engine.add_step_listener(lambda stats: rounds.append(stats.num_model_steps))
    engine.add_request(None, {**GREEDY, "max_new_tokens": 9, "prompt_logprobs": 1}, prompt_token_ids=prompt)
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert_scores(outputs[0], prompt, 1)
    assert outputs[-1].token_ids == reference_greedy(lambda: FakeModelRunner(vocab_size=VOCAB), prompt, 9)
    assert rounds[0] == 1 and max(rounds) == 4  # the scored prompt step alone, then multi-step decoding


def test_preempted_scored_prompt_keeps_its_scores():
    """A block pool too small for everyone preempts (recomputes) requests; the scored one's logprobs stay
    those of its prompt."""
    engine, _ = make_engine(num_blocks=14, max_num_batched_tokens=16, max_model_len=32)
    prompts = [prompt_of(10 + i, 13) for i in range(4)]
    requests = [
        (p, dict(GREEDY, max_new_tokens=12, prompt_logprobs=2 if i == 3 else None)) for i, p in enumerate(prompts)
    ]
    outputs = drive(engine, requests)
    assert engine.core.scheduler.num_preemptions > 0
    assert_scores(outputs[3][0], prompts[3], 2)


def test_max_new_tokens_zero_scores_the_prompt_and_generates_nothing():
    engine, runner = make_engine()
    prompt = prompt_of(20, 11)
    plain = prompt_of(21, 6)
    outputs = drive(
        engine, [(prompt, dict(GREEDY, max_new_tokens=0, prompt_logprobs=0)), (plain, dict(GREEDY, max_new_tokens=5))]
    )
    (only,) = outputs[0]
    assert only.finished and only.finish_reason is FinishReason.LENGTH
    assert only.token_ids == [] and only.new_token_ids == [] and only.logprobs == []
    assert_scores(only, prompt, 0)
    assert all(top == [] for top in only.prompt_top_logprobs)
    assert outputs[1][-1].token_ids == reference_greedy(
        lambda: FakeModelRunner(block_size=BS, max_seq_len=MAX_LEN, vocab_size=VOCAB), plain, 5
    )
    assert not engine.has_unfinished() and engine.core.scheduler.block_manager.usage == 0


def test_max_new_tokens_zero_without_scores_finishes_at_once():
    engine, runner = make_engine()
    (out,) = engine.generate([prompt_of(22, 7)], dict(GREEDY, max_new_tokens=0))
    assert out.finished and out.finish_reason is FinishReason.LENGTH and out.token_ids == [] and out.text == ""
    assert out.prompt_logprobs is None and runner.calls == []


def test_a_runner_that_cannot_score_refuses_prompt_logprobs():
    class Plain:
        block_size, num_blocks, max_seq_len, vocab_size = BS, 32, MAX_LEN, VOCAB

        def run(self, seqs):
            return np.zeros((len(seqs), VOCAB), np.float32)

    engine = LLMEngine(Plain(), None, SchedulerConfig.for_runner(Plain()))
    with pytest.raises(InvalidRequestError, match="prompt_logprobs cannot be served.*every prompt position"):
        engine.add_request(None, {"prompt_logprobs": 1}, prompt_token_ids=[3, 4])
    engine.add_request(None, {"max_new_tokens": 1}, prompt_token_ids=[3, 4])


def test_prompt_scores_record_chunks_in_any_order():
    prompt = prompt_of(30, 9)
    logits = np.random.default_rng(31).standard_normal((9, VOCAB)).astype(np.float32)
    scores = PromptScores(prompt, 2)
    assert scores.wants_logits(0, 4) and not scores.wants_logits(8, 1)  # the last position scores nothing
    scores.record(4, logits[4:])
    assert not scores.complete and scores.logprobs()[1:5] == [None] * 4
    scores.record(0, logits[:4])
    assert scores.complete and not scores.wants_logits(0, 9)
    want = log_softmax(logits[:-1])[np.arange(8), prompt[1:]]
    np.testing.assert_allclose(scores.logprobs()[1:], want, rtol=0, atol=1e-12)
    assert scores.top_logprobs()[3] == top_logprobs(log_softmax(logits[2]), 2)


def test_top_logprobs_rank_ties_by_lowest_id():
    row = np.array([0.5, 2.0, 1.0, 2.0, 1.0])
    assert top_logprobs(row, 3) == [(1, 2.0), (3, 2.0), (2, 1.0)]
    assert [t for t, _ in top_logprobs(row, 9)] == [1, 3, 2, 4, 0]


def test_fake_runner_returns_every_position_for_rows_that_ask():
    runner = FakeModelRunner(num_blocks=8, block_size=BS, max_seq_len=MAX_LEN, vocab_size=VOCAB)
    prompt = prompt_of(40, 6)
    result = runner.run([SeqStep(prompt[:2], 0, [1, 2]), SeqStep(prompt, 0, [3, 4], all_logits=True)])
    assert isinstance(result, StepLogits) and list(result.every) == [1]
    np.testing.assert_array_equal(result.every[1][2], runner.logits_for(prompt[:3]))
    np.testing.assert_array_equal(result.last[1], result.every[1][-1])


def test_scores_come_through_an_agent():
    """The engine over an AgentRunner (async scheduling, multi-step rounds) and an agent's Step service in this
    process over the fake model: the scored prompt's logprobs cross the agent boundary."""
    model = FakeModelRunner(num_blocks=64, block_size=BS, max_seq_len=MAX_LEN, vocab_size=VOCAB)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    agent_pb2_grpc.add_LlmAgentServicer_to_server(AgentServicer(model, 0, "CPU", lambda reason: None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    runner = AgentRunner([f"127.0.0.1:{port}"], heartbeat_interval=5.0)
    try:
        assert runner.score_refusal() is None
        config = SchedulerConfig.for_runner(
            runner, max_num_seqs=4, max_num_batched_tokens=8, async_scheduling=True, num_scheduler_steps=4
        )
        engine = LLMEngine(runner, None, config, eos_token_id=1)
        prompt, plain = prompt_of(50, 19), prompt_of(51, 4)
        outputs = drive(
            engine,
            [(plain, dict(GREEDY, max_new_tokens=6)), (prompt, dict(GREEDY, max_new_tokens=0, prompt_logprobs=4))],
        )
        assert_scores(outputs[1][0], prompt, 4)
        assert outputs[0][-1].token_ids == reference_greedy(
            lambda: FakeModelRunner(block_size=BS, max_seq_len=MAX_LEN, vocab_size=VOCAB), plain, 6
        )
    finally:
        runner.close()
        server.stop(0)
