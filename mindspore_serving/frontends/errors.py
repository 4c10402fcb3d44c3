"""The one place where an exception becomes a front end's answer: one function per transport.

The exception's class (`common/errors.py`) carries its kind and its MindSpore Serving code; these functions
turn them into what each wire expects:

    grpc_error(error)            gRPC status code, and the MindSpore ErrorMsg of the reply
    http_error(protocol, error)  HTTP status and JSON body in the protocol's own shape

The same HTTP body is used for a reply before a stream starts (with the status) and for an error event in
the middle of a stream (the status is already 200 there).

    kind         TGI / LLM-serving           OpenAI (type, code)                            gRPC
    validation   422 validation              400 invalid_request_error                      OK + ErrorMsg
    overloaded   429 overloaded              429 requests, rate_limit_exceeded              RESOURCE_EXHAUSTED
    not_found    404 not_found               404 invalid_request_error, model_not_found     OK + ErrorMsg
    unavailable  503 unavailable             503 server_error, service_unavailable          OK + ErrorMsg
                                                                                   (ServerStopping: UNAVAILABLE)
    generation   424 generation              500 server_error                               OK + ErrorMsg
    incomplete   500 incomplete_generation   500 server_error, incomplete_generation        OK + ErrorMsg
    internal     500 internal                500 server_error                               OK + ErrorMsg

MindSpore Serving's classic RESTful protocol always answers HTTP 200 with `{"error_msg": ...}`, also for each
failed instance of a reply. `classic_error` names an unexpected exception as the classic protocols do.
"""
import enum
from typing import Tuple

import grpc

from mindspore_serving.common import errors
from mindspore_serving.common.errors import Kind
from mindspore_serving.common.tensor_codec import error_msg
from mindspore_serving.proto import ms_service_pb2


class Protocol(enum.Enum):
    TGI = "tgi"
    """HuggingFace text-generation-inference; MindSpore LLM-serving's routes copy it and share its errors."""
    OPENAI = "openai"
    MINDSPORE = "mindspore"
    """MindSpore Serving's classic RESTful protocol."""


# kind -> (HTTP status, message prefix); TGI's error_type is the kind's own value
_TGI = {
    Kind.VALIDATION: (422, "Input validation error: "),
    Kind.OVERLOADED: (429, "Model is overloaded: "),
    Kind.NOT_FOUND: (404, ""),
    Kind.UNAVAILABLE: (503, ""),
    Kind.GENERATION: (424, "Request failed during generation: "),
    Kind.INCOMPLETE: (500, "Incomplete generation: "),
    Kind.INTERNAL: (500, ""),
}

# kind -> (HTTP status, error.type, error.code)
_OPENAI = {
    Kind.VALIDATION: (400, "invalid_request_error", None),
    Kind.OVERLOADED: (429, "requests", "rate_limit_exceeded"),
    Kind.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    Kind.UNAVAILABLE: (503, "server_error", "service_unavailable"),
    Kind.GENERATION: (500, "server_error", None),
    Kind.INCOMPLETE: (500, "server_error", "incomplete_generation"),
    Kind.INTERNAL: (500, "server_error", None),
}


def http_error(protocol: Protocol, error: BaseException) -> Tuple[int, dict]:
    """(HTTP status, JSON body) of `error` in `protocol`'s shape."""
    kind = errors.kind_of(error)
    message = errors.message_of(error)
    if protocol is Protocol.TGI:
        status, prefix = _TGI[kind]
        return status, {"error": prefix + message, "error_type": kind.value}
    if protocol is Protocol.OPENAI:
        status, error_type, code = _OPENAI[kind]
        return status, {"error": {"message": message, "type": error_type, "param": getattr(error, "param", None),
                                  "code": code}}
    return 200, {"error_msg": message}


def classic_error(error: BaseException) -> errors.ServingError:
    """`error` as MindSpore Serving's classic protocols (gRPC and the RESTful `/model/...` route) report it: a
    ServingError as it is, an unexpected exception as a SYSTEM_ERROR "Serving Error: <exception>"."""
    if isinstance(error, errors.ServingError):
        return error
    return errors.SystemError_(f"Serving Error: {error}")


def grpc_error(error: BaseException) -> Tuple[grpc.StatusCode, ms_service_pb2.ErrorMsg]:
    """The gRPC status that ends a call failing with `error`, and the ErrorMsg its reply carries when the status
    is OK. Overloaded ends the call with RESOURCE_EXHAUSTED, gRPC clients' back-pressure signal, and a stopping
    server with UNAVAILABLE; any other error is a reply. An unexpected exception is a SYSTEM_ERROR that names it."""
    error = classic_error(error)
    if error.KIND is Kind.OVERLOADED:
        return grpc.StatusCode.RESOURCE_EXHAUSTED, error_msg(error)
    if isinstance(error, errors.ServerStopping):  # clients retry UNAVAILABLE on another server
        return grpc.StatusCode.UNAVAILABLE, error_msg(error)
    return grpc.StatusCode.OK, error_msg(error)
