"""MS_SERVING_DISTRIBUTED_SECRET: the distributed worker's and rank agents' services (real gRPC here) refuse calls
without it with PERMISSION_DENIED; channels made by `protocol.channel` send it."""
from concurrent import futures

import grpc
import pytest

from mindspore_serving.ipc import distributed as protocol
from mindspore_serving.proto import distributed_pb2 as dpb
from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc


class _Worker(dpb_grpc.DistributedWorkerServicer):
    def __init__(self):
        self.notices = []

    def AgentExit(self, request, context):
        self.notices.append(request.reason)
        return dpb.Reply()


@pytest.fixture
def served(monkeypatch):
    def serve(secret):
        if secret is None:
            monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
        else:
            monkeypatch.setenv(protocol.SECRET_ENV, secret)
        server = protocol.server(futures.ThreadPoolExecutor(max_workers=2))
        worker = _Worker()
        dpb_grpc.add_DistributedWorkerServicer_to_server(worker, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", worker

    servers = []
    yield serve
    for server in servers:
        server.stop(0)


def _exit(channel, reason="rank 1 lost"):
    return dpb_grpc.DistributedWorkerStub(channel).AgentExit(dpb.AgentNotice(agent_ip="127.0.0.1", reason=reason),
                                                             timeout=10)


def test_calls_without_the_secret_are_refused_and_change_nothing(served, monkeypatch):
    address, worker = served("shared-secret")
    for metadata in ((), ((protocol.SECRET_METADATA, "wrong"),)):
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                dpb_grpc.DistributedWorkerStub(channel).AgentExit(dpb.AgentNotice(reason="forged"), timeout=10,
                                                                  metadata=metadata)
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert protocol.SECRET_ENV in refused.value.details()
    monkeypatch.setenv(protocol.SECRET_ENV, "another")
    with protocol.channel(address) as channel, pytest.raises(grpc.RpcError):
        _exit(channel, "forged")
    assert worker.notices == []
    monkeypatch.setenv(protocol.SECRET_ENV, "shared-secret")
    with protocol.channel(address) as channel:
        _exit(channel)
    assert worker.notices == ["rank 1 lost"]


def test_without_a_secret_the_services_are_open(served):
    address, worker = served(None)
    with protocol.channel(address) as channel:
        _exit(channel)
    assert worker.notices == ["rank 1 lost"]
