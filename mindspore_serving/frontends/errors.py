"""The one place where an exception becomes a front end's answer: one function per transport.

The exception's class (`common/errors.py`) carries its kind and its MindSpore Serving code; these functions
turn them into what each wire expects:

    grpc_error(error)            gRPC status code, and the MindSpore ErrorMsg of the reply
    http_error(protocol, error)  HTTP status and JSON body in the protocol's own shape
    http_error_headers(error)    the headers that go with it (Retry-After when the client should retry)
    kserve_grpc_status(error)    the gRPC status that ends a failing KServe v2 gRPC call
    classic_error(error)         an unexpected exception named as the classic protocols name it

The same HTTP body is used for a reply before a stream starts (with the status) and for an error event in
the middle of a stream (the status is already 200 there).

    kind         TGI / LLM-serving           OpenAI (type, code)                         MindSpore  gRPC
    validation   422 validation              400 invalid_request_error                   200        OK + ErrorMsg
    overloaded   429 overloaded              429 requests, rate_limit_exceeded           200        RESOURCE_EXHAUSTED
    not_found    404 not_found               404 invalid_request_error, model_not_found  200        OK + ErrorMsg
    unavailable  503 unavailable             503 server_error, service_unavailable       503        UNAVAILABLE
    generation   424 generation              500 server_error                            200        OK + ErrorMsg
    incomplete   500 incomplete_generation   500 server_error, incomplete_generation     200        OK + ErrorMsg
    internal     500 internal                500 server_error                            200        OK + ErrorMsg
    unauthent.   401 unauthenticated         401 invalid_request_error, invalid_api_key  401        UNAUTHENTICATED
    forbidden    403 forbidden               403 permission_error                        403        PERMISSION_DENIED
    too large    413 payload_too_large       413 invalid_request_error, payload_too_large 200       RESOURCE_EXHAUSTED

KServe v2 (REST `/v2/...` and gRPC `inference.GRPCInferenceService`) answers `{"error": "..."}` with 400, 429,
404, 503 or 500, and gRPC INVALID_ARGUMENT, RESOURCE_EXHAUSTED, NOT_FOUND, UNAVAILABLE or INTERNAL, by the
same kinds (unauthenticated: 401 and UNAUTHENTICATED; forbidden: 403 and PERMISSION_DENIED; too large: 413 and
RESOURCE_EXHAUSTED).

not_found is only for a name that is not served at all; a servable that is served but has no live worker or
agent at the moment (dead, hung, restarting, stopping) is unavailable: every protocol answers "retry later",
HTTP 503 with `Retry-After: RETRY_AFTER_S` and gRPC UNAVAILABLE.

MindSpore Serving's classic RESTful protocol answers HTTP 200 with `{"error_msg": ...}`, also for each failed
instance of a reply; only a request-wide unavailable error is a 503 (with the same body). `classic_error` names
an unexpected exception as the classic protocols do. An unexpected exception's own text never reaches a client
(it may hold paths, reprs, other requests' data): its reply names the request id instead, and the front end that
caught it logs it, traceback and all, on a line that ends with the same id.
"""

import enum

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
    KSERVE = "kserve"
    """The KServe v2 / Triton inference protocol: `{"error": "..."}` with the kind's HTTP status."""


RETRY_AFTER_S = 1
"""Seconds an unavailable answer tells the client to wait (a restarting worker is back within a few)."""

# kind -> (HTTP status, message prefix); TGI's error_type is the kind's own value
_TGI = {
    Kind.VALIDATION: (422, "Input validation error: "),
    Kind.OVERLOADED: (429, "Model is overloaded: "),
    Kind.NOT_FOUND: (404, ""),
    Kind.UNAVAILABLE: (503, ""),
    Kind.GENERATION: (424, "Request failed during generation: "),
    Kind.INCOMPLETE: (500, "Incomplete generation: "),
    Kind.INTERNAL: (500, ""),
    Kind.UNAUTHENTICATED: (401, ""),
    Kind.FORBIDDEN: (403, ""),
    Kind.TOO_LARGE: (413, ""),
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
    Kind.UNAUTHENTICATED: (401, "invalid_request_error", "invalid_api_key"),
    Kind.FORBIDDEN: (403, "permission_error", None),
    Kind.TOO_LARGE: (413, "invalid_request_error", "payload_too_large"),
}


# kind -> (HTTP status, gRPC status) of the KServe v2 protocol
_KSERVE = {
    Kind.VALIDATION: (400, grpc.StatusCode.INVALID_ARGUMENT),
    Kind.OVERLOADED: (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    Kind.NOT_FOUND: (404, grpc.StatusCode.NOT_FOUND),
    Kind.UNAVAILABLE: (503, grpc.StatusCode.UNAVAILABLE),
    Kind.GENERATION: (500, grpc.StatusCode.INTERNAL),
    Kind.INCOMPLETE: (500, grpc.StatusCode.INTERNAL),
    Kind.INTERNAL: (500, grpc.StatusCode.INTERNAL),
    Kind.UNAUTHENTICATED: (401, grpc.StatusCode.UNAUTHENTICATED),
    Kind.FORBIDDEN: (403, grpc.StatusCode.PERMISSION_DENIED),
    Kind.TOO_LARGE: (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
}

# kind -> HTTP status of MindSpore's classic protocol (200 for every other kind)
_MINDSPORE = {Kind.UNAVAILABLE: 503, Kind.UNAUTHENTICATED: 401, Kind.FORBIDDEN: 403}

# kind -> gRPC status that ends the call (OK for every other kind: the reply carries the ErrorMsg)
_GRPC = {
    Kind.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Kind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Kind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Kind.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
    Kind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def http_error(protocol: Protocol, error: BaseException) -> tuple[int, dict]:
    """(HTTP status, JSON body) of `error` in `protocol`'s shape."""
    kind = errors.kind_of(error)
    message = errors.message_of(error)
    if protocol is Protocol.TGI:
        status, prefix = _TGI[kind]
        return status, {"error": prefix + message, "error_type": kind.value}
    if protocol is Protocol.OPENAI:
        status, error_type, code = _OPENAI[kind]
        return status, {
            "error": {"message": message, "type": error_type, "param": getattr(error, "param", None), "code": code}
        }
    if protocol is Protocol.KSERVE:
        return _KSERVE[kind][0], {"error": message}
    return _MINDSPORE.get(kind, 200), {"error_msg": message}


def kserve_grpc_status(error: BaseException) -> grpc.StatusCode:
    """The status that ends a KServe v2 gRPC call failing with `error` (the v2 protocol has no error replies)."""
    return _KSERVE[errors.kind_of(error)][1]


def http_error_headers(error: BaseException) -> dict[str, str]:
    """The headers of an error reply, the same in every protocol: Retry-After when the servable is unavailable
    for now (a client that honours it, as OpenAI's and TGI's do, retries after that many seconds)."""
    if errors.kind_of(error) is Kind.UNAVAILABLE:
        return {"retry-after": str(RETRY_AFTER_S)}
    if errors.kind_of(error) is Kind.UNAUTHENTICATED:
        return {"www-authenticate": "Bearer"}
    return {}


def classic_error(error: BaseException) -> errors.ServingError:
    """`error` as MindSpore Serving's classic protocols (gRPC and the RESTful `/model/...` route) report it: a
    ServingError as it is, an unexpected exception as a SYSTEM_ERROR "Serving Error: internal error (request <id>):
    see the server log" (errors.internal_text: the exception's own text stays in the log)."""
    if isinstance(error, errors.ServingError):
        return error
    return errors.SystemError_(f"Serving Error: {errors.internal_text()}")


def grpc_error(error: BaseException) -> tuple[grpc.StatusCode, ms_service_pb2.ErrorMsg]:
    """The gRPC status that ends a call failing with `error`, and the ErrorMsg its reply carries when the status
    is OK. Overloaded ends the call with RESOURCE_EXHAUSTED, gRPC clients' back-pressure signal, and unavailable
    with UNAVAILABLE, their "retry later" (what gRPC retry policies retry on); any other error is a reply. An
    unexpected exception is a SYSTEM_ERROR that names it."""
    error = classic_error(error)
    return _GRPC.get(error.KIND, grpc.StatusCode.OK), error_msg(error)
