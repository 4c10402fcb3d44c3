"""The one place where an error becomes an HTTP reply, for every LLM protocol.

Every failure is first sorted into a `Kind`; each protocol then has one table from kind to HTTP status
and error shape. The same body is used for a reply before the stream starts (with the status) and for an
error event in the middle of a stream (the status is already 200 there).

    kind         raised as                                  TGI / LLM-serving           OpenAI (type, code)
    validation   InvalidInputs (incl. InvalidRequestError)  422 validation              400 invalid_request_error
    overloaded   backend.Overloaded                         429 overloaded              429 requests,
                                                                                            rate_limit_exceeded
    not_found    ServableUnavailable                        404 not_found               404 invalid_request_error,
                                                                                            model_not_found
    unavailable  WorkerUnavailable                          503 unavailable             503 server_error,
                                                                                            service_unavailable
    generation   other ServingErrors, finish "error"/"abort" 424 generation             500 server_error
    incomplete   IncompleteGeneration (no FinalEvent)       500 incomplete_generation   500 server_error,
                                                                                            incomplete_generation
    internal     any other exception (a bug)                500 internal                500 server_error

MindSpore Serving's classic RESTful protocol always answers HTTP 200 with `{"error_msg": ...}`.
"""
import enum
from typing import Optional, Tuple

from mindspore_serving.common import errors
from mindspore_serving.master.llm_types import Overloaded


class Kind(enum.Enum):
    VALIDATION = "validation"
    OVERLOADED = "overloaded"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    GENERATION = "generation"
    INCOMPLETE = "incomplete_generation"
    INTERNAL = "internal"


class Protocol(enum.Enum):
    TGI = "tgi"
    """HuggingFace text-generation-inference; MindSpore LLM-serving's routes copy it and share its errors."""
    OPENAI = "openai"
    MINDSPORE = "mindspore"
    """MindSpore Serving's classic RESTful protocol."""


class InvalidParam(errors.InvalidInputs):
    """A request field the front end rejects; `param` names it (OpenAI's `error.param`)."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


class GenerationFailed(errors.Failed):
    """The engine finished the request with reason "error" or "abort"."""


class IncompleteGeneration(errors.Failed):
    """The backend's event stream ended without its FinalEvent."""


def kind_of(exc: BaseException) -> Kind:
    if isinstance(exc, IncompleteGeneration):
        return Kind.INCOMPLETE
    if isinstance(exc, errors.InvalidInputs):
        return Kind.VALIDATION
    if isinstance(exc, Overloaded):
        return Kind.OVERLOADED
    if isinstance(exc, errors.ServableUnavailable):
        return Kind.NOT_FOUND
    if isinstance(exc, errors.WorkerUnavailable):
        return Kind.UNAVAILABLE
    if isinstance(exc, errors.ServingError):
        return Kind.GENERATION
    return Kind.INTERNAL


def message_of(exc: BaseException) -> str:
    if isinstance(exc, errors.ServingError):
        return exc.message
    return f"internal error: {type(exc).__name__}: {exc}"


_TGI = {
    Kind.VALIDATION: (422, "validation", "Input validation error: "),
    Kind.OVERLOADED: (429, "overloaded", "Model is overloaded: "),
    Kind.NOT_FOUND: (404, "not_found", ""),
    Kind.UNAVAILABLE: (503, "unavailable", ""),
    Kind.GENERATION: (424, "generation", "Request failed during generation: "),
    Kind.INCOMPLETE: (500, "incomplete_generation", "Incomplete generation: "),
    Kind.INTERNAL: (500, "internal", ""),
}

_OPENAI = {
    Kind.VALIDATION: (400, "invalid_request_error", None),
    Kind.OVERLOADED: (429, "requests", "rate_limit_exceeded"),
    Kind.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    Kind.UNAVAILABLE: (503, "server_error", "service_unavailable"),
    Kind.GENERATION: (500, "server_error", None),
    Kind.INCOMPLETE: (500, "server_error", "incomplete_generation"),
    Kind.INTERNAL: (500, "server_error", None),
}


def error_reply(protocol: Protocol, exc: BaseException) -> Tuple[int, dict]:
    """(HTTP status, JSON body) of `exc` in `protocol`'s shape."""
    kind = kind_of(exc)
    message = message_of(exc)
    if protocol is Protocol.TGI:
        status, error_type, prefix = _TGI[kind]
        return status, {"error": prefix + message, "error_type": error_type}
    if protocol is Protocol.OPENAI:
        status, error_type, code = _OPENAI[kind]
        return status, {"error": {"message": message, "type": error_type, "param": getattr(exc, "param", None),
                                  "code": code}}
    return 200, {"error_msg": message}
