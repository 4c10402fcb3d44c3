"""WorkerServicer.Predict with a fake runtime: one call may carry several public requests (request_sizes)."""
import numpy as np

from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import instance_to_proto, tensor_to_value
from mindspore_serving.proto import internal_pb2
from mindspore_serving.worker.method_runner import InstanceError
from mindspore_serving.worker.service import WorkerServicer


class FakeRuntime:
    """y = x * 10; a negative x fails its instance; records the instances of each predict call."""

    def __init__(self, fail_with=None):
        self.calls = []
        self.fail_with = fail_with

    def predict(self, method_name, instances):
        self.calls.append((method_name, [int(instance["x"][0]) for instance in instances]))
        if self.fail_with is not None:
            raise self.fail_with
        return [InstanceError(f"negative input {int(i['x'][0])}") if i["x"][0] < 0 else {"y": i["x"] * 10}
                for i in instances]


def request_of(groups, bad=()):
    """A WorkerPredictRequest carrying one group of x values per public request; x in `bad` uses shm_data."""
    request = internal_pb2.WorkerPredictRequest(request_id="7")
    request.request.servable_spec.name = "svc"
    request.request.servable_spec.method_name = "m"
    for xs in groups:
        for x in xs:
            instance = instance_to_proto({"x": np.array([x], np.int32)}, request.request.instances.add())
            if x in bad:
                instance.items["x"].shm_data.data_size = 4
        request.request_sizes.append(len(xs))
    return request


def answers_of(reply):
    out = []
    for instance, error in zip(reply.instances, reply.error_msg):
        if error.error_code:
            out.append((error.error_code, error.error_msg.decode()))
        else:
            out.append(int(tensor_to_value(instance.items["y"])[0]))
    return out


def test_all_requests_of_a_call_run_together_in_order():
    runtime = FakeRuntime()
    reply = WorkerServicer(runtime, lambda reason: None).Predict(request_of([[1], [2, -3], [4]]), None)
    assert runtime.calls == [("m", [1, 2, -3, 4])]
    assert reply.request_id == "7"
    assert answers_of(reply) == [10, 20, (errors.INVALID_INPUTS, "negative input -3"), 40]


def test_an_instance_that_cannot_be_decoded_fails_only_its_own_request():
    runtime = FakeRuntime()
    reply = WorkerServicer(runtime, lambda reason: None).Predict(request_of([[1], [2, 99], [4]], bad=(99,)), None)
    assert runtime.calls == [("m", [1, 4])]
    text = "Tensor with shared memory data is not supported"
    assert answers_of(reply) == [10, (errors.INVALID_INPUTS, text), (errors.INVALID_INPUTS, text), 40]


def test_without_request_sizes_the_call_is_one_request():
    runtime = FakeRuntime()
    request = request_of([[1, 99, 3]], bad=(99,))
    del request.request_sizes[:]
    reply = WorkerServicer(runtime, lambda reason: None).Predict(request, None)
    assert runtime.calls == []
    text = "Tensor with shared memory data is not supported"
    assert answers_of(reply) == [(errors.INVALID_INPUTS, text)] * 3


def test_a_method_that_cannot_start_fails_every_instance():
    runtime = FakeRuntime(fail_with=KeyError("m"))
    reply = WorkerServicer(runtime, lambda reason: None).Predict(request_of([[1], [2]]), None)
    assert answers_of(reply) == [(errors.INVALID_INPUTS, "'m'")] * 2
