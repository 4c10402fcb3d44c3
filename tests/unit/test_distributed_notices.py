"""The distributed worker stops its group on an AgentExit or AgentFailed notice only when it names a host of the
rank table; any other is refused with PERMISSION_DENIED and changes nothing."""
import grpc
import pytest

from mindspore_serving.proto import distributed_pb2 as dpb
from mindspore_serving.spec.servable import ModelSpec
from mindspore_serving.worker.distributed.agent_group import AgentGroup
from mindspore_serving.worker.distributed.rank_table import RankConfig
from mindspore_serving.worker.distributed.service import DistributedWorkerServicer


class _Aborted(Exception):
    pass


class _Context:
    def peer(self):
        return "ipv4:127.0.0.1:50000"

    def abort(self, code, details):
        self.code, self.details = code, details
        raise _Aborted


@pytest.fixture
def servicer():
    group = AgentGroup([RankConfig("10.0.0.1", 0), RankConfig("10.0.0.2", 1)], rank_size=2, stage_size=1)
    return DistributedWorkerServicer(group, ModelSpec.__new__(ModelSpec), "{}")


@pytest.mark.parametrize("call", ["AgentExit", "AgentFailed"])
def test_a_notice_naming_no_host_of_the_table_is_refused(servicer, call):
    context = _Context()
    with pytest.raises(_Aborted):
        getattr(servicer, call)(dpb.AgentNotice(agent_ip="10.0.0.9", reason="forged"), context)
    assert context.code is grpc.StatusCode.PERMISSION_DENIED and "10.0.0.9" in context.details
    assert not servicer.group.failed.is_set()


def test_a_host_of_the_table_stops_the_group(servicer):
    servicer.AgentExit(dpb.AgentNotice(agent_ip="10.0.0.2", reason="rank 1 died"), _Context())
    assert servicer.group.failed.is_set() and "rank 1 died" in servicer.group.failure
