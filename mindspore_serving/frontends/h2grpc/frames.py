"""HTTP/2 framing (RFC 9113) as the gRPC server needs it: frame types, flags, settings, building frames and cutting
a byte stream into them. Pure: no I/O."""

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# settings identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    range(1, 7)
)

# error codes
(
    NO_ERROR,
    PROTOCOL_ERROR,
    INTERNAL_ERROR,
    FLOW_CONTROL_ERROR,
    SETTINGS_TIMEOUT,
    STREAM_CLOSED,
    FRAME_SIZE_ERROR,
    REFUSED_STREAM,
    CANCEL,
    COMPRESSION_ERROR,
    CONNECT_ERROR,
    ENHANCE_YOUR_CALM,
) = range(12)

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1

_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


class ConnectionError_(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY(code)."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return bytes((size >> 16, (size >> 8) & 0xFF, size & 0xFF, kind, flags)) + _U32.pack(stream_id) + payload


def settings(values: list[tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in values))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS payload is not a multiple of 6")
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def u32(payload: bytes) -> int:
    if len(payload) != 4:
        raise ConnectionError_(FRAME_SIZE_ERROR, "a 4-byte payload expected")
    return _U32.unpack(payload)[0]


def cut(buffer: bytes, max_frame: int) -> tuple[list[tuple[int, int, int, bytes]], bytes]:
    """The whole frames at the start of `buffer` as (type, flags, stream id, payload), and the rest."""
    frames = []
    pos, end = 0, len(buffer)
    while end - pos >= 9:
        size = (buffer[pos] << 16) | (buffer[pos + 1] << 8) | buffer[pos + 2]
        if size > max_frame:
            raise ConnectionError_(FRAME_SIZE_ERROR, f"a frame of {size} bytes, over SETTINGS_MAX_FRAME_SIZE")
        if end - pos < 9 + size:
            break
        stream_id = _U32.unpack_from(buffer, pos + 5)[0] & 0x7FFFFFFF
        frames.append((buffer[pos + 3], buffer[pos + 4], stream_id, buffer[pos + 9 : pos + 9 + size]))
        pos += 9 + size
    return frames, buffer[pos:]


def unpad(flags: int, payload: bytes, priority: bool = False) -> bytes:
    """The payload of a DATA or HEADERS frame without its padding (and, for HEADERS, its priority fields)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise ConnectionError_(PROTOCOL_ERROR, "a padded frame without its pad length")
        end -= payload[0]
        start = 1
    if priority and flags & PRIORITY_FLAG:
        start += 5
    if end < start:
        raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[start:end]


def first_frame_is_settings(buffer: bytes) -> bool | None:
    """After the preface a client's first frame must be SETTINGS: None until its header has arrived."""
    return None if len(buffer) < 9 else buffer[3] == SETTINGS
