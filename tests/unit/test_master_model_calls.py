"""The master's side of extra workers: their model infos and model calls go to a worker owning the models."""

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from mindspore_serving.master.control_service import MasterControlServicer
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.proto import internal_pb2

SECRET = "s" * 64
CALLER = "add/v1/extra0"
CONTEXT = SimpleNamespace(
    time_remaining=lambda: None,
    invocation_metadata=lambda: (("ms-serving-peer", CALLER), ("ms-serving-secret", SECRET)),
)
PROCESSES = SimpleNamespace(secret_of=lambda key: SECRET if key == CALLER else "")


class FakeStub:
    def __init__(self, name, fail=False):
        self.name, self.fail, self.calls = name, fail, []

    async def CallModel(self, request, timeout=None):
        self.calls.append(request)
        if self.fail:
            raise grpc.aio.UsageError("channel closed")
        reply = internal_pb2.CallModelReply()
        reply.instances.add().items["0"].bytes_val.append(self.name.encode())
        reply.error_msg.add()
        return reply


def record(key, owns_device=True, version=1, extra_index=None, fail=False, outstanding=0):
    info = internal_pb2.ModelInfo(batch_size=4)
    return WorkerRecord(
        key=key,
        pid=1,
        address="unix:x",
        servable_name="add",
        version_number=version,
        batch_size=4,
        methods={},
        extra_index=extra_index,
        owns_device=owns_device,
        outstanding=outstanding,
        model_infos={"net": info} if owns_device else {},
        stub=FakeStub(key, fail),
    )


def servicer_of(*records):
    registry = WorkerRegistry()
    for item in records:
        registry.add(item)
    return MasterControlServicer(registry, processes=PROCESSES)


def call(servicer, version=1):
    request = internal_pb2.CallModelRequest(servable_name="add", version_number=version, model_key="net")
    return asyncio.run(servicer.CallModel(request, CONTEXT))


def test_model_calls_go_to_the_least_busy_worker_owning_the_models_of_that_version():
    extra = record("add/v1/extra0", owns_device=False, extra_index=0)
    servicer = servicer_of(
        record("add/v1/device0", outstanding=5), record("add/v1/device1"), extra, record("add/v2/device0", version=2)
    )
    reply = call(servicer)
    assert reply.instances[0].items["0"].bytes_val[0] == b"add/v1/device1"
    assert not extra.stub.calls
    assert extra.device_label == "extra0"


def test_a_model_call_without_an_owner_or_whose_owner_is_gone_fails_as_a_whole():
    reply = call(servicer_of(record("add/v1/extra0", owns_device=False, extra_index=0)))
    assert len(reply.error_msg) == 1 and not reply.instances and reply.error_msg[0].error_code == 4
    assert "no worker of servable add version 1 runs model net now" in reply.error_msg[0].error_msg.decode()
    reply = call(servicer_of(record("add/v1/device0", fail=True)))
    assert "did not answer: channel closed" in reply.error_msg[0].error_msg.decode()


def test_model_infos_come_from_a_worker_owning_the_models():
    servicer = servicer_of(record("add/v1/extra0", owns_device=False, extra_index=0), record("add/v1/device0"))
    reply = asyncio.run(
        servicer.GetModelInfo(internal_pb2.GetModelInfoRequest(servable_name="add", version_number=1), CONTEXT)
    )
    assert reply.model_infos["net"].batch_size == 4 and not reply.error.error_code
    reply = asyncio.run(
        servicer.GetModelInfo(internal_pb2.GetModelInfoRequest(servable_name="add", version_number=2), CONTEXT)
    )
    assert reply.error.error_msg.decode() == (
        "Servable 'add' has models declared by declare_model, but parameter 'device_ids' of ServableStartConfig is "
        "not set in Serving startup script when the device target is not CPU"
    )


class Refusing:
    def __init__(self, metadata):
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata

    async def abort(self, code, details):
        raise RuntimeError((code, details))


@pytest.mark.parametrize(
    "metadata",
    [
        (),  # no credentials at all
        (("ms-serving-peer", CALLER), ("ms-serving-secret", "t" * 64)),  # a wrong secret
        (("ms-serving-peer", "add/v9/device0"), ("ms-serving-secret", SECRET)),  # a key the master did not start
    ],
)
def test_calls_from_anyone_but_a_started_worker_are_refused_and_change_nothing(metadata):
    owner = record("add/v1/device0")
    servicer = servicer_of(owner)
    requests = [
        (
            "Register",
            internal_pb2.RegisterRequest(worker_key="add/v1/device0", address="unix:evil", protocol_version=1),
        ),
        ("Exit", internal_pb2.ExitRequest(worker_key="add/v1/device0", worker_pid=1)),
        ("NotifyFailed", internal_pb2.NotifyFailedRequest(worker_key="add/v1/device0")),
        ("CallModel", internal_pb2.CallModelRequest(servable_name="add", version_number=1, model_key="net")),
        ("GetModelInfo", internal_pb2.GetModelInfoRequest(servable_name="add", version_number=1)),
    ]
    for name, request in requests:
        with pytest.raises(RuntimeError) as info:
            asyncio.run(getattr(servicer, name)(request, Refusing(metadata)))
        assert info.value.args[0] == (grpc.StatusCode.PERMISSION_DENIED, "not a worker this master started")
    assert servicer.registry.get("add/v1/device0") is owner and not owner.stub.calls


def test_a_worker_may_not_speak_for_another():
    servicer = servicer_of(record("add/v1/device0"))
    with pytest.raises(RuntimeError):  # the extra worker's own secret, but the device worker's key
        asyncio.run(
            servicer.Exit(
                internal_pb2.ExitRequest(worker_key="add/v1/device0"), Refusing(CONTEXT.invocation_metadata())
            )
        )
