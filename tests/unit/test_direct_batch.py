"""Model-only methods run straight from the request's bytes (worker/direct_batch.py): the same answers as the
general path (MethodRunner), full batches padded as merge_inputs pads, and the general path whenever an instance
does not feed the model exactly or the graph fails. A fake graph stands in for MindSpore."""

import numpy as np
import pytest
from stage_fakes import FakeLoadedModel, function_spec, method, model_spec, ref

from mindspore_serving.common.tensor_codec import instance_to_proto, tensor_to_value
from mindspore_serving.proto import internal_pb2
from mindspore_serving.worker.direct_batch import DirectBatch
from mindspore_serving.worker.executors import ModelExecutor
from mindspore_serving.worker.method_runner import MethodRunner, ModelStage
from mindspore_serving.worker.model_backend import TensorInfo
from mindspore_serving.worker.service import WorkerServicer

INFOS = [TensorInfo((2,), np.dtype(np.float32)), TensorInfo((), np.dtype(np.int32))]


def double_and_total(x, k):
    return x * 2, x.sum(axis=1) + k


def model_method():
    """m(a, b) -> (total, double): the model's inputs in the other order, its outputs swapped."""
    return method(
        "m",
        ["b", "a"],
        ["total", "double"],
        [model_spec("fake.mindir", ref(0, 1), ref(0, 0), outputs_count=2)],
        [ref(1, 1), ref(1, 0)],
    )


class Runtime:
    """What WorkerServicer needs: the general path (MethodRunner) and the direct one over the same executor."""

    def __init__(self, batch_size=4, function=double_and_total, with_batch_dim=True):
        self.model = FakeLoadedModel(batch_size, INFOS, function)
        self.model.spec.with_batch_dim = with_batch_dim
        self.executor = ModelExecutor(self.model, 0, max_wait=5.0)
        spec = model_method()
        self.runner = MethodRunner("svc", spec, [ModelStage(self.executor)])
        self.direct = DirectBatch.of(self.runner)
        assert self.direct is not None
        self.general_calls = 0

    def predict(self, method_name, instances):
        self.general_calls += 1
        return self.runner.run(instances)

    def predict_direct(self, method_name, instances_pb):
        return self.direct.run(instances_pb)

    def close(self):
        self.executor.close()


def request_of(instances):
    request = internal_pb2.WorkerPredictRequest(request_id="1")
    request.request.servable_spec.method_name = "m"
    for instance in instances:
        instance_to_proto(instance, request.request.instances.add())
    request.request_sizes.extend([1] * len(instances))
    return request


def answers_of(reply):
    return [
        error.error_msg.decode()
        if error.error_code
        else {name: tensor_to_value(tensor).tolist() for name, tensor in instance.items.items()}
        for instance, error in zip(reply.instances, reply.error_msg)
    ]


def instances(count):
    return [{"a": np.array([i, i + 1], np.float32), "b": np.array(10 * i, np.int32)} for i in range(count)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [1, 4, 6])
def test_the_direct_path_answers_as_the_general_path_in_full_padded_batches(count):
    direct, general = Runtime(), Runtime()
    try:
        direct_reply = WorkerServicer(direct, None).Predict(request_of(instances(count)), None)
        general.predict_direct = lambda *_: None
        general_reply = WorkerServicer(general, None).Predict(request_of(instances(count)), None)
    finally:
        direct.close()
        general.close()
    assert direct.general_calls == 0 and general.general_calls == 1
    assert (
        answers_of(direct_reply)
        == answers_of(general_reply)
        == [{"total": 2 * i + 1 + 10 * i, "double": [2 * i, 2 * i + 2]} for i in range(count)]  # [batch] -> []
    )
    batches = direct.model.subgraphs[0].calls
    assert [len(call[0]) for call in batches] == [4] * len(batches) and len(batches) == (count + 3) // 4
    padded = batches[-1][0]
    last = (count - 1) // 4 * 4  # the first instance of the last batch pads it
    pads = 4 - (count - last)
    if pads:
        np.testing.assert_array_equal(padded[count - last :], [[last, last + 1]] * pads)
    assert padded.dtype == np.float32 and batches[0][1].dtype == np.int32 and batches[0][1].shape == (4,)


@pytest.mark.timeout(60)
def test_an_instance_that_does_not_feed_the_model_exactly_sends_the_call_the_general_way():
    runtime = Runtime()
    wrong_dtype = {"a": np.array([1, 2], np.float64), "b": np.array(0, np.int32)}
    missing = {"a": np.array([1, 2], np.float32)}
    try:
        for bad in (wrong_dtype, missing):
            reply = WorkerServicer(runtime, None).Predict(request_of(instances(1) + [bad]), None)
            answers = answers_of(reply)
            assert answers[0] == {"total": 1, "double": [0, 2]} and isinstance(answers[1], str)
        assert runtime.general_calls == 2
        assert (
            "input 0 size 16 not match the size 8"
            in answers_of(WorkerServicer(runtime, None).Predict(request_of([wrong_dtype]), None))[0]
        )
    finally:
        runtime.close()


@pytest.mark.timeout(60)
def test_a_failing_graph_is_answered_by_the_general_path_with_its_error_text():
    def broken(x, k):
        raise RuntimeError("graph broke")

    runtime = Runtime(function=broken)
    try:
        answers = answers_of(WorkerServicer(runtime, None).Predict(request_of(instances(2)), None))
    finally:
        runtime.close()
    assert runtime.general_calls == 1
    assert (
        answers
        == [
            "Call Model 'fake.mindir' Failed, method: 'm', stage index(begin with 1): 1, error msg: "
            "model predict failed: graph broke"
        ]
        * 2
    )


@pytest.mark.timeout(60)
def test_a_model_without_a_batch_dimension_runs_once_per_instance_and_answers_as_the_general_path():
    def each(x, k):
        return x * 2, x.sum() + k

    direct, general = Runtime(1, each, with_batch_dim=False), Runtime(1, each, with_batch_dim=False)
    try:
        direct_reply = WorkerServicer(direct, None).Predict(request_of(instances(3)), None)
        general.predict_direct = lambda *_: None
        general_reply = WorkerServicer(general, None).Predict(request_of(instances(3)), None)
    finally:
        direct.close()
        general.close()
    assert direct.general_calls == 0 and len(direct.model.subgraphs[0].calls) == 3
    assert (
        answers_of(direct_reply)
        == answers_of(general_reply)
        == [{"total": 2 * i + 1 + 10 * i, "double": [2 * i, 2 * i + 2]} for i in range(3)]
    )


def test_only_a_method_of_one_model_stage_on_cpu_goes_direct():
    model = FakeLoadedModel(4, INFOS, double_and_total)
    executor = ModelExecutor(model, 0, max_wait=5.0)
    try:
        assert DirectBatch.applies(model_method(), executor)
        assert not DirectBatch.applies(model_method(), None)
        with_python = method(
            "p",
            ["a", "b"],
            ["y"],
            [function_spec(np.negative, ref(0)), model_spec("fake.mindir", ref(1), ref(0, 1))],
            [ref(2)],
        )
        assert not DirectBatch.applies(with_python, executor)
        model.device_target = "Ascend"
        assert not DirectBatch.applies(model_method(), executor)
    finally:
        executor.close()
