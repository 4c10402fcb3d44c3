"""Error codes of MindSpore Serving and the exceptions that carry them.

The codes travel in `ErrorMsg.error_code` of the public gRPC reply; the message text reaches clients
unchanged, so tests assert on it. Raise the subclass that names the code; map exceptions to a wire reply
in one place (`tensor_codec.build_predict_reply`).
"""

OK = 0
FAILED = 1
INVALID_INPUTS = 2
SYSTEM_ERROR = 3
WORKER_UNAVAILABLE = 4
SERVABLE_UNAVAILABLE = 5

CODE_NAMES = {OK: "OK", FAILED: "FAILED", INVALID_INPUTS: "INVALID_INPUTS", SYSTEM_ERROR: "SYSTEM_ERROR",
              WORKER_UNAVAILABLE: "WORKER_UNAVAILABLE", SERVABLE_UNAVAILABLE: "SERVABLE_UNAVAILABLE"}


class ServingError(Exception):
    """An error with a MindSpore Serving status code; `message` is the text the client sees."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = int(code)
        self.message = str(message)

    def __str__(self):
        return self.message

    def __repr__(self):
        return f"{type(self).__name__}({CODE_NAMES.get(self.code, self.code)}, {self.message!r})"


class _CodedError(ServingError):
    CODE = FAILED

    def __init__(self, message: str):
        super().__init__(self.CODE, message)


class Failed(_CodedError):
    CODE = FAILED


class InvalidInputs(_CodedError):
    CODE = INVALID_INPUTS


class SystemError_(_CodedError):  # pylint: disable=invalid-name,redefined-builtin
    """A failure of the serving system itself (not of the request); the trailing _ avoids the builtin."""
    CODE = SYSTEM_ERROR


ServingSystemError = SystemError_


class WorkerUnavailable(_CodedError):
    CODE = WORKER_UNAVAILABLE


class ServableUnavailable(_CodedError):
    CODE = SERVABLE_UNAVAILABLE


class Overloaded(Failed):
    """Too many requests are queued; retry later (HTTP 429, gRPC RESOURCE_EXHAUSTED)."""


_BY_CODE = {cls.CODE: cls for cls in (Failed, InvalidInputs, SystemError_, WorkerUnavailable, ServableUnavailable)}


def make_error(code: int, message: str) -> ServingError:
    """The most specific ServingError for `code`."""
    cls = _BY_CODE.get(int(code))
    return cls(message) if cls is not None else ServingError(code, message)


def as_serving_error(error) -> ServingError:
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
