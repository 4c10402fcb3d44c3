"""Who may register with the distributed worker, stop its group, and call its ranks (real gRPC services, fake peers;
the worker on 127.0.0.1, the ranks on 127.0.0.2, no secret set).

RegisterAgent hands each rank a notice token, and a rank registers once. AgentExit and AgentFailed stop the group
only with a registered rank's notice token; without one, only AgentFailed is heard, while ranks still register and
naming a host of the rank table. A rank takes Predict and Exit only with the call token it registered with. Each
refusal is PERMISSION_DENIED with a warning naming the caller, and changes nothing."""

from concurrent import futures

import grpc
import numpy as np
import pytest

from mindspore_serving.agent.distributed import rank_agent
from mindspore_serving.ipc import distributed as protocol
from mindspore_serving.proto import distributed_pb2 as dpb
from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc
from mindspore_serving.spec.servable import ModelSpec
from mindspore_serving.worker.distributed import agent_group, service
from mindspore_serving.worker.distributed.agent_group import AgentGroup
from mindspore_serving.worker.distributed.rank_table import RankConfig

INFOS = protocol.tensor_infos_to_proto([((2,), np.dtype(np.float32))])


class _Graph:
    """A rank's graph: y = x + 1."""

    def __init__(self):
        self.calls = 0

    def run(self, inputs):
        self.calls += 1
        return [inputs[0] + 1]


@pytest.fixture
def said(monkeypatch):
    """The warnings and errors logged by the worker's service and group and by the rank agent."""
    lines = []
    for module in (service, agent_group, rank_agent):
        monkeypatch.setattr(module.log, "warning", lines.append)
        monkeypatch.setattr(module.log, "error", lines.append)
    return lines


@pytest.fixture
def cluster(monkeypatch, said):
    """The worker's service of a 2-rank group; `rank(i)` starts a fake rank's service on 127.0.0.2 and registers it
    (returning its address, graph, exit event and RegisterAgentReply)."""
    monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
    servers, channels = [], []

    def serve(servicer, add, host):
        server = protocol.server(futures.ThreadPoolExecutor(max_workers=2))
        add(servicer, server)
        port = protocol.listen(server, f"{host}:0")
        server.start()
        servers.append(server)
        return f"{host}:{port}"

    group = AgentGroup([RankConfig("127.0.0.1", 0), RankConfig("127.0.0.2", 1)], rank_size=2, stage_size=1)
    worker = serve(
        service.DistributedWorkerServicer(group, ModelSpec.__new__(ModelSpec), "{}"),
        dpb_grpc.add_DistributedWorkerServicer_to_server,
        "127.0.0.1",
    )
    channel = protocol.channel(worker)
    channels.append(channel)
    stub = dpb_grpc.DistributedWorkerStub(channel)

    def rank(rank_id, call_token=None):
        graph, exits = _Graph(), []
        call_token = call_token or protocol.new_token()
        address = serve(
            rank_agent.RankAgentServicer(graph, rank_id, lambda: exits.append(True), call_token),
            dpb_grpc.add_RankAgentServicer_to_server,
            "127.0.0.2",
        )
        reply = stub.RegisterAgent(
            dpb.RegisterAgentRequest(
                protocol_version=protocol.DISTRIBUTED_PROTOCOL_VERSION,
                rank_id=rank_id,
                address=address,
                inputs=INFOS,
                outputs=INFOS,
                call_token=call_token,
            ),
            timeout=10,
        )
        return address, graph, exits, reply

    yield group, stub, rank
    for channel in channels + [agent.channel for agent in group.agents.values()]:
        channel.close()
    for server in servers:
        server.stop(0)


def _refused(call, request):
    with pytest.raises(grpc.RpcError) as refused:
        call(request, timeout=10)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    return refused.value.details()


def test_each_rank_gets_its_own_notice_token_and_a_second_registration_is_refused_naming_the_rank(cluster, said):
    group, _, rank = cluster
    first = rank(0)[3]
    address, _, _, again = rank(0)
    assert again.error.error_code and not again.notice_token
    assert again.error.error_msg.decode() == (
        f"rank 0 is already registered, with address {group.agents[0].address}; a second registration of it is refused"
    )
    assert group.agents[0].address != address and group.notice_sender(first.notice_token) == 0
    assert [line for line in said if line.startswith("rank 0 registered again") and address in line]
    second = rank(1)[3]
    assert not first.error.error_code and len(first.notice_token) == 64 and first.notice_token != second.notice_token
    assert group.all_registered.is_set() and not group.failed.is_set()


def test_exit_notices_need_a_registered_rank_s_token(cluster, said):
    group, stub, rank = cluster
    registered = rank(0)[3]
    foreign = protocol.new_token()
    for token in ("", foreign):
        details = _refused(stub.AgentExit, dpb.AgentNotice(agent_ip="127.0.0.1", reason="forged", notice_token=token))
        assert "notice token" in details and foreign not in details
    assert not group.failed.is_set()
    assert len(said) == 2 and all("refused" in line and "from ipv4:127.0.0.1:" in line for line in said)
    stub.AgentExit(
        dpb.AgentNotice(agent_ip="127.0.0.1", reason="rank 0 lost", notice_token=registered.notice_token), timeout=10
    )
    assert group.failed.is_set() and group.failure == "agents on 127.0.0.1 exited: rank 0 lost"


def test_a_tokenless_failure_is_refused_from_a_host_outside_the_table_or_once_every_rank_registered(cluster):
    group, stub, rank = cluster
    details = _refused(stub.AgentFailed, dpb.AgentNotice(agent_ip="10.0.0.9", reason="forged"))
    assert "'10.0.0.9' is no host of the rank table" in details
    rank(0), rank(1)
    assert group.all_registered.is_set()
    assert "no notice token" in _refused(stub.AgentFailed, dpb.AgentNotice(agent_ip="127.0.0.2", reason="forged"))
    assert not group.failed.is_set()


def test_a_tokenless_failure_from_a_host_of_the_table_ends_the_start_while_ranks_register(cluster):
    group, stub, rank = cluster
    rank(0)
    stub.AgentFailed(dpb.AgentNotice(agent_ip="127.0.0.2", reason="rank 1 cannot load"), timeout=10)
    assert group.failed.is_set() and group.failure == "agents on 127.0.0.2 failed to start: rank 1 cannot load"


def test_ranks_take_calls_only_with_their_call_token_and_the_group_keeps_serving(cluster, said):
    group, stub, rank = cluster
    (address, graph, exits, _), (_, other, _, _) = rank(0), rank(1)
    with protocol.channel(address) as channel:
        agent = dpb_grpc.RankAgentStub(channel)
        for token in ("", protocol.new_token()):
            _refused(agent.Predict, dpb.RankPredictRequest(request_id="forged", call_token=token))
            _refused(agent.Exit, dpb.ExitRequest(reason="forged", call_token=token))
    assert graph.calls == 0 and exits == []
    assert sum("rank 0: a Predict call from ipv4:" in line for line in said) == 2
    _refused(stub.AgentExit, dpb.AgentNotice(agent_ip="127.0.0.1", reason="forged"))
    np.testing.assert_array_equal(group.predict([np.array([1, 2], np.float32)])[0], [2, 3])
    assert graph.calls == other.calls == 1
    group.close("done")
    assert exits == [True]
