"""Logging in MindSpore Serving's format.

`[LEVEL] SERVING(pid:tid,proc):YYYY-mm-dd-HH:MM:SS.mmm.uuu [file:line] msg` on stderr.
GLOG_v selects the level: 0 DEBUG, 1 INFO, 2 WARNING (default), 3 ERROR;
MS_SUBMODULE_LOG_v="{SERVING:n}" overrides it.
"""
import logging
import os
import re
import sys
import time

_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}
_LOGGER_NAME = "mindspore_serving"


def _level_from_env():
    value = os.environ.get("GLOG_v", "2")
    sub = os.environ.get("MS_SUBMODULE_LOG_v", "")
    match = re.search(r"SERVING\s*:\s*(\d)", sub)
    if match:
        value = match.group(1)
    if value not in ("0", "1", "2", "3"):
        raise ValueError(f"Incorrect log level {value!r} in GLOG_v, please check it: the value should be 0, 1, 2 or 3")
    return _LEVELS[int(value)]


class _Formatter(logging.Formatter):
    def format(self, record):
        seconds = int(record.created)
        micros = int((record.created - seconds) * 1_000_000)
        stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime(seconds))
        stamp = f"{stamp}.{micros // 1000:03d}.{micros % 1000:03d}"
        head = (f"[{record.levelname}] SERVING({record.process}:{record.thread},{record.processName})"
                f":{stamp} [{record.filename}:{record.lineno}]")
        text = f"{head} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _build_logger():
    logger = logging.getLogger(_LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Formatter())
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(_level_from_env())
    return logger


_logger = _build_logger()


def debug(msg, *args, **kwargs):
    _logger.debug(msg, *args, stacklevel=2, **kwargs)


def info(msg, *args, **kwargs):
    _logger.info(msg, *args, stacklevel=2, **kwargs)


def warning(msg, *args, **kwargs):
    _logger.warning(msg, *args, stacklevel=2, **kwargs)


def error(msg, *args, **kwargs):
    _logger.error(msg, *args, stacklevel=2, **kwargs)


def exception(msg, *args, **kwargs):
    _logger.error(msg, *args, exc_info=True, stacklevel=2, **kwargs)


def flush():
    """Flushes every handler (before a process leaves with os._exit)."""
    for handler in _logger.handlers:
        handler.flush()
    sys.stderr.flush()
