"""An agent's Step service without gRPC: steps run in the order the worker sent them (after_step_id), and rows
continuing a greedy step get its last tokens (async scheduling)."""

import threading
from concurrent import futures

import grpc
import numpy as np
import pytest
from grpc_fakes import FakeFuture

from mindspore_serving.agent.process import AgentServicer
from mindspore_serving.ipc import agent as protocol
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.engine import LLMEngine
from mindspore_serving.llm.model_io import PLACEHOLDER, MixedStep, SeqStep, run_greedy_steps
from mindspore_serving.llm.sampler import greedy_with_logprobs
from mindspore_serving.llm.testing import FakeModelRunner
from mindspore_serving.proto import agent_pb2, agent_pb2_grpc
from mindspore_serving.worker.llm.agent_client import AgentLost, AgentRunner, _StepCall


def make_runner():
    return FakeModelRunner(num_blocks=16, block_size=4, max_seq_len=32, vocab_size=32)


def servicer(runner):
    return AgentServicer(runner, rank=0, device="CPU", on_detach=lambda reason: None)


def encode(*args, **kwargs):
    """A step message of sequences the engine does not name: whole tables, nothing kept between messages."""
    return protocol.StepEncoder().encode(*args, **kwargs)


PROMPTS = [SeqStep([5, 6, 7], 0, [1, 2]), SeqStep([9, 10], 0, [3, 4])]


def test_step_messages_round_trip():
    request = encode(7, PROMPTS, greedy_steps=3, after_step_id=6, prev_rows=[-1, 0])
    assert request.after_step_id == 6 and list(request.prev_rows) == [-1, 0] and request.greedy_steps == 3
    assert protocol.StepDecoder().decode(request) == PROMPTS


def decode_steps(steps, encoder=None, decoder=None):
    """Each step list through one encoder and one decoder, as a worker and its agent see them: (messages,
    decoded steps)."""
    encoder = encoder or protocol.StepEncoder()
    decoder = decoder or protocol.StepDecoder()
    messages = [encoder.encode(i + 1, seqs) for i, seqs in enumerate(steps)]
    return messages, [decoder.decode(message) for message in messages]


def test_a_named_sequence_sends_its_table_once_then_the_blocks_appended():
    steps = [
        [SeqStep([1, 2, 3, 4, 5], 0, [7, 8], seq_id=0)],
        [SeqStep([6], 5, [7, 8], seq_id=0), SeqStep([9, 9], 0, [3], seq_id=1)],
        [SeqStep([7], 6, [7, 8, 11], seq_id=0), SeqStep([1], 2, [3], seq_id=1)],
    ]
    messages, decoded = decode_steps(steps)
    assert decoded == steps
    assert [list(m.block_tables) for m in messages] == [[7, 8], [3], [11]]
    assert [list(m.table_starts) for m in messages] == [[], [2, 0], [2, 1]]


def test_a_table_that_does_not_extend_the_kept_one_is_sent_whole():
    # preempted and scheduled again on other blocks, or unnamed
    steps = [
        [SeqStep([1, 2], 0, [7, 8], seq_id=0), SeqStep([4], 3, [5], seq_id=-1)],
        [SeqStep([1, 2, 3], 0, [9, 8], seq_id=0), SeqStep([4], 4, [5], seq_id=-1)],
    ]
    messages, decoded = decode_steps(steps)
    assert decoded == steps
    assert list(messages[1].block_tables) == [9, 8, 5] and not messages[1].table_starts


def test_tables_pushed_out_are_released_on_both_sides():
    encoder, decoder = protocol.StepEncoder(max_tables=2), protocol.StepDecoder()
    steps = [
        [SeqStep([1], 0, [1], seq_id=0)],
        [SeqStep([1], 0, [2], seq_id=1)],
        [SeqStep([1], 0, [3], seq_id=2)],
        [SeqStep([2], 1, [1], seq_id=0)],
    ]
    messages, decoded = decode_steps(steps, encoder, decoder)
    assert decoded == steps
    assert list(messages[2].released_seq_ids) == [0]
    assert list(messages[3].block_tables) == [1] and not messages[3].table_starts  # sent whole again
    assert sorted(decoder._tables) == sorted(encoder._tables)  # pylint: disable=protected-access


def test_after_a_failure_every_table_is_sent_whole_and_the_agent_forgets_the_rest():
    encoder, decoder = protocol.StepEncoder(), protocol.StepDecoder()
    decode_steps([[SeqStep([1], 0, [4], seq_id=0), SeqStep([1], 0, [5], seq_id=1)]], encoder, decoder)
    encoder.reset()
    message = encoder.encode(2, [SeqStep([2], 1, [4], seq_id=0)])
    assert message.reset_tables and list(message.block_tables) == [4] and not message.table_starts
    assert decoder.decode(message) == [SeqStep([2], 1, [4], seq_id=0)]
    assert list(decoder._tables) == [0]  # pylint: disable=protected-access


def test_a_table_the_agent_does_not_hold_fails_the_step_with_a_reason():
    encoder = protocol.StepEncoder()
    encoder.encode(1, [SeqStep([1], 0, [4], seq_id=3)])  # never reached this agent
    message = encoder.encode(2, [SeqStep([2], 1, [4, 6], seq_id=3)])
    with pytest.raises(RuntimeError, match="sequence 3 continues a table of 1 blocks that this agent does not hold"):
        protocol.StepDecoder().decode(message)


def test_a_long_context_decode_step_shrinks():
    rng = np.random.default_rng(0)
    tables = [list(rng.choice(np.arange(1, 512), 12, replace=False)) for _ in range(16)]
    first = [SeqStep([3], 180, [int(b) for b in t], seq_id=i) for i, t in enumerate(tables)]
    later = [SeqStep([4], 181, seq.block_table, seq_id=seq.seq_id) for seq in first]
    messages, _ = decode_steps([first, later])
    whole = encode(2, later).ByteSize()
    assert messages[1].ByteSize() < whole / 2


def test_placeholder_rows_continue_from_the_last_greedy_step():
    agent = servicer(make_runner())
    first = protocol.decode_greedy(agent.Step(encode(1, PROMPTS, greedy_steps=2), None), 2)
    follow = [SeqStep([PLACEHOLDER], 4, [1, 2]), SeqStep([PLACEHOLDER], 3, [3, 4])]
    second = protocol.decode_greedy(agent.Step(encode(2, follow, 2, after_step_id=1, prev_rows=[0, 1]), None), 2)
    want, _ = run_greedy_steps(make_runner(), PROMPTS, 4)
    np.testing.assert_array_equal(np.concatenate([first[0], second[0]], axis=1), want)


def test_a_step_waits_for_the_step_it_follows():
    runner = make_runner()
    agent = servicer(runner)
    follow = [SeqStep([PLACEHOLDER], 3, [1, 2]), SeqStep([PLACEHOLDER], 2, [3, 4])]
    replies = {}
    later = threading.Thread(
        target=lambda: replies.setdefault(2, agent.Step(encode(2, follow, 1, after_step_id=1, prev_rows=[0, 1]), None))
    )
    later.start()  # sent second, arrives first
    replies[1] = agent.Step(encode(1, PROMPTS, greedy_steps=1), None)
    later.join(timeout=30)
    assert not replies[1].error and not replies[2].error
    assert [len(call[0].token_ids) for call in runner.calls] == [3, 1]  # the prompts ran first


def test_placeholders_after_a_failed_step_fail_with_a_reason():
    runner = make_runner()
    agent = servicer(runner)
    runner.fail_next = RuntimeError("device lost")
    assert "device lost" in agent.Step(encode(1, PROMPTS, greedy_steps=2), None).error
    follow = [SeqStep([PLACEHOLDER], 4, [1, 2])]
    reply = agent.Step(encode(2, follow, 2, after_step_id=1, prev_rows=[0]), None)
    assert "continues row 0 of the previous step, which chose no tokens" in reply.error
    # a step that does not continue anything runs
    assert not agent.Step(encode(3, PROMPTS, 1, after_step_id=2), None).error


def test_the_agent_runs_a_step_on_the_tables_it_kept():
    runner = make_runner()
    agent, encoder = servicer(runner), protocol.StepEncoder()
    prompt = SeqStep([5, 6, 7, 8, 9], 0, [1, 2], seq_id=0)
    assert not agent.Step(encoder.encode(1, [prompt]), None).error
    decode = SeqStep([4], 5, [1, 2], seq_id=0)
    message = encoder.encode(2, [decode], after_step_id=1)
    assert not message.block_tables  # nothing new to send
    assert not agent.Step(message, None).error
    assert runner.calls[-1][0] == decode


def test_a_failed_step_makes_the_worker_send_whole_tables_again():
    failures = []
    call = _StepCall(0, lambda _call, failed: failures.append(failed))
    call.start([FakeFuture(agent_pb2.StepReply(step_id=1)), FakeFuture(agent_pb2.StepReply(step_id=1, error="boom"))])
    with pytest.raises(RuntimeError, match="agent rank 1 step failed: boom"):
        call.result()
    assert failures == [True]


def test_a_step_fails_at_once_when_one_rank_fails_while_another_never_answers():
    """A rank of a broken cluster blocks in its collective: the step must not wait for it."""
    failures = []
    blocked = FakeFuture(done=False)
    call = _StepCall(0, lambda _call, failed: failures.append(failed))
    call.start([blocked, FakeFuture(agent_pb2.StepReply(step_id=1, error="rank gone"))])
    with pytest.raises(RuntimeError, match="rank gone"):
        call.result()
    assert failures == [True] and blocked.cancelled_by_caller


def test_an_aborted_step_raises_the_reason_the_group_was_lost():
    call = _StepCall(0, lambda _call, failed: None)
    call.start([FakeFuture(done=False), FakeFuture(done=False)])
    call.abort("LLM agent rank 1 is not responding")
    with pytest.raises(AgentLost, match="rank 1 is not responding"):
        call.result()


class AttachContext:
    """A gRPC context: its metadata, abort raising, and the callback that ends an Attach stream."""

    def __init__(self, metadata=()):
        self.metadata, self.callbacks = metadata, []

    def invocation_metadata(self):
        return self.metadata

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def abort(self, code, details):
        raise RuntimeError((code, details))


def test_one_worker_with_the_group_s_secret_attaches_and_steps():
    agent = AgentServicer(make_runner(), rank=0, device="CPU", on_detach=lambda reason: None, secret="s3")
    for given in ("", "wrong"):
        with pytest.raises(RuntimeError) as info:
            next(agent.Attach(agent_pb2.AttachRequest(worker_pid=7, secret=given), AttachContext()))
        assert info.value.args[0] == (grpc.StatusCode.PERMISSION_DENIED, "not the worker of this agent group")
    attached = agent.Attach(agent_pb2.AttachRequest(worker_pid=8, secret="s3"), AttachContext())
    assert next(attached).message == "attached"
    good = AttachContext(((protocol.SECRET_METADATA, "s3"),))
    assert not agent.Step(encode(1, PROMPTS), good).error
    with pytest.raises(RuntimeError) as info:  # a second worker, even with the secret: the session stays
        next(agent.Attach(agent_pb2.AttachRequest(worker_pid=9, secret="s3"), AttachContext()))
    assert info.value.args[0] == (grpc.StatusCode.ALREADY_EXISTS, "another worker is attached to this agent")
    with pytest.raises(RuntimeError):
        agent.Step(encode(2, PROMPTS, after_step_id=1), AttachContext(((protocol.SECRET_METADATA, "no"),)))
    assert not agent.Step(encode(2, PROMPTS, after_step_id=1), good).error  # steps go on from where they were


def test_every_token_s_logits_of_the_sequences_that_ask_cross_the_boundary():
    """A sequence with all_logits keeps the flag through the step message, and the reply carries its every-token
    logits (a StepLogits) beside every sequence's last ones; the agent says it can score."""
    agent = servicer(make_runner())
    steps = [
        SeqStep([5, 6, 7], 0, [1, 2], all_logits=True),
        SeqStep([9, 10], 0, [3, 4]),
        SeqStep([3, 4, 5, 6, 7], 0, [5, 6], all_logits=True),
    ]
    request = encode(1, steps)
    assert list(request.all_logits_rows) == [0, 2] and protocol.StepDecoder().decode(request) == steps
    got = protocol.decode_logits(agent.Step(request, None))
    want = make_runner().run(steps)
    assert sorted(got.every) == [0, 2]
    np.testing.assert_array_equal(got.last, want.last)
    for row in (0, 2):
        np.testing.assert_array_equal(got.every[row], want.every[row])
    assert agent.Info(agent_pb2.AgentInfoRequest(), None).score_refusal == ""
    plain = protocol.decode_logits(agent.Step(encode(2, [SeqStep([4], 3, [1, 2])], after_step_id=1), None))
    assert isinstance(plain, np.ndarray) and plain.shape == (1, 32)


def test_a_mixed_step_replies_every_row_s_greedy_token_and_the_logits_of_its_logits_rows_only():
    """A mixed step (logits_rows): one step; the reply carries each row's greedy token and logprob as a greedy
    step's, and the logits of the rows named only; a later placeholder row continues from its greedy tokens. Every
    rank gets the same message; only rank 0's reply carries the step's result."""
    agent = servicer(make_runner())
    request = encode(1, PROMPTS, greedy_steps=1, logits_rows=[1])
    assert list(request.logits_rows) == [1] and protocol.StepDecoder().decode(request) == PROMPTS
    reply = agent.Step(request, None)
    assert not reply.error and reply.rows == 2 and len(reply.logits) == 1 * 32 * 4  # one row of float32 logits
    logits = make_runner().run(PROMPTS)
    tokens, logprobs = greedy_with_logprobs(logits)
    call = _StepCall(1, lambda _call, failed: None, num_logits_rows=1)
    call.start([FakeFuture(reply), FakeFuture(agent_pb2.StepReply(step_id=1))])  # rank 1 replies nothing
    got = call.result()
    assert isinstance(got, MixedStep)
    np.testing.assert_array_equal(got.tokens, tokens[:, None])
    np.testing.assert_array_equal(got.logprobs, logprobs[:, None].astype(np.float32))
    np.testing.assert_array_equal(got.logits, logits[[1]])
    follow = [SeqStep([PLACEHOLDER], 3, [1, 2]), SeqStep([PLACEHOLDER], 2, [3, 4])]
    second = protocol.decode_greedy(agent.Step(encode(2, follow, 1, after_step_id=1, prev_rows=[0, 1]), None), 1)
    want, _ = run_greedy_steps(make_runner(), PROMPTS, 2)
    np.testing.assert_array_equal(second[0][:, 0], want[:, 1])


def test_a_mixed_step_s_verifying_rows_bring_greedy_tokens_or_every_logit_back_and_it_refuses_rounds():
    """Rows verifying proposed tokens (all_logits) in a mixed step: one that is a logits row gets every position's
    logits, any other only the greedy token and logprob at each position; a one-step greedy step with such rows
    and no logits rows is a mixed step too. A mixed step is one step."""
    agent = servicer(make_runner())
    steps = [
        SeqStep([5, 6, 7], 0, [1, 2], all_logits=True),
        SeqStep([9, 10], 0, [3, 4]),
        SeqStep([3, 4, 5], 0, [5, 6], all_logits=True),
    ]
    want = make_runner().run(steps)
    for step_id, logits_rows in ((1, [2]), (2, [])):
        reply = agent.Step(encode(step_id, steps, 1, after_step_id=step_id - 1, logits_rows=logits_rows), None)
        call = _StepCall(1, lambda _call, failed: None, num_logits_rows=len(logits_rows), mixed=True)
        call.start([FakeFuture(reply)])
        got = call.result()
        assert isinstance(got, MixedStep) and sorted(got.every) == logits_rows
        np.testing.assert_array_equal(got.tokens[:, 0], greedy_with_logprobs(want.last)[0])
        for row in logits_rows:
            np.testing.assert_array_equal(got.every[row], want.every[row])
        assert sorted(got.verified) == [row for row in (0, 2) if row not in logits_rows]
        for row, (tokens, logprobs) in got.verified.items():
            want_tokens, want_logprobs = greedy_with_logprobs(want.every[row])
            np.testing.assert_array_equal(tokens, want_tokens)
            np.testing.assert_allclose(logprobs, want_logprobs, rtol=1e-6)
        assert len(reply.logits) == len(logits_rows) * 32 * 4  # no other row's logits cross
    assert "is one step, not 2" in agent.Step(encode(3, PROMPTS, 2, after_step_id=2, logits_rows=[0]), None).error
    with pytest.raises(RuntimeError, match="returned 64 logits for 1 rows"):
        protocol.decode_mixed(
            protocol.encode_mixed(4, MixedStep(np.zeros((2, 1), np.int64), np.zeros((2, 1)), np.zeros((2, 32)))), 1
        )


class RecordingServicer(AgentServicer):
    """Records each step's logits rows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logits_rows = []

    def Step(self, request, context):
        self.logits_rows.append(list(request.logits_rows))
        return super().Step(request, context)


@pytest.mark.parametrize("extra", [dict(async_scheduling=True, num_scheduler_steps=4), {}], ids=["async", "single"])
def test_an_engine_over_an_agent_runs_mixed_steps_with_the_tokens_of_each_request_alone(extra):
    """The engine over an AgentRunner and an agent's Step service in this process over the fake model: steps where
    a seeded sampled request decodes beside greedy ones are mixed steps naming its row only, and every request gets
    the tokens it gets alone."""

    def model():
        return FakeModelRunner(num_blocks=64, block_size=4, max_seq_len=64, vocab_size=32)

    agent = RecordingServicer(model(), 0, "CPU", lambda reason: None)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    agent_pb2_grpc.add_LlmAgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    runner = AgentRunner([f"127.0.0.1:{port}"], heartbeat_interval=5.0)
    requests = [
        ([5, 6, 7], dict(temperature=0)),
        ([9, 10], dict(temperature=0.9, seed=3)),
        ([11, 12, 13, 14], dict(temperature=0)),
        ([8, 4], dict(temperature=0)),
    ]
    try:
        engine = LLMEngine(runner, None, SchedulerConfig.for_runner(runner, max_num_seqs=4, **extra), eos_token_id=1)
        ids = [
            engine.add_request(None, dict(p, max_new_tokens=10, ignore_eos=True), prompt_token_ids=prompt)
            for prompt, p in requests
        ]
        finals = {}
        while engine.has_unfinished():
            finals.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
    finally:
        runner.close()
        server.stop(0)
    alone = LLMEngine(model(), None, SchedulerConfig.for_runner(model(), max_num_seqs=4), eos_token_id=1)
    for request_id, (prompt, p) in zip(ids, requests):
        assert finals[request_id] == alone.generate([prompt], dict(p, max_new_tokens=10, ignore_eos=True))[0].token_ids
    assert [1] in agent.logits_rows and all(rows in ([], [1]) for rows in agent.logits_rows)
