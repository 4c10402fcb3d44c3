"""The master's Predict calls to a worker over a plain unix socket: both ends of that wire.

A call through the worker's gRPC server costs ~0.5 ms and ~0.6 ms of CPU on this path (the master's grpc.aio
poller thread, then the worker's poller and pool threads), against ~0.06 ms and ~0.07 ms for the same bytes framed
on a socket. So `WorkerPredictRequest`/`WorkerPredictReply` (internal.proto) travel here as frames: a 4-byte
little-endian length, then the serialized message. Every other worker call (heartbeat, metrics, exit, model calls)
stays on gRPC.

A connection carries one call at a time. The master keeps idle connections for reuse and opens another when all
are busy (a worker has at most a few calls in flight); the worker answers each connection on a thread of its own.
A call that fails, times out or is cancelled closes its connection: a late reply can never answer the next call.

Having answered, a connection's thread polls for the next frame for up to `spin_s` seconds before it blocks,
when no other call is being answered (then spinning would only take the GIL from it). Waking a thread blocked on a
socket costs ~100 us on a small virtual machine (an idle vCPU, then cold caches), which a client that sends its
next request at once pays on every call. Measured with `add` (medians of three alternating rounds, 2 cores): at
one client p50 0.397 ms without, 0.320 ms with 300 us and 0.312 ms with 600 us; at 8 clients 6.7k, 7.9k and 8.2k
requests/s; at 64 clients 11.4k, 11.0k and 11.3k (calls overlap there: hardly any polling). The price is the
worker's CPU between calls: at one client 187 against ~330 us per request. The worker's default is 500 us
(MS_SERVING_WORKER_SPIN_US).
"""

import asyncio
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from typing import cast

from mindspore_serving import log
from mindspore_serving.ipc.master_worker import (
    MAX_INTERNAL_MSG_BYTES,
    WorkerConnectionError,
    remove_socket,
    socket_path,
)
from mindspore_serving.proto import internal_pb2

HEADER = struct.Struct("<I")
_SMALL_FRAME = 64 * 1024  # header and payload in one write below this size; two writes (no copy) above


def frame_size(header: bytes | bytearray) -> int:
    size: int = HEADER.unpack(header)[0]
    if size > MAX_INTERNAL_MSG_BYTES:
        raise WorkerConnectionError(f"a frame of {size} bytes exceeds the limit of {MAX_INTERNAL_MSG_BYTES}")
    return size


def frame(payload: bytes) -> list[bytes]:
    """The parts to write for one frame: header and payload joined below _SMALL_FRAME, apart above it (no copy)."""
    header = HEADER.pack(len(payload))
    return [header + payload] if len(payload) < _SMALL_FRAME else [header, payload]


DEFAULT_SPIN_S = 0.0005


class PredictSocketServer:
    """The worker's end: answers each frame with `handle(request) -> reply` (internal_pb2 messages); an idle
    connection polls `spin_s` seconds for its next frame before it blocks (0: it blocks at once). It owns its
    socket file: one left by a killed process of the same pid is replaced, and `stop` removes it."""

    def __init__(self, address: str, handle: Callable, spin_s: float = 0.0) -> None:
        self.address = address
        self.path = socket_path(address)
        self.handle = handle
        self.spin_s = spin_s
        remove_socket(address)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        os.chmod(self.path, stat.S_IRUSR | stat.S_IWUSR)  # owner-only, as the gRPC sockets beside it
        self._listener.listen(64)
        self._lock = threading.Lock()
        self._connections: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._answering = 0  # calls being answered, on all connections
        self._acceptor = threading.Thread(target=self._accept, name="predict-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # the listener was closed: the worker is stopping
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                thread = threading.Thread(target=self._serve, args=(conn,), name="predict-conn", daemon=True)
                self._connections.append(conn)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        poller = None
        if self.spin_s > 0:
            poller = select.poll()
            poller.register(conn, select.POLLIN)
        try:
            while True:
                if poller is not None and not self._answering:
                    spin_until_readable(poller, self.spin_s)
                header = reader.read(HEADER.size)
                if len(header) < HEADER.size:
                    return  # the master closed the connection, or the worker is stopping
                payload = reader.read(frame_size(header))
                with self._lock:
                    self._answering += 1
                try:
                    request = internal_pb2.WorkerPredictRequest.FromString(payload)
                    for part in frame(self.handle(request).SerializeToString()):
                        conn.sendall(part)
                finally:
                    with self._lock:
                        self._answering -= 1
        except (OSError, WorkerConnectionError) as err:
            if not self._closed:
                log.warning(f"Predict connection from the master ended: {err}")
        except Exception:  # a frame that is not a request: the master sees the connection close
            log.exception("Predict connection from the master failed")
        finally:
            reader.close()
            conn.close()
            with self._lock:
                self._connections.remove(conn)
                self._threads.remove(threading.current_thread())

    def stop(self, grace: float) -> None:
        """No new connections or calls; calls being answered get up to `grace` seconds to send their replies."""
        with self._lock:
            self._closed = True
            connections, threads = list(self._connections), list(self._threads)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        remove_socket(self.address)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RD)  # the reader stops after the call it is answering
            except OSError:
                pass
        deadline = time.monotonic() + grace
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def spin_until_readable(poller: "select.poll", seconds: float) -> bool:
    """Polls without sleeping until the polled connection has data (or is closed) or `seconds` have passed;
    whether it has."""
    end = time.perf_counter() + seconds
    while not poller.poll(0):
        if time.perf_counter() >= end:
            return False
    return True


class _Connection(asyncio.Protocol):
    """One connection of the master's end: a call at a time, its reply read as it arrives."""

    def __init__(self, on_lost: Callable) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.lost: str | None = None
        self.on_lost = on_lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a unix stream connection's

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) < HEADER.size:
            return
        try:
            end = HEADER.size + frame_size(self.buffer[: HEADER.size])
        except WorkerConnectionError as err:
            self._fail(str(err))
            self.close()
            return
        if len(self.buffer) < end:
            return
        payload = bytes(self.buffer[HEADER.size : end])
        del self.buffer[:end]
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"the worker closed the connection{f': {exc}' if exc else ''}")
        self.on_lost(self)

    def _fail(self, reason: str) -> None:
        self.lost = self.lost or reason
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(WorkerConnectionError(reason))

    def send(self, payload: bytes) -> "asyncio.Future":
        """Writes the request now; the future gets the reply's bytes."""
        self.waiter = asyncio.get_running_loop().create_future()
        if self.lost is not None:
            self.waiter.set_exception(WorkerConnectionError(self.lost))
        else:
            assert self.transport is not None  # connected before it is given out
            self.transport.writelines(frame(payload))
        return self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class PredictChannel:
    """The master's end for one worker: `await call(request, timeout)` returns its WorkerPredictReply or raises
    WorkerConnectionError (the worker is gone or stopping, or the call ran out of time)."""

    def __init__(self, address: str) -> None:
        self.path = socket_path(address)
        self._idle: list[_Connection] = []
        self._closed = False

    async def _connect(self) -> _Connection:
        if self._closed:
            raise WorkerConnectionError("the master closed its connections to this worker")
        try:
            _, conn = await asyncio.get_running_loop().create_unix_connection(
                lambda: _Connection(self._forget), self.path
            )
        except OSError as err:
            raise WorkerConnectionError(f"cannot connect to {self.path}: {err}") from None
        return conn

    def _forget(self, conn: _Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def begin(
        self, request: internal_pb2.WorkerPredictRequest, timeout: float | None = None
    ) -> Awaitable[internal_pb2.WorkerPredictReply]:
        """The call of `call`, its request written at once when a connection is idle (a caller that has other work
        for this event-loop turn sends first and awaits later); otherwise written once connected, on await."""
        if not self._idle:
            return self.call(request, timeout)
        conn = self._idle.pop()
        return self._reply(conn, conn.send(request.SerializeToString()), timeout)

    async def call(
        self, request: internal_pb2.WorkerPredictRequest, timeout: float | None = None
    ) -> internal_pb2.WorkerPredictReply:
        conn = self._idle.pop() if self._idle else await self._connect()
        return await self._reply(conn, conn.send(request.SerializeToString()), timeout)

    async def _reply(
        self, conn: _Connection, sent: "asyncio.Future[bytes]", timeout: float | None
    ) -> internal_pb2.WorkerPredictReply:
        try:
            async with asyncio.timeout(timeout):
                payload = await sent
        except TimeoutError:
            conn.close()
            raise WorkerConnectionError(f"no reply within {timeout:g} s") from None
        except BaseException:
            conn.close()
            raise
        if self._closed or conn.lost is not None:
            conn.close()
        else:
            self._idle.append(conn)
        return internal_pb2.WorkerPredictReply.FromString(payload)

    def close(self) -> None:
        """Closes the idle connections; those of calls in flight close when their calls end."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
