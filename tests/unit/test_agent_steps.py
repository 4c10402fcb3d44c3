"""An agent's Step service without gRPC: steps run in the order the worker sent them (after_step_id), and rows
continuing a greedy step get its last tokens (async scheduling)."""
import threading

import numpy as np

from mindspore_serving.ipc import agent as protocol
from mindspore_serving.agent.process import AgentServicer
from mindspore_serving.llm.model_io import PLACEHOLDER, SeqStep, run_greedy_steps
from mindspore_serving.llm.testing import FakeModelRunner


def make_runner():
    return FakeModelRunner(num_blocks=16, block_size=4, max_seq_len=32, vocab_size=32)


def servicer(runner):
    return AgentServicer(runner, rank=0, device="CPU", on_detach=lambda reason: None)


PROMPTS = [SeqStep([5, 6, 7], 0, [1, 2]), SeqStep([9, 10], 0, [3, 4])]


def test_step_messages_round_trip():
    request = protocol.encode_step(7, PROMPTS, greedy_steps=3, after_step_id=6, prev_rows=[-1, 0])
    assert request.after_step_id == 6 and list(request.prev_rows) == [-1, 0] and request.greedy_steps == 3
    assert protocol.decode_step(request) == PROMPTS


def test_placeholder_rows_continue_from_the_last_greedy_step():
    agent = servicer(make_runner())
    first = protocol.decode_greedy(agent.Step(protocol.encode_step(1, PROMPTS, greedy_steps=2), None), 2)
    follow = [SeqStep([PLACEHOLDER], 4, [1, 2]), SeqStep([PLACEHOLDER], 3, [3, 4])]
    second = protocol.decode_greedy(agent.Step(protocol.encode_step(2, follow, 2, after_step_id=1,
                                                                    prev_rows=[0, 1]), None), 2)
    want, _ = run_greedy_steps(make_runner(), PROMPTS, 4)
    np.testing.assert_array_equal(np.concatenate([first[0], second[0]], axis=1), want)


def test_a_step_waits_for_the_step_it_follows():
    runner = make_runner()
    agent = servicer(runner)
    follow = [SeqStep([PLACEHOLDER], 3, [1, 2]), SeqStep([PLACEHOLDER], 2, [3, 4])]
    replies = {}
    later = threading.Thread(target=lambda: replies.setdefault(
        2, agent.Step(protocol.encode_step(2, follow, 1, after_step_id=1, prev_rows=[0, 1]), None)))
    later.start()  # sent second, arrives first
    replies[1] = agent.Step(protocol.encode_step(1, PROMPTS, greedy_steps=1), None)
    later.join(timeout=30)
    assert not replies[1].error and not replies[2].error
    assert [len(call[0].token_ids) for call in runner.calls] == [3, 1]  # the prompts ran first


def test_placeholders_after_a_failed_step_fail_with_a_reason():
    runner = make_runner()
    agent = servicer(runner)
    runner.fail_next = RuntimeError("device lost")
    assert "device lost" in agent.Step(protocol.encode_step(1, PROMPTS, greedy_steps=2), None).error
    follow = [SeqStep([PLACEHOLDER], 4, [1, 2])]
    reply = agent.Step(protocol.encode_step(2, follow, 2, after_step_id=1, prev_rows=[0]), None)
    assert "continues row 0 of the previous step, which chose no tokens" in reply.error
    # a step that does not continue anything runs
    assert not agent.Step(protocol.encode_step(3, PROMPTS, 1, after_step_id=2), None).error
