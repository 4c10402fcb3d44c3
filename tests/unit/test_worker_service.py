"""WorkerServicer.Predict with a fake runtime: one call may carry several public requests (request_sizes)."""

import io

import numpy as np
import pytest

from mindspore_serving import log
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
        return [
            InstanceError(f"negative input {int(i['x'][0])}") if i["x"][0] < 0 else {"y": i["x"] * 10}
            for i in instances
        ]


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


# ---------------------------------------------------------------- log lines name the client's request id


def request_with_ids(groups, ids, bad=()):
    request = request_of(groups, bad)
    request.client_request_ids.extend(ids)
    return request


@pytest.fixture
def lines(monkeypatch):
    """(level, message, the request id the line ends with, exc_info) of each line the worker logs."""
    said = []
    for level in ("info", "error", "exception"):
        monkeypatch.setattr(
            log,
            level,
            lambda message, level=level, exc_info=None: said.append(
                (level, message, log.current_request_id(), exc_info)
            ),
        )
    monkeypatch.setattr(log, "info_enabled", lambda: True)
    return said


class StageFailure(FakeRuntime):
    """A stage raised for a negative x: the InstanceError has the exception as its cause, as MethodRunner's."""

    def predict(self, method_name, instances):
        results = []
        for instance in instances:
            x = int(instance["x"][0])
            if x >= 0:
                results.append({"y": instance["x"] * 10})
                continue
            try:
                raise ValueError(f"negative {x} in {io.BytesIO()!r}")
            except ValueError as err:
                error = InstanceError(f"Call pre Failed, error msg: negative {x}")
                error.__cause__ = err
                results.append(error)
        return results


def test_a_stage_error_is_logged_once_per_request_with_its_id_and_traceback(lines):
    request = request_with_ids([[1], [-2, 3, -4], [-5]], ["req-a", "req-b", ""])
    reply = WorkerServicer(StageFailure(), lambda reason: None).Predict(request, None)
    assert answers_of(reply)[:3] == [10, (errors.INVALID_INPUTS, "Call pre Failed, error msg: negative -2"), 30]
    failed = [line for line in lines if line[0] == "error"]
    assert [(message, request_id) for _, message, request_id, _ in failed] == [
        (
            "method m, instance 0 failed: Call pre Failed, error msg: negative -2 (1 more of its instances failed)",
            "req-b",
        ),
        ("method m, instance 0 failed: Call pre Failed, error msg: negative -5", "7"),
    ]  # no id: the call's
    cause = failed[0][3]
    assert isinstance(cause, ValueError) and "object at 0x" in str(cause) and cause.__traceback__ is not None
    handled = [request_id for level, message, request_id, _ in lines if level == "info"]
    assert handled == ["req-a", "req-b", "7"]  # the time line, once per public request


def test_instances_that_cannot_be_decoded_are_logged_with_their_request_id(lines):
    request = request_with_ids([[1], [2, 99]], ["req-a", "req-b"], bad=(99,))
    WorkerServicer(FakeRuntime(), lambda reason: None).Predict(request, None)
    assert [(level, request_id) for level, _, request_id, _ in lines if level != "info"] == [("exception", "req-b")]


def test_a_method_that_cannot_start_is_logged_with_every_request_id(lines):
    request = request_with_ids([[1], [2]], ["req-a", "req-b"])
    WorkerServicer(FakeRuntime(fail_with=KeyError("m")), lambda reason: None).Predict(request, None)
    assert [message for level, message, _, _ in lines if level == "exception"] == [
        "method m failed for every request of call 7 (requests req-a, req-b)"
    ]


def test_no_line_for_a_successful_call_when_info_is_not_written(lines, monkeypatch):
    monkeypatch.setattr(log, "info_enabled", lambda: False)
    WorkerServicer(FakeRuntime(), lambda reason: None).Predict(request_with_ids([[1], [2]], ["a", "b"]), None)
    assert lines == []
