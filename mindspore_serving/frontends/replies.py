"""The public replies of the master's front ends, and the rule for when a reply carries one error.

gRPC `PredictReply` messages are built here, for Predict and PredictStream; the RESTful front end encodes
its JSON body in restful_codec with the same `global_error` rule, so both protocols fail a request alike.
Results are what the dispatcher answers: per instance an `Instance` message (passed through undecoded) or
a ServingError.
"""

from collections.abc import Sequence

from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import error_msg, instance_to_proto, is_error
from mindspore_serving.frontends.errors import grpc_error
from mindspore_serving.proto import ms_service_pb2


def global_error(results) -> errors.ServingError | None:
    """The single error a reply carries instead of instances: `results` itself when it is one error, or the
    common error when every instance failed with the same code and text; None otherwise."""
    if not isinstance(results, (list, tuple)):
        return errors.as_serving_error(results)
    if not results or not all(is_error(result) for result in results):
        return None
    first = errors.as_serving_error(results[0])
    for result in results[1:]:
        error = errors.as_serving_error(result)
        if (error.code, error.message) != (first.code, first.message):
            return None
    return first


def predict_reply(spec, results: Sequence) -> "ms_service_pb2.PredictReply":
    """The reply to Predict from per-instance Instance messages or ServingErrors.

    - no failures: instances only, no error_msg;
    - every instance failed with the same code and text: exactly one error_msg and no instances (an empty
      text becomes "Predict failed");
    - otherwise one ErrorMsg per instance (code OK for successes) and one Instance per instance (empty for
      failures)."""
    reply = ms_service_pb2.PredictReply()
    reply.servable_spec.CopyFrom(spec)
    failed = [result for result in results if isinstance(result, errors.ServingError)]
    single = global_error(failed) if len(failed) == len(results) else None
    if single is not None:
        reply.error_msg.append(error_msg(single, "Predict failed"))
        return reply
    for result in results:
        if isinstance(result, errors.ServingError):
            reply.instances.add()
            reply.error_msg.append(error_msg(result))
        else:
            reply.instances.append(result)
            if failed:
                reply.error_msg.add(error_code=errors.OK)
    return reply


def error_reply(spec, error: BaseException) -> "ms_service_pb2.PredictReply":
    """A reply that fails the whole request (Predict) or ends a stream (PredictStream) with `error`'s ErrorMsg
    (frontends/errors.py maps it)."""
    reply = ms_service_pb2.PredictReply()
    reply.servable_spec.CopyFrom(spec)
    reply.error_msg.append(grpc_error(error)[1])
    return reply


def stream_reply(spec, values: dict) -> "ms_service_pb2.PredictReply":
    """One PredictStream reply: a single instance holding `values`."""
    reply = ms_service_pb2.PredictReply()
    reply.servable_spec.CopyFrom(spec)
    instance_to_proto(values, reply.instances.add())
    return reply
