"""The servicer context of one call: what grpc.aio's ServicerContext offers our servicers (abort, deadline,
metadata both ways, peer), with grpc.aio's own AbortError, so handlers behave as they do under grpcio."""

import time
from collections.abc import Sequence

import grpc


class ServicerContext:
    __slots__ = ("_metadata", "_deadline", "_peer", "trailing", "code", "details")

    def __init__(self, metadata: tuple[tuple[str, object], ...], timeout: float | None, peer: str):
        self._metadata = metadata
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._peer = peer
        self.trailing: Sequence[tuple[str, object]] = ()
        self.code: grpc.StatusCode | None = None  # set by abort or set_code
        self.details = ""

    def invocation_metadata(self):
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing = tuple(metadata)

    def trailing_metadata(self):
        return self.trailing

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        if code is grpc.StatusCode.OK:
            raise ValueError("abort with grpc.StatusCode.OK")
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        self.code, self.details = code, details
        raise grpc.aio.AbortError()
