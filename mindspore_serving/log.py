"""Logging as MindSpore Serving does it, in every process of the server (master, workers, agents).

Each line: `[LEVEL] SERVING(pid:tid,process name):YYYY-mm-dd-HH:MM:SS.mmm.uuu [file:line] message`, where `file`
is the caller's path from its last `mindspore` component on (e.g. `mindspore_serving/worker/service.py`).

The logger is set up from the environment at its first use (a bad value raises ValueError there):

- GLOG_v: 0 DEBUG, 1 INFO, 2 WARNING (default), 3 ERROR.
- MS_SUBMODULE_LOG_v="{SERVING:n, ...}": n overrides GLOG_v for this logger; a malformed text or level is
  reported with a warning and ignored.
- GLOG_logtostderr: 1 (default) logs to stderr; 0 writes `<GLOG_log_dir>/mindspore_serving.log.<pid>` (one file
  per process, rotated at logger_maxBytes, default 50 MiB, keeping logger_backupCount files, default 30) and also
  sends records at GLOG_stderrthreshold (0-3 as GLOG_v, default 2) and above to stderr.
"""

import contextvars
import logging
import os
import re
import stat
import sys
import threading
import time
import traceback
from logging.handlers import RotatingFileHandler

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None

__all__ = ["get_level", "get_log_config"]

_LOGGER_NAME = "mindspore_serving"
_SUBMODULE = "SERVING"
_FILE_PREFIX = "mindspore_serving.log."

# GLOG_v / GLOG_stderrthreshold value -> level name; the order is that of the ValueError's text
_GLOG_LEVEL_NAMES = {"3": "ERROR", "2": "WARNING", "1": "INFO", "0": "DEBUG"}
_NAME_LEVELS = {"ERROR": logging.ERROR, "WARNING": logging.WARNING, "INFO": logging.INFO, "DEBUG": logging.DEBUG}
_LEVEL_GLOG = {_NAME_LEVELS[name]: glog for glog, name in _GLOG_LEVEL_NAMES.items()}
_DEFAULT_LEVEL = "2"
_DEFAULT_MAX_BYTES = 52428800
_DEFAULT_BACKUP_COUNT = 30
_TO_STDERR, _TO_FILE = "1", "0"

_VARIABLES = {
    "level": "GLOG_v",
    "stderr_level": "GLOG_stderrthreshold",
    "console": "GLOG_logtostderr",
    "filepath": "GLOG_log_dir",
    "maxBytes": "logger_maxBytes",
    "backupCount": "logger_backupCount",
}

EXCEPTION = logging.ERROR + 5  # MindSpore Serving's level of an error raised into Python: `[EXCEPTION] ...`
logging.addLevelName(EXCEPTION, "EXCEPTION")

_setup_lock = threading.Lock()
_logger = None


# ---- configuration ----


def _env_settings():
    """The log variables that are set and not empty, stripped."""
    settings = {}
    for key, variable in _VARIABLES.items():
        value = os.environ.get(variable)
        if value:
            settings[key] = value.strip()
    return settings


def _check_level(level: str):
    if _GLOG_LEVEL_NAMES.get(level) not in _NAME_LEVELS:
        raise ValueError(
            f"Incorrect log level:{level}, Please check the configuration of GLOG_v or "
            f"GLOG_stderrthreshold, desired log level :{_GLOG_LEVEL_NAMES}"
        )


def _check_settings(settings: dict):
    """Raises ValueError, in MindSpore Serving's words, for a bad value."""
    for key in ("level", "stderr_level"):
        if key in settings:
            _check_level(settings[key])
    console = settings.get("console")
    if console is None:
        return
    if not console.isdigit() or console not in (_TO_FILE, _TO_STDERR):
        raise ValueError(
            "Incorrect value, The value of GLOG_logtostderr must be 0 or 1, Output log to console, configure to 1."
        )
    if console != _TO_FILE:
        return
    file_path = settings.get("filepath")
    if not file_path:
        raise ValueError(
            "When GLOG_logtostderr is set to 0, The directory of saving log must be set, GLOG_log_dir cannot be empty."
        )
    if not os.path.exists(os.path.realpath(file_path)):
        raise ValueError(f"The file path does not exist. GLOG_log_dir:{file_path}")
    for key in ("maxBytes", "backupCount"):
        value = settings.get(key)
        if value is not None and not value.isdigit():
            variable = _VARIABLES[key]
            raise ValueError(f"Incorrect value, The value of {variable} must be positive integer. {variable}:{value}")


# ---- MS_SUBMODULE_LOG_v ----


def _tokens(text: str):
    """(kind, text) of MS_SUBMODULE_LOG_v: braces, commas, colons, names [A-Za-z][A-Za-z0-9_]*, numbers [0-9]+;
    spaces and tabs separate them; anything else is `invalid` and ends the text."""
    index = 0
    while True:
        while index < len(text) and text[index] in " \t":
            index += 1
        if index == len(text):
            yield "eos", ""
            return
        char = text[index]
        if char in "{},:":
            index += 1
            yield char, char
        elif char.isascii() and char.isalpha():
            start = index
            while index < len(text) and text[index].isascii() and (text[index].isalnum() or text[index] == "_"):
                index += 1
            yield "variable", text[start:index]
        elif char.isascii() and char.isdigit():
            start = index
            while index < len(text) and text[index].isascii() and text[index].isdigit():
                index += 1
            yield "number", text[start:index]
        else:
            yield "invalid", char
            return


def parse_submodule_levels(text: str, warn=None) -> dict:
    """`{NAME:level, ...}` -> {NAME: level text}; {} for an empty text. A malformed text is ignored as a whole:
    `warn` (if given) gets MindSpore Serving's message about it."""
    tokens = _tokens(text)

    def expect(kind, got):
        if got[0] == kind:
            return True
        if warn is not None:
            got_name = "end-of-string" if got[0] == "eos" else got[0]
            warn(
                f"Parse submodule log configuration text error, expect `{kind}`, but got `{got_name}`. "
                f"The whole configuration will be ignored."
            )
        return False

    token = next(tokens)
    if token[0] == "eos" or not expect("{", token):
        return {}
    levels = {}
    while True:
        name = next(tokens)
        if not expect("variable", name):
            return {}
        if not expect(":", next(tokens)):
            return {}
        value = next(tokens)
        if not expect("number", value):
            return {}
        levels[name[1]] = value[1]
        token = next(tokens)
        if token[0] != ",":
            break
    return levels if expect("}", token) else {}


def _submodule_override(logger: logging.Logger):
    """The level MS_SUBMODULE_LOG_v gives SERVING, if it gives a valid one (warnings through `logger` else)."""
    text = os.environ.get("MS_SUBMODULE_LOG_v", "")
    value = parse_submodule_levels(text, warn=logger.warning).get(_SUBMODULE)
    if value is None:
        return None
    if value not in _GLOG_LEVEL_NAMES:
        logger.warning(f"Illegal log level value {value} for {_SUBMODULE}, ignore it.")
        return None
    return _NAME_LEVELS[_GLOG_LEVEL_NAMES[value]]


def pinned_submodule_config(text: str = None) -> str:
    """MS_SUBMODULE_LOG_v for a child process whose GLOG_v is changed for MindSpore's own log: the user's entries
    (`text`, default this process's variable) with SERVING pinned to this process's level."""
    if text is None:
        text = os.environ.get("MS_SUBMODULE_LOG_v", "")
    levels = parse_submodule_levels(text)
    levels[_SUBMODULE] = get_level()
    return "{" + ",".join(f"{name}:{value}" for name, value in levels.items()) + "}"


# ---- records ----

_REQUEST_ID = contextvars.ContextVar("ms_serving_request_id", default=None)


def bind_request_id(request_id: str) -> contextvars.Token:
    """Lines logged from this context on (the request's task) end with ` [request <id>]`; `unbind_request_id`
    with the token ends that."""
    return _REQUEST_ID.set(request_id)


def unbind_request_id(token: contextvars.Token) -> None:
    _REQUEST_ID.reset(token)


def current_request_id():
    """The request id bound in this context (bind_request_id), or None."""
    return _REQUEST_ID.get()


# C0 controls but tab, DEL, C1 controls (NEL, 0x85, among them) and the Unicode line and paragraph separators
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match) -> str:
    char = match.group()
    code = ord(char)
    return {"\n": "\\n", "\r": "\\r"}.get(char, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape_controls(text: str) -> str:
    """`text` on one line, with no terminal controls: newlines, carriage returns, ANSI escapes, the other control
    characters (tabs aside, C1 ones included) and the Unicode line separators written as `\\n`, `\\r`, `\\x1b`,
    `\\x85`, `\\u2028`... A message that quotes what a client sent cannot forge log lines or recolour a terminal."""
    return _CONTROL.sub(_escape, text)


def _escape_lines(text: str) -> str:
    """`text` with each of its lines escaped (escape_controls), its own newlines kept."""
    return "\n".join(escape_controls(line) for line in text.split("\n"))


def _escaped_only(format_exception_only):
    def escaped(*args, **kwargs):
        for text in format_exception_only(*args, **kwargs):
            yield escape_controls(text[:-1]) + "\n" if text.endswith("\n") else escape_controls(text)

    return escaped


def format_exception(exc_info) -> str:
    """The traceback of `exc_info` as `traceback` prints it, escaped: its frames keep their lines, but the text of
    each exception (chained and grouped ones too) is one line, so that a newline or an ANSI escape in what an
    exception quotes cannot forge a log line."""
    top = traceback.TracebackException(*exc_info[:3])
    pending, seen = [top], set()
    while pending:
        exception = pending.pop()
        if id(exception) in seen:
            continue
        seen.add(id(exception))
        # NOTE: format() asks each exception of the chain for its text: that exception's own method, escaped here
        exception.format_exception_only = _escaped_only(exception.format_exception_only)
        pending += [e for e in (exception.__cause__, exception.__context__) if e is not None]
        pending += getattr(exception, "exceptions", None) or []
    return _escape_lines("".join(top.format()).rstrip("\n"))


class _Formatter(logging.Formatter):
    """MindSpore Serving's header; the time has milliseconds and microseconds (`.mmm.uuu`). The message is escaped
    (escape_controls) and, while a request is handled, names its id; a traceback after it keeps its lines, the
    text of its exceptions escaped (format_exception)."""

    def __init__(self):
        super().__init__(
            "[%(levelname)s] %(sub_module)s(%(process)d:%(thread)d,%(processName)s):%(asctime)s "
            "[%(filepath)s:%(lineno)d] %(message)s"
        )

    def formatTime(self, record, datefmt=None):
        seconds = int(record.created)
        micros = min(int(round((record.created - seconds) * 1_000_000)), 999_999)
        stamp = time.strftime(datefmt or "%Y-%m-%d-%H:%M:%S", self.converter(seconds))
        return stamp if datefmt else f"{stamp}.{micros // 1000:03d}.{micros % 1000:03d}"

    def formatException(self, ei):
        return format_exception(ei)

    def formatStack(self, stack_info):
        return _escape_lines(stack_info)

    def format(self, record):
        index = record.pathname.rfind("mindspore")
        record.filepath = record.pathname[index:] if index >= 0 else record.pathname
        record.sub_module = _SUBMODULE
        message = record.getMessage()
        escaped = escape_controls(message)
        request_id = _REQUEST_ID.get()
        if request_id is not None:
            escaped = f"{escaped} [request {request_id}]"
        if escaped == message:
            return super().format(record)
        # the record is formatted once per handler: its own message stays as logged
        saved = record.msg, record.args
        record.msg, record.args = escaped, None
        try:
            return super().format(record)
        finally:
            record.msg, record.args = saved


_INTERNAL_FILES = {os.path.normcase(logging.Logger.callHandlers.__code__.co_filename)}


def _find_caller(stack_info=False, stacklevel=1):  # pylint: disable=unused-argument
    """The first frame outside this module and `logging`: the file:line of the header is the caller's."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None and os.path.normcase(frame.f_code.co_filename) in _INTERNAL_FILES:
        frame = frame.f_back
    if frame is None:
        return "(unknown file)", 0, "(unknown function)", None
    info = None
    if stack_info:
        import traceback  # pylint: disable=import-outside-toplevel

        info = "Stack (most recent call last):\n" + "".join(traceback.format_stack(frame))
    return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, info


_INTERNAL_FILES.add(os.path.normcase(_find_caller.__code__.co_filename))


def open_private(path: str, mode: str = "a"):
    """A log file opened for writing ("w" or "a") that only its owner can read: created 0600, and made so if it
    was there already (a log holds what clients sent). A link there is refused (OSError), never followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fd = os.open(path, flags, stat.S_IREAD | stat.S_IWRITE)
    try:
        os.fchmod(fd, stat.S_IREAD | stat.S_IWRITE)
        return os.fdopen(fd, mode, encoding="utf-8", errors="backslashreplace")
    except BaseException:
        os.close(fd)
        raise


class _RotatingFile(RotatingFileHandler):
    """Rotation as MindSpore Serving's: backups `<file>.1` (newest) .. `<file>.<backupCount>` are made read-only
    (0400), the new file is 0600; an exclusive lock on the file is taken first. The file is 0600 from the start."""

    def _open(self):
        return open_private(self.baseFilename, "a")

    def doRollover(self):
        if self.stream:
            self.stream.close()
            self.stream = None
        with open_private(self.baseFilename, "a") as stream:
            if fcntl is not None:
                fcntl.lockf(stream.fileno(), fcntl.LOCK_EX)
        for index in range(self.backupCount - 1, 0, -1):
            source = self.rotation_filename(f"{self.baseFilename}.{index}")
            if os.path.exists(source):
                target = self.rotation_filename(f"{self.baseFilename}.{index + 1}")
                if os.path.exists(target):
                    os.remove(target)
                os.chmod(source, stat.S_IREAD)
                os.rename(source, target)
        first = self.rotation_filename(self.baseFilename + ".1")
        if os.path.exists(first):
            os.remove(first)
        os.chmod(self.baseFilename, stat.S_IREAD)
        self.rotate(self.baseFilename, first)
        open_private(self.baseFilename, "a").close()  # 0600 from its creation on
        if not self.delay:
            self.stream = self._open()


def _build_logger(settings: dict) -> logging.Logger:
    logger = logging.getLogger(_LOGGER_NAME)
    logger.findCaller = _find_caller
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.setLevel(_NAME_LEVELS[_GLOG_LEVEL_NAMES[settings.get("level", _DEFAULT_LEVEL)]])
    stderr = logging.StreamHandler(sys.stderr)
    stderr.name = "StreamHandler"
    stderr.setFormatter(_Formatter())
    if settings.get("console") == _TO_FILE:
        path = os.path.join(os.path.realpath(settings["filepath"]), f"{_FILE_PREFIX}{os.getpid()}")
        to_file = _RotatingFile(
            path,
            maxBytes=int(settings.get("maxBytes", _DEFAULT_MAX_BYTES)),
            backupCount=int(settings.get("backupCount", _DEFAULT_BACKUP_COUNT)),
            encoding="utf8",
        )
        to_file.name = "FileHandler"
        to_file.setFormatter(_Formatter())
        logger.addHandler(to_file)
        stderr.setLevel(_NAME_LEVELS[_GLOG_LEVEL_NAMES[settings.get("stderr_level", _DEFAULT_LEVEL)]])
    logger.addHandler(stderr)
    override = _submodule_override(logger)
    if override is not None:
        logger.setLevel(override)
    return logger


def _get_logger() -> logging.Logger:
    global _logger  # pylint: disable=global-statement
    if _logger is not None:
        return _logger
    with _setup_lock:
        if _logger is None:
            settings = _env_settings()
            _check_settings(settings)
            _logger = _build_logger(settings)
    return _logger


# ---- API ----


def get_level() -> str:
    """This process's log level as GLOG_v writes it: '0' (DEBUG), '1' (INFO), '2' (WARNING) or '3' (ERROR)."""
    return _glog_level(_get_logger().getEffectiveLevel())


def get_log_config() -> dict:
    """GLOG_v and GLOG_logtostderr in effect; when logging to a file also GLOG_log_dir, logger_maxBytes,
    logger_backupCount and GLOG_stderrthreshold."""
    logger = _get_logger()
    config = {"GLOG_v": get_level(), "GLOG_logtostderr": _TO_STDERR}
    to_file = logger.handlers[0]
    if to_file.name == "FileHandler":
        config["GLOG_logtostderr"] = _TO_FILE
        config["GLOG_log_dir"] = os.path.dirname(to_file.baseFilename)
        config["logger_maxBytes"] = to_file.maxBytes
        config["logger_backupCount"] = to_file.backupCount
        config["GLOG_stderrthreshold"] = _glog_level(logger.handlers[1].level)
    return config


def _glog_level(level: int):
    return _LEVEL_GLOG.get(level)


def info_enabled() -> bool:
    """Whether INFO records are written: for lines that cost something to build on a hot path."""
    return _get_logger().isEnabledFor(logging.INFO)


def debug(msg, *args, **kwargs):
    _get_logger().debug(msg, *args, **kwargs)


def info(msg, *args, **kwargs):
    _get_logger().info(msg, *args, **kwargs)


def warning(msg, *args, **kwargs):
    _get_logger().warning(msg, *args, **kwargs)


def error(msg, *args, **kwargs):
    _get_logger().error(msg, *args, **kwargs)


def raised(msg, *args, **kwargs):
    """A record at MindSpore Serving's EXCEPTION level (an ERROR, written whatever GLOG_v says): the text of the
    error its C++ core raises into Python, after the ERROR line that says what failed."""
    _get_logger().log(EXCEPTION, msg, *args, **kwargs)


def exception(msg, *args, **kwargs):
    """An ERROR record with the traceback of the exception being handled."""
    _get_logger().error(msg, *args, exc_info=True, **kwargs)


def flush():
    """Flushes every handler (before a process leaves with os._exit)."""
    if _logger is not None:
        for handler in _logger.handlers:
            handler.flush()
    sys.stderr.flush()
