"""The master's heartbeat: a worker that stops answering pings is given up after its misses, once, and a worker
that answers (even with an error) or is removed is left alone."""

import asyncio

import grpc
import pytest

from mindspore_serving.master.heartbeat import HeartbeatSettings, WorkerHeartbeat
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.proto import internal_pb2


class _Unanswered(grpc.aio.AioRpcError):
    def __init__(self, code):
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="ping")


class FakeStub:
    def __init__(self):
        self.hung = False
        self.refuses = False
        self.pings = 0
        self.not_ready = ""

    async def Ping(self, request, timeout):  # pylint: disable=invalid-name
        self.pings += 1
        if self.hung:
            await asyncio.sleep(timeout)
            raise _Unanswered(grpc.StatusCode.DEADLINE_EXCEEDED)
        if self.refuses:
            raise _Unanswered(grpc.StatusCode.INTERNAL)
        return internal_pb2.PingReply(not_ready=self.not_ready)


def worker(registry, key):
    record = WorkerRecord(
        key=key,
        pid=len(registry.all()) + 1,
        address="unix:x",
        servable_name=key,
        version_number=1,
        batch_size=1,
        methods={},
        stub=FakeStub(),
    )
    registry.add(record)
    return record


@pytest.mark.parametrize("misses", [1, 3])
def test_a_hung_worker_is_given_up_once_after_its_misses_and_the_others_are_left_alone(misses):
    registry = WorkerRegistry()
    hung, fine, erring = worker(registry, "hung"), worker(registry, "fine"), worker(registry, "erring")
    hung.stub.hung = True
    erring.stub.refuses = True
    given_up = []
    settings = HeartbeatSettings(interval=0.02, misses=misses)

    async def scenario():
        heartbeat = WorkerHeartbeat(registry, settings, lambda record, reason: given_up.append((record.key, reason)))
        heartbeat.start()
        while not given_up:
            await asyncio.sleep(0.01)
        pings = hung.stub.pings
        await asyncio.sleep(settings.interval * 5)  # and never again
        await heartbeat.stop()
        return pings

    pings = asyncio.run(scenario())
    assert [key for key, _ in given_up] == ["hung"]
    assert f"pid {hung.pid}) is not responding ({misses} heartbeats" in given_up[0][1]
    assert hung.lost_reason == given_up[0][1] and fine.lost_reason is None and erring.lost_reason is None
    assert hung.stub.pings <= pings + 1  # at most one started before it was given up, none after


def test_each_answer_says_whether_the_worker_can_serve_now():
    registry = WorkerRegistry()
    llm = worker(registry, "llm")
    settings = HeartbeatSettings(interval=0.01, misses=3)

    async def until_pinged(pings):
        while llm.stub.pings < pings:
            await asyncio.sleep(0.005)

    async def scenario():
        heartbeat = WorkerHeartbeat(registry, settings, lambda record, reason: None)
        heartbeat.start()
        llm.stub.not_ready = "the agents of llm are restarting"
        await until_pinged(2)
        restarting = llm.not_ready
        llm.stub.not_ready = ""
        await until_pinged(llm.stub.pings + 2)
        await heartbeat.stop()
        return restarting

    assert asyncio.run(scenario()) == "the agents of llm are restarting"
    assert llm.not_ready == ""
