"""Speculative steps across the agent boundary: rows that ask for every token's logits (a row's last token and its
proposed ones) come back with those logits, several rows of them in one step, beside plain decode rows; and the
worker learns the verify length of its ranks (AgentInfo.spec_tokens: the most proposed tokens a rank's runner verifies
in one call, max_seq_len - 1 for the step graphs; the least over the ranks)."""

from concurrent import futures

import grpc
import numpy as np
import pytest

from mindspore_serving.agent.process import AgentServicer
from mindspore_serving.ipc import agent as protocol
from mindspore_serving.llm.model_io import SeqStep, StepLogits
from mindspore_serving.llm.testing import FakeModelRunner
from mindspore_serving.proto import agent_pb2_grpc
from mindspore_serving.worker.llm.agent_client import AgentRunner

# a verify step: two rows of last token + proposed tokens (all_logits) around a one-token decode row
STEP = [
    SeqStep([5, 6, 7, 8, 9], 3, [1, 5], seq_id=0, all_logits=True),
    SeqStep([4], 2, [2], seq_id=1),
    SeqStep([11, 12], 6, [3, 4], seq_id=2, all_logits=True),
]


def fake_model(spec_tokens=None):
    runner = FakeModelRunner(num_blocks=16, block_size=4, max_seq_len=32, vocab_size=24)
    if spec_tokens is not None:
        runner.spec_tokens = spec_tokens
    return runner


def test_a_step_with_several_verify_rows_round_trips():
    request = protocol.StepEncoder().encode(1, STEP)
    assert list(request.all_logits_rows) == [0, 2]
    assert protocol.StepDecoder().decode(request) == STEP
    result = fake_model().run(STEP)
    assert isinstance(result, StepLogits) and sorted(result.every) == [0, 2]
    got = protocol.decode_logits(protocol.encode_logits(1, result))
    assert sorted(got.every) == [0, 2]
    np.testing.assert_array_equal(got.last, result.last)
    for row in (0, 2):
        assert got.every[row].shape == (STEP[row].query_len, 24)
        np.testing.assert_array_equal(got.every[row], result.every[row])


@pytest.fixture
def agents():
    """Two agents' Step services in this process (fake models verifying 4 and 2 proposed tokens) and a third
    whose runner verifies none (no spec_tokens): (their addresses, models)."""
    models = [fake_model(4), fake_model(2), fake_model()]
    servers, addresses = [], []
    for rank, model in enumerate(models):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        agent_pb2_grpc.add_LlmAgentServicer_to_server(AgentServicer(model, rank, "CPU", lambda reason: None), server)
        addresses.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        server.start()
        servers.append(server)
    yield addresses, models
    for server in servers:
        server.stop(0)


def test_the_worker_gets_the_ranks_verify_length_and_every_verify_rows_logits(agents):
    addresses, models = agents
    runner = AgentRunner(addresses[:2], heartbeat_interval=5.0)
    try:
        assert runner.spec_tokens == 2
        result = runner.run(STEP)
        want = fake_model().run(STEP)
        assert isinstance(result, StepLogits) and sorted(result.every) == [0, 2]
        np.testing.assert_array_equal(result.last, want.last)
        for row in (0, 2):
            np.testing.assert_array_equal(result.every[row], want.every[row])
        assert len(models[0].calls) == len(models[1].calls) == 1  # every rank ran the step
    finally:
        runner.close()
    without = AgentRunner(addresses[2:], heartbeat_interval=5.0)
    try:
        assert without.spec_tokens == 0
    finally:
        without.close()
