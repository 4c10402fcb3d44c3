"""Wire framing of the streams: server-sent events and MindSpore LLM-serving's raw `data:` lines.

An SSE event is `data: <one line of JSON>` followed by an empty line; JSON text never holds a raw newline,
so one `data:` line always carries the whole object. A line starting with ":" is a comment (keep-alive).
"""

import orjson

SSE_MEDIA_TYPE = "text/event-stream"
RAW_MEDIA_TYPE = "text/plain; charset=utf-8"
JSON_MEDIA_TYPE = "application/json"

DONE = b"data: [DONE]\n\n"
"""OpenAI's end-of-stream event."""
KEEP_ALIVE = b": keep-alive\n\n"

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def dumps(payload) -> bytes:
    """JSON bytes; NaN and infinities become null (JSON has no such numbers)."""
    return orjson.dumps(payload)


def event(payload) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


def retry(milliseconds: int) -> bytes:
    """Tells EventSource clients how long to wait before reconnecting."""
    return b"retry: %d\n\n" % milliseconds


def raw_line(payload) -> bytes:
    """MindSpore LLM-serving's non-SSE stream: one `data:{json}` line per event."""
    return b"data:" + dumps(payload) + b"\n"
