"""The public gRPC replies of the front ends, read back the way the client reads them."""

import numpy as np
import pytest

from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import instance_to_proto, reply_to_results, tensor_to_value
from mindspore_serving.frontends.replies import error_reply, global_error, predict_reply, stream_reply
from mindspore_serving.proto import ms_service_pb2 as pb


def spec_of(version=0, name="add", method="m"):
    return pb.ServableSpec(name=name, method_name=method, version_number=version)


def ok_instance(value):
    return instance_to_proto({"y": np.array([value], np.float32)})


def test_predict_reply_without_errors_has_instances_only():
    spec = spec_of(version=2)
    reply = predict_reply(spec, [ok_instance(1), ok_instance(2)])
    assert reply.servable_spec == spec
    assert len(reply.error_msg) == 0
    assert [float(tensor_to_value(i.items["y"])[0]) for i in reply.instances] == [1.0, 2.0]
    assert [r["y"][0] for r in reply_to_results(reply)] == [1, 2]


def test_predict_reply_same_error_everywhere_is_a_global_error():
    error = errors.InvalidInputs("Given model input 0 size 4 not match the size 16 defined in model")
    reply = predict_reply(spec_of(), [error, errors.InvalidInputs(error.message), errors.InvalidInputs(error.message)])
    assert len(reply.instances) == 0
    assert [(e.error_code, e.error_msg.decode()) for e in reply.error_msg] == [(errors.INVALID_INPUTS, error.message)]
    assert isinstance(reply_to_results(reply), errors.InvalidInputs)


def test_predict_reply_single_failed_instance_is_a_global_error():
    assert len(predict_reply(spec_of(), [errors.Failed("x")]).instances) == 0


def test_predict_reply_empty_global_message_becomes_predict_failed():
    reply = predict_reply(spec_of(), [errors.Failed("")])
    assert [(e.error_code, e.error_msg.decode()) for e in reply.error_msg] == [(errors.FAILED, "Predict failed")]


@pytest.mark.parametrize(
    "results",
    [
        [errors.InvalidInputs("bad"), errors.InvalidInputs("other")],
        [errors.Failed("x"), errors.InvalidInputs("x")],  # same text, different codes
    ],
)
def test_predict_reply_different_errors_stay_per_instance(results):
    reply = predict_reply(spec_of(), results)
    assert len(reply.instances) == 2 and all(len(instance.items) == 0 for instance in reply.instances)
    assert [(e.error_code, e.error_msg.decode()) for e in reply.error_msg] == [(r.code, r.message) for r in results]
    assert [(r.code, r.message) for r in reply_to_results(reply)] == [(r.code, r.message) for r in results]


def test_predict_reply_mixed_results_are_per_instance():
    reply = predict_reply(
        spec_of(), [ok_instance(1), errors.InvalidInputs("bad"), ok_instance(3), errors.Failed("worse")]
    )
    assert len(reply.instances) == len(reply.error_msg) == 4
    assert [(e.error_code, e.error_msg.decode()) for e in reply.error_msg] == [
        (errors.OK, ""),
        (errors.INVALID_INPUTS, "bad"),
        (errors.OK, ""),
        (errors.FAILED, "worse"),
    ]
    assert len(reply.instances[1].items) == 0 and len(reply.instances[3].items) == 0
    results = reply_to_results(reply)
    assert float(results[0]["y"][0]) == 1.0 and float(results[2]["y"][0]) == 3.0
    assert (results[1].code, results[1].message) == (errors.INVALID_INPUTS, "bad")


def test_error_reply():
    reply = error_reply(spec_of(name="x"), errors.ServableUnavailable("gone"))
    assert reply.servable_spec.name == "x"
    assert len(reply.instances) == 0
    assert [(e.error_code, e.error_msg.decode()) for e in reply.error_msg] == [(errors.SERVABLE_UNAVAILABLE, "gone")]
    result = reply_to_results(reply)
    assert isinstance(result, errors.ServableUnavailable) and result.message == "gone"


def test_stream_reply_holds_one_instance():
    reply = stream_reply(spec_of(name="llm"), {"token_id": np.int32(7), "text": "a"})
    assert reply.servable_spec.name == "llm" and len(reply.error_msg) == 0
    (instance,) = reply.instances
    assert int(tensor_to_value(instance.items["token_id"])) == 7 and tensor_to_value(instance.items["text"]) == "a"


def test_global_error_rule():
    gone = errors.ServableUnavailable("gone")
    assert global_error(gone) is gone  # the request failed as a whole
    assert global_error([]) is None
    assert global_error([{"y": 1}, gone]) is None
    assert (global_error([(errors.INVALID_INPUTS, "p"), errors.InvalidInputs("p")]).message,) == ("p",)
    assert global_error([errors.Failed("p"), errors.InvalidInputs("p")]) is None
