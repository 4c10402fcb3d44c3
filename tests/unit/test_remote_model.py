"""An extra worker's runtime against an owner's runtime in one process: the model calls go through CallModel
messages and shared memory (no master, no MindSpore: the owner's model is numpy)."""

import functools
import os

import numpy as np
import pytest

from mindspore_serving.ipc import shm_tensors
from mindspore_serving.proto import internal_pb2
from mindspore_serving.spec.servable import (
    STAGE_FUNCTION,
    STAGE_MODEL,
    MethodSpec,
    ModelSpec,
    ServableSpec,
    StageSpec,
    TensorRef,
)
from mindspore_serving.worker.method_runner import InstanceError
from mindspore_serving.worker.model_backend import LoadedModel, TensorInfo
from mindspore_serving.worker.remote_model import RemoteModelExecutor, model_infos, remote_models, serve_model_call
from mindspore_serving.worker.servable_runtime import ServableRuntime

MASTER_PID = os.getpid()  # a running "master": no master starting meanwhile takes its blocks for orphans
BATCH = 4


class NumpyGraph:
    """y = 2 x on [BATCH, 3] float32; records the batches it ran."""

    def __init__(self):
        self.path = "numpy"
        self.inputs = [TensorInfo((BATCH, 3), np.dtype(np.float32))]
        self.outputs = [TensorInfo((BATCH, 3), np.dtype(np.float32))]
        self.batches = []

    def run(self, inputs):
        self.batches.append(inputs[0].copy())
        return [inputs[0] * 2]


class NumpyModel(LoadedModel):
    def __init__(self, spec):  # pylint: disable=super-init-not-called
        self.spec = spec
        self.subgraphs = [NumpyGraph()]
        self.batch_size = BATCH
        self.device_target = "CPU"


def add_one(x):
    if x[0] < 0:
        raise ValueError("negative input")
    return x + 1


def make_spec():
    spec = ServableSpec(name="demo")
    spec.models["net"] = ModelSpec("net", ("net.mindir",), "MindIR", with_batch_dim=True, io_counts={0: (1, 1)})
    spec.methods["double"] = MethodSpec(
        name="double",
        input_names=["x"],
        output_names=["y"],
        stages=[
            StageSpec(STAGE_FUNCTION, "add_one", [TensorRef(0, 0)], 1, function=add_one),
            StageSpec(STAGE_MODEL, "net", [TensorRef(1, 0)], 1, model_key="net"),
        ],
        outputs=[TensorRef(2, 0)],
    )
    return spec


@pytest.fixture
def runtimes():
    """(extra worker's runtime, owner's runtime, the CallModel requests sent)"""
    spec = make_spec()
    owner = ServableRuntime(spec, "", batch_wait=0.05, models={"net": NumpyModel(spec.models["net"])})
    reply = internal_pb2.GetModelInfoReply()
    for key, info in model_infos(owner.models).items():
        reply.model_infos[key].CopyFrom(info)
    requests = []

    def call(request):
        requests.append(request)
        assert request.instances[0].items["0"].WhichOneof("tensor_data") == "shm_data"
        return serve_model_call(owner, request)

    make_executor = functools.partial(
        RemoteModelExecutor, call=call, version_number=1, servable_name="demo", namer=shm_tensors.BlockNamer(MASTER_PID)
    )
    extra = ServableRuntime(spec, "", batch_wait=0.05, models=remote_models(spec, reply), make_executor=make_executor)
    yield extra, owner, requests
    extra.close()
    owner.close()
    assert not [name for name in os.listdir(shm_tensors.SHM_DIR) if name.startswith(f"mss_{MASTER_PID}_")]


def test_the_extra_worker_knows_the_model_from_its_infos(runtimes):
    extra, owner, _ = runtimes
    remote = extra.models["net"]
    assert remote.batch_size == BATCH and extra.batch_size == BATCH
    assert remote.instance_inputs(0) == owner.models["net"].instance_inputs(0) == [TensorInfo((3,), np.float32)]
    assert remote.instance_outputs(0) == [TensorInfo((3,), np.float32)]


def test_a_request_of_the_extra_worker_runs_its_stage_here_and_its_model_there_in_one_call(runtimes):
    extra, owner, requests = runtimes
    xs = [np.full(3, i, np.float32) for i in range(6)]
    results = extra.predict("double", [{"x": x} for x in xs])
    for x, result in zip(xs, results):
        np.testing.assert_array_equal(result["y"], (x + 1) * 2)
    assert len(requests) == 1 and len(requests[0].instances) == 6  # one call; the owner cuts its batches
    batches = owner.models["net"].subgraphs[0].batches
    assert [len(b) for b in batches] == [BATCH, BATCH]  # 4 + 2 (padded with instance 0, as the owner's own)


def test_instance_errors_stay_per_instance_through_the_call(runtimes):
    extra, _, _ = runtimes
    good, negative = np.ones(3, np.float32), -np.ones(3, np.float32)
    wrong_size = np.ones(4, np.float32)
    results = extra.predict("double", [{"x": good}, {"x": negative}, {"x": good}])
    assert isinstance(results[1], InstanceError) and "negative input" in str(results[1])
    np.testing.assert_array_equal(results[2]["y"], (good + 1) * 2)
    (result,) = extra.predict("double", [{"x": wrong_size}])
    assert "Given model input 0 size 16 not match the size 12 defined in model" in str(result)


def test_model_call_from_a_python_stage_goes_to_the_owner(runtimes):
    extra, _, requests = runtimes
    outputs = extra.model_call("net", 0, [(np.ones(3, np.float32),), (np.zeros(3, np.float32),)])
    assert [out[0].tolist() for out in outputs] == [[2, 2, 2], [0, 0, 0]]
    assert len(requests) == 1
    with pytest.raises(
        RuntimeError,
        match=r"Model\(net\).call\(\) failed: Given model input 0 data type "
        r"kMSI_Int32 not match the data type kMSI_Float32",
    ):
        extra.model_call("net", 0, [(np.ones(3, np.int32),)])


def test_a_call_that_fails_as_a_whole_fails_each_instance_with_its_reason():
    spec = make_spec()
    reply = internal_pb2.GetModelInfoReply()
    reply.model_infos["net"].CopyFrom(model_infos({"net": NumpyModel(spec.models["net"])})["net"])
    failures = iter([RuntimeError("the master is gone"), None])

    def call(request):
        failure = next(failures)
        if failure is not None:
            raise failure
        answer = internal_pb2.CallModelReply()
        answer.error_msg.add(error_code=4, error_msg=b"no worker of servable demo version 1 runs model net now")
        return answer

    executor = RemoteModelExecutor(remote_models(spec, reply)["net"], 0, 0.0, call, 1, "demo", None)
    try:
        with pytest.raises(RuntimeError, match="model predict failed: the master is gone"):
            executor.submit((np.ones(3, np.float32),)).result(10)
        with pytest.raises(RuntimeError, match="runs model net now"):
            executor.submit((np.ones(3, np.float32),)).result(10)
    finally:
        executor.close()


def test_model_infos_errors_of_the_master_reach_the_extra_worker():
    spec = make_spec()
    reply = internal_pb2.GetModelInfoReply()
    reply.error.error_code = 1
    reply.error.error_msg = b"Servable 'demo' has models declared by declare_model, but parameter 'device_ids'"
    with pytest.raises(RuntimeError, match="parameter 'device_ids'"):
        remote_models(spec, reply)
    with pytest.raises(RuntimeError, match=r"do not have models \['net'\]"):
        remote_models(spec, internal_pb2.GetModelInfoReply())


def test_the_owner_refuses_a_model_it_does_not_have(runtimes):
    _, owner, _ = runtimes
    request = internal_pb2.CallModelRequest(model_key="other")
    reply = serve_model_call(owner, request)
    assert len(reply.error_msg) == 1 and not reply.instances
    assert "model other subgraph 0 is not loaded by this worker" in reply.error_msg[0].error_msg.decode()
