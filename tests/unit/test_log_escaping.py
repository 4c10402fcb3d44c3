"""What a log line cannot be made to do by the text it quotes: start a line of its own (newlines, C1 controls,
Unicode line separators), or recolour a terminal; in messages and in the exceptions of a traceback alike."""

import builtins
import logging
import sys

import pytest

from mindspore_serving import log

FORGED = "x\n[ERROR] SERVING(1:2,MainProcess):forged \x1b[31mred\x85nel\u2028ls\u2029ps\x9bcsi"
ESCAPED = "x\\n[ERROR] SERVING(1:2,MainProcess):forged \\x1b[31mred\\x85nel\\u2028ls\\u2029ps\\x9bcsi"


def _raise(text):
    raise ValueError(text)


def _exc_info(function):
    try:
        function()
    except BaseException:  # pylint: disable=broad-except
        return sys.exc_info()
    raise AssertionError("nothing raised")


def test_messages_escape_c1_controls_and_unicode_line_separators():
    assert log.escape_controls(FORGED) == ESCAPED
    assert log.escape_controls("tab\tstays, é and 中 too") == "tab\tstays, é and 中 too"


def test_a_traceback_keeps_its_lines_but_each_exception_is_one_line():
    def chained():
        try:
            _raise(FORGED)
        except ValueError as err:
            raise RuntimeError("outer\r\nline") from err

    lines = log.format_exception(_exc_info(chained)).split("\n")
    assert lines[0] == "Traceback (most recent call last):" and lines[1].startswith("  File ")
    assert f"ValueError: {ESCAPED}" in lines
    assert lines[-1] == "RuntimeError: outer\\r\\nline"
    assert "The above exception was the direct cause of the following exception:" in lines
    assert not [line for line in lines if line.startswith("[ERROR]") or "\x1b" in line or "\x85" in line]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups came with Python 3.11")
def test_grouped_exceptions_are_escaped_too():
    def grouped():
        raise builtins.ExceptionGroup("group\nline", [ValueError("inner\nline")])

    text = log.format_exception(_exc_info(grouped))
    assert "group\\nline" in text and "ValueError: inner\\nline" in text
    assert not [line for line in text.split("\n") if line.lstrip(" |").startswith("line")]


def test_the_formatter_escapes_what_log_exception_writes():
    formatter = log._Formatter()  # pylint: disable=protected-access
    record = logging.LogRecord(
        "mindspore_serving",
        logging.ERROR,
        "/x/mindspore_serving/w.py",
        3,
        "failed %s",
        ("q\nq",),
        _exc_info(lambda: _raise(FORGED)),
    )
    lines = formatter.format(record).split("\n")
    assert lines[0].endswith("[mindspore_serving/w.py:3] failed q\\nq")
    assert lines[-1] == f"ValueError: {ESCAPED}"


def test_each_handler_writes_the_request_id_once_and_the_record_keeps_its_message():
    formatter = log._Formatter()  # pylint: disable=protected-access
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "cost %s\n", ("1 ms",), None)
    token = log.bind_request_id("abc")
    try:
        lines = [formatter.format(record) for _ in range(3)]  # a console, a file, a third handler
    finally:
        log.unbind_request_id(token)
    assert all(line.endswith("] cost 1 ms\\n [request abc]") for line in lines), lines
    assert (record.msg, record.args) == ("cost %s\n", ("1 ms",))
