"""The worker's watch over its agents: a rank that stops answering (a hung process) is lost within the heartbeat
budget, the step in flight fails at once with the reason, and later steps are refused."""

import threading
import time
from concurrent import futures

import grpc
import pytest

from mindspore_serving.ipc import agent as protocol
from mindspore_serving.llm.model_io import SeqStep
from mindspore_serving.proto import agent_pb2, agent_pb2_grpc
from mindspore_serving.worker.llm.agent_client import AgentLost, AgentRunner


class HangingAgent(agent_pb2_grpc.LlmAgentServicer):
    """Answers Info until `hang` is set; never finishes a Step (like a rank blocked in a collective)."""

    def __init__(self):
        self.hang = threading.Event()
        self.release = threading.Event()

    def Info(self, request, context):
        if self.hang.is_set():
            self.release.wait(10)
        return agent_pb2.AgentInfo(
            protocol_version=protocol.AGENT_PROTOCOL_VERSION,
            block_size=4,
            num_blocks=8,
            max_seq_len=32,
            vocab_size=8,
            device="CPU",
        )

    def Step(self, request, context):
        self.release.wait(10)
        return agent_pb2.StepReply(step_id=request.step_id, error="released")

    def Attach(self, request, context):
        yield agent_pb2.AgentEvent(message="attached")
        self.release.wait(10)


@pytest.fixture
def agent():
    servicer = HangingAgent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    agent_pb2_grpc.add_LlmAgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.release.set()
    server.stop(0)


def test_a_hung_rank_fails_the_step_in_flight_within_the_heartbeat_budget(agent):
    servicer, address = agent
    lost = []
    runner = AgentRunner(
        [address], lambda rank, reason: lost.append((rank, reason)), heartbeat_interval=0.2, heartbeat_misses=2
    )
    try:
        call = runner.submit([SeqStep([1, 2], 0, [1])])
        servicer.hang.set()
        started = time.monotonic()
        with pytest.raises(AgentLost, match="rank 0 .* is not responding"):
            call.result()
        assert time.monotonic() - started < 2.0  # 2 missed pings of 0.2 s, give or take the machine
        assert lost and lost[0][0] == 0 and "not responding" in lost[0][1]
        with pytest.raises(AgentLost):
            runner.submit([SeqStep([3], 2, [1])])
    finally:
        runner.close()
