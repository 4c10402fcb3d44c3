"""The exceptions of MindSpore Serving: one hierarchy, each class carrying its kind and its error code.

The code travels in `ErrorMsg.error_code` of the public gRPC reply; the message text reaches clients
unchanged, so tests assert on it. The kind decides every other transport's answer (HTTP status and body
per protocol, gRPC status) in `frontends/errors.py`, and is what crosses the master <-> LLM worker
session (`ipc/llm_session.py`). Raise the class that names the failure.

    class                kind                    code
    InvalidInputs        validation              INVALID_INPUTS
    InvalidParam         validation              INVALID_INPUTS (names the request field)
    Overloaded           overloaded              FAILED
    PayloadTooLarge      payload_too_large       INVALID_INPUTS
    ServableUnavailable  not_found               SERVABLE_UNAVAILABLE
    UnknownServable      not_found               INVALID_INPUTS (servable, version or method not served)
    WorkerUnavailable    unavailable             WORKER_UNAVAILABLE
    ServerStopping       unavailable             WORKER_UNAVAILABLE (gRPC UNAVAILABLE)
    Failed               generation              FAILED
    SystemError_         generation              SYSTEM_ERROR
    GenerationFailed     generation              FAILED
    IncompleteGeneration incomplete_generation   FAILED
    (any other exception: a bug)  internal
"""

import enum
import os
import re

from mindspore_serving import log

OK = 0
FAILED = 1
INVALID_INPUTS = 2
SYSTEM_ERROR = 3
WORKER_UNAVAILABLE = 4
SERVABLE_UNAVAILABLE = 5

CODE_NAMES = {
    OK: "OK",
    FAILED: "FAILED",
    INVALID_INPUTS: "INVALID_INPUTS",
    SYSTEM_ERROR: "SYSTEM_ERROR",
    WORKER_UNAVAILABLE: "WORKER_UNAVAILABLE",
    SERVABLE_UNAVAILABLE: "SERVABLE_UNAVAILABLE",
}


class Kind(enum.Enum):
    """What went wrong, as far as a client's retry decision goes; the value is TGI's `error_type`."""

    VALIDATION = "validation"
    OVERLOADED = "overloaded"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    GENERATION = "generation"
    INCOMPLETE = "incomplete_generation"
    INTERNAL = "internal"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    TOO_LARGE = "payload_too_large"


class ServingError(Exception):
    """An error with a MindSpore Serving status code; `message` is the text the client sees."""

    CODE = FAILED
    KIND = Kind.GENERATION

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = int(code)
        self.message = str(message)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({CODE_NAMES.get(self.code, self.code)}, {self.message!r})"


class _CodedError(ServingError):
    def __init__(self, message: str) -> None:
        super().__init__(self.CODE, message)


class Failed(_CodedError):
    CODE = FAILED


class InvalidInputs(_CodedError):
    CODE = INVALID_INPUTS
    KIND = Kind.VALIDATION


class InvalidParam(InvalidInputs):
    """A request field a front end rejects; `param` names it (OpenAI's `error.param`)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class SystemError_(_CodedError):  # pylint: disable=invalid-name,redefined-builtin
    """A failure of the serving system itself (not of the request); the trailing _ avoids the builtin."""

    CODE = SYSTEM_ERROR


class WorkerUnavailable(_CodedError):
    CODE = WORKER_UNAVAILABLE
    KIND = Kind.UNAVAILABLE


class ServerStopping(WorkerUnavailable):
    """The server is stopping: it refuses new requests, and cuts those still running when its grace period
    ends (frontends/drain.py). Unlike a lost worker, it ends a gRPC call with status UNAVAILABLE."""


STOP_CUT = "cut: the server's grace period ended"
"""The message of the cancellation with which a stopping server cuts a request's task (frontends/drain.py), so
that code the cancellation passes through tells the cut (a server error) from a client going away."""


def cut_by_stop(cancelled: BaseException) -> bool:
    """Whether a CancelledError is the stopping server's cut rather than the client's cancellation."""
    return cancelled.args[:1] == (STOP_CUT,)


class ServableUnavailable(_CodedError):
    CODE = SERVABLE_UNAVAILABLE
    KIND = Kind.NOT_FOUND


class UnknownServable(ServableUnavailable):
    """A servable, version or method the server does not serve: MindSpore Serving's code is INVALID_INPUTS."""

    CODE = INVALID_INPUTS


class Overloaded(Failed):
    """Too many requests are queued; retry later (HTTP 429, gRPC RESOURCE_EXHAUSTED)."""

    KIND = Kind.OVERLOADED


class PayloadTooLarge(InvalidInputs):
    """A request body beyond the route's limit (HTTP 413, gRPC RESOURCE_EXHAUSTED); the text names the limit."""

    KIND = Kind.TOO_LARGE


class GenerationFailed(Failed):
    """The engine finished the request with reason "error" or "abort"."""


class Unauthenticated(Failed):
    """The request carries no API key, or not the server's (HTTP 401, gRPC UNAUTHENTICATED)."""

    KIND = Kind.UNAUTHENTICATED


class Forbidden(Failed):
    """The server does not allow this operation (model control off; HTTP 403, gRPC PERMISSION_DENIED)."""

    KIND = Kind.FORBIDDEN


class IncompleteGeneration(Failed):
    """A generation's event stream ended without its final event."""

    KIND = Kind.INCOMPLETE


_BY_CODE = {cls.CODE: cls for cls in (Failed, InvalidInputs, SystemError_, WorkerUnavailable, ServableUnavailable)}
# the class a kind becomes when only the kind crossed a process boundary
_BY_KIND = {
    cls.KIND: cls
    for cls in (
        InvalidInputs,
        Overloaded,
        ServableUnavailable,
        WorkerUnavailable,
        Failed,
        IncompleteGeneration,
        Unauthenticated,
        Forbidden,
        PayloadTooLarge,
    )
}


CORE_FAILED = "Raise failed: "


def core_failure(text: str) -> RuntimeError:
    """The RuntimeError MindSpore Serving raises for an error of its C++ core (registration, loading models,
    starting a server): its text after "Raise failed: ", as its Python binding passes it on."""
    return RuntimeError(CORE_FAILED + text)


def make_error(code: int, message: str) -> ServingError:
    """The most specific ServingError for `code`."""
    cls = _BY_CODE.get(int(code))
    return cls(message) if cls is not None else ServingError(code, message)


def error_of_kind(kind: Kind, message: str) -> ServingError:
    """The ServingError a peer meant when it sent only `kind` and `message` (an internal error is a Failed)."""
    return _BY_KIND.get(kind, Failed)(message)


def kind_of(error: BaseException) -> Kind:
    return error.KIND if isinstance(error, ServingError) else Kind.INTERNAL


_ROOTS = frozenset(name for name in os.listdir("/") if os.path.isdir("/" + name))
_PATH = re.compile(r"(?<![\w.~:/-])/([\w.@+-]+)(?:/[\w.@+-]+)*")  # an absolute path; group 1: its first component
_REPR = re.compile(r"<([^<>]*?) at 0x[0-9a-fA-F]+>")  # <_io.BytesIO object at 0x7f3a...>, <function f at 0x...>
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def _cut_path(match: re.Match[str]) -> str:
    path: str = match.group(0)
    if match.group(1) not in _ROOTS:
        return path  # a URL path (/v2/models/add/infer, /ready), not a file's
    return path.rsplit("/", 1)[1]


def client_text(text: str) -> str:
    """`text` as a client may see it: an absolute file path (one under a directory of this machine's root, or that
    directory itself) is cut to its last component, a repr with a memory address (`<_io.BytesIO object at
    0x7f3a...>`) to the object's kind (`<_io.BytesIO object>`), any other address to `<address>`. URL paths are
    left alone."""
    if "/" in text:
        text = _PATH.sub(_cut_path, text)
    if "0x" in text:
        text = _ADDRESS.sub("<address>", _REPR.sub(r"<\1>", text))
    return text


def internal_text() -> str:
    """What a client is told of an unexpected exception (a bug): nothing of it, whose text may hold paths, reprs
    or other requests' data, but the request's id (the one its reply carries), with which the server log's line
    about it, traceback and all, is found."""
    request_id = log.current_request_id()
    if request_id is None:
        return "internal error: see the server log"
    return f"internal error (request {request_id}): see the server log"


def message_of(error: BaseException) -> str:
    """The text a client sees (client_text): a ServingError's own message, or for an unexpected exception the
    generic internal_text (whoever catches it logs it)."""
    if isinstance(error, ServingError):
        return client_text(error.message)
    return internal_text()


def as_serving_error(error: object) -> ServingError:
    """Normalises an error result: a ServingError, a `(code, message)` pair, an object with `.code` and
    `.message`, or any other exception (code FAILED, message `str(error)`)."""
    if isinstance(error, ServingError):
        return error
    if isinstance(error, tuple) and len(error) == 2:
        return make_error(error[0], error[1])
    code = getattr(error, "code", None)
    message = getattr(error, "message", None)
    if isinstance(code, int) and not isinstance(code, bool) and isinstance(message, str):
        return make_error(code, message)
    return Failed(str(error))
