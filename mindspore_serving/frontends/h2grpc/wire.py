"""gRPC over HTTP/2 (grpc's PROTOCOL-HTTP2.md): the 5-byte message prefix, grpc-timeout, metadata and the status
trailers. Pure: no I/O."""

import base64
import struct
from collections.abc import Sequence

import grpc

PREFIX = struct.Struct(">BI")
TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# request headers that are HTTP/2 or gRPC framing, not call metadata
_RESERVED = frozenset(
    (
        b"content-type",
        b"te",
        b"grpc-timeout",
        b"grpc-encoding",
        b"grpc-accept-encoding",
        b"grpc-message-type",
        b"connection",
        b"host",
    )
)
RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))


class CallError(Exception):
    """A call ends with this status before (or instead of) its handler's reply."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


def prefixed(message: bytes) -> bytes:
    return PREFIX.pack(0, len(message)) + message


def unprefixed(body: bytes, max_bytes: int) -> list[bytes]:
    """The messages of a request body; CallError for a compressed or cut message, or one over `max_bytes`."""
    messages = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < 5:
            raise CallError(grpc.StatusCode.INTERNAL, "a message prefix cut short")
        compressed, size = PREFIX.unpack_from(body, pos)
        if compressed:
            raise CallError(
                grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not supported (grpc-encoding identity only)"
            )
        if size > max_bytes:
            raise too_large(size, max_bytes)
        if end - pos - 5 < size:
            raise CallError(grpc.StatusCode.INTERNAL, "a message cut short")
        messages.append(body[pos + 5 : pos + 5 + size])
        pos += 5 + size
    return messages


def too_large(size: int, max_bytes: int) -> CallError:
    """grpcio's own words for a message over grpc.max_receive_message_length."""
    return CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {max_bytes})")


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout's seconds; None for a value that is not one (the call then has no deadline)."""
    text = value.decode("ascii", "replace")
    if not 2 <= len(text) <= 9 or not text[:-1].isdigit() or text[-1] not in TIMEOUT_UNITS:
        return None
    return int(text[:-1]) * TIMEOUT_UNITS[text[-1]]


def metadata_of(headers: Sequence[tuple[bytes, bytes]]) -> tuple[tuple[str, object], ...]:
    """The call's metadata as grpcio shows it: (key, str value), binary `-bin` keys with bytes values."""
    metadata = []
    for name, value in headers:
        if name[:1] == b":" or name in _RESERVED:
            continue
        key = name.decode("ascii", "replace")
        if key.endswith("-bin"):
            try:
                metadata.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                continue
        else:
            metadata.append((key, value.decode("latin-1")))
    return tuple(metadata)


MAX_DETAILS = 4096  # characters of grpc-message: a reply's trailers fit one HEADERS frame


def _percent_encoded(details: str) -> bytes:
    raw = details[:MAX_DETAILS].encode("utf-8", "replace")
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in raw):
        return raw
    return b"".join(bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte for byte in raw)


def trailers(code: grpc.StatusCode, details: str, metadata: Sequence[tuple[str, object]] = ()) -> list[tuple]:
    """The trailing header fields of a call's end: grpc-status, grpc-message and the trailing metadata."""
    fields = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        fields.append((b"grpc-message", _percent_encoded(details)))
    for key, value in metadata:
        name = key.lower().encode("ascii")
        if name.endswith(b"-bin"):
            fields.append((name, base64.b64encode(value if isinstance(value, bytes) else value.encode()).rstrip(b"=")))
        else:
            fields.append((name, value.encode("latin-1") if isinstance(value, str) else value))
    return fields
