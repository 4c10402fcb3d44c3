"""Request ids: each call a front end answers has one, the client's own `x-request-id` when it sent a usable one
(HTTP header or gRPC metadata), a new one otherwise. The reply carries it back (HTTP header, gRPC trailing
metadata) and the front end's log lines about the call end with it, so a client's error can be found in the log."""

import os
import re
from collections.abc import Iterable

from mindspore_serving import log

HEADER = "x-request-id"
_HEADER_BYTES = HEADER.encode()
_USABLE = re.compile(r"[A-Za-z0-9._:@+/=-]{1,128}\Z")  # printable, no spaces: safe in headers and log lines


def request_id_of(given: bytes | str | None) -> str:
    """`given` when it is a usable id, else a new one."""
    if isinstance(given, bytes):
        given = given.decode("latin-1")
    if given is not None and _USABLE.match(given):
        return given
    return os.urandom(16).hex()  # as random as uuid4's 32 hex digits, without building a UUID


def from_http(headers: Iterable[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() == _HEADER_BYTES:
            return request_id_of(value)
    return request_id_of(None)


def with_request_id(send, request_id: str):
    """An ASGI `send` that adds the `x-request-id` header to the reply."""
    header = (_HEADER_BYTES, request_id.encode())

    async def sending(message):
        if message["type"] == "http.response.start":  # each message is built for this reply: added in place
            message["headers"] = [*message.get("headers", ()), header]
        await send(message)

    return sending


def bind_grpc(context) -> str:
    """The call's id (from its metadata), set as trailing metadata of the reply (an abort keeps it) and bound
    to the log lines of this call's task."""
    given: str | None = None
    for key, value in context.invocation_metadata() or ():
        if key == HEADER:
            given = value
    request_id = request_id_of(given)
    context.set_trailing_metadata(((HEADER, request_id),))
    log.bind_request_id(request_id)  # the call's own task: ends with it
    return request_id
