"""The listening gRPC server: the part of grpc.aio.Server's interface the front end uses (handlers, ports, start,
stop with grace), with the limits grpcio offers (message size, calls at once, streams per connection), an
authorization hook in place of an interceptor, and what one client may hold of it: open connections, request
bodies held per connection, the time to a connection's first call and between a body's reads, idle connections
(connection.py applies them)."""

import asyncio
import os
import socket
import ssl
import stat
from collections import namedtuple
from collections.abc import Callable

from mindspore_serving import log
from mindspore_serving.frontends.h2grpc.connection import Connection

BACKLOG = 1024
_CallDetails = namedtuple("_CallDetails", ("method", "invocation_metadata"))


def ssl_context(certificate: str, private_key: str, custom_ca: str | None, verify_client: bool) -> ssl.SSLContext:
    """TLS for the port, HTTP/2 by ALPN; with `verify_client` clients need a certificate signed by `custom_ca`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate, private_key)
    if verify_client:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(custom_ca)
    context.set_alpn_protocols(["h2"])
    return context


class Server:
    """`read_timeout`: seconds a connection may take to its first call's HEADERS, and a request body between two
    reads; `idle_timeout`: seconds a connection may stay without a stream open (None: no limit);
    `max_connections`: connections open at once, beyond which a connection's calls are refused
    (RESOURCE_EXHAUSTED, health checks still answered) and it is closed after them; `max_buffered_bytes`: request
    bodies one connection may hold before their calls start (at least one whole message; default
    `buffered_bodies_limit`)."""

    def __init__(
        self,
        max_message_bytes: int,
        max_concurrent_rpcs: int | None = None,
        max_streams_per_connection: int = 100,
        reuse_port: bool = False,
        authorize: Callable[[str, tuple], str | None] | None = None,
        read_timeout: float | None = None,
        idle_timeout: float | None = None,
        max_connections: int | None = None,
        max_buffered_bytes: int | None = None,
    ):
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_rpcs = max_concurrent_rpcs if max_concurrent_rpcs is not None else float("inf")
        self.max_streams_per_connection = max_streams_per_connection
        self.reuse_port = reuse_port
        self._authorize = authorize
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.timer_period = min((t for t in (read_timeout, idle_timeout) if t), default=None)  # connections' timer
        self.max_connections = max_connections if max_connections is not None else float("inf")
        self.max_buffered_bytes = (
            buffered_bodies_limit(max_message_bytes) if max_buffered_bytes is None else max_buffered_bytes
        )
        if self.max_buffered_bytes < max_message_bytes + 5:
            raise ValueError(
                f"max_buffered_bytes ({self.max_buffered_bytes}) must hold one whole message "
                f"(max_message_bytes {max_message_bytes} + 5)"
            )
        self._full_noted = False  # a connection beyond max_connections was logged, and none closed since
        self._generic: list = []
        self._methods: dict[str, object] = {}
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._listeners: list[asyncio.AbstractServer] = []
        self.connections = set()
        self.active_calls = 0
        self.stopping = False
        self._idle: asyncio.Event | None = None

    # ---- handlers (what the generated add_*Servicer_to_server functions call) ----
    def add_generic_rpc_handlers(self, handlers):
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict):
        for name, handler in handlers.items():
            self._methods.setdefault(f"/{service}/{name}", handler)

    def handler(self, path: str, metadata):
        handler = self._methods.get(path)
        if handler is not None:
            return handler
        details = _CallDetails(path, metadata)
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    def authorize(self, path: str, metadata) -> str | None:
        """None when the call may run, else the UNAUTHENTICATED details."""
        return None if self._authorize is None else self._authorize(path, metadata)

    # ---- ports ----
    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, context: ssl.SSLContext) -> int:
        return self._bind(address, context)

    def _bind(self, address: str, context: ssl.SSLContext | None) -> int:
        if address.startswith("unix:"):
            path = address[len("unix:") :]
            path = path[2:] if path.startswith("///") else path
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                if os.path.exists(path) and stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)  # a socket left by a process that is gone, as grpcio does
                sock.bind(path)
                sock.listen(BACKLOG)
            except OSError as err:
                sock.close()
                raise RuntimeError(f"Failed to bind to address {address}: {err.strerror}") from None
            self._sockets.append((sock, context))
            return 1
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (OSError, ValueError) as err:
            raise RuntimeError(f"Failed to bind to address {address}: {err}") from None
        bound_port = 0
        for family, kind, proto, _, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6 and len(infos) > 1:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((sockaddr[0], bound_port or sockaddr[1], *sockaddr[2:]))
                sock.listen(BACKLOG)
            except OSError as err:
                sock.close()
                if bound_port:
                    continue  # one address of several (localhost's ::1 where IPv6 is off)
                raise RuntimeError(f"Failed to bind to address {address}: {err.strerror}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            bound_port = bound_port or sock.getsockname()[1]
            self._sockets.append((sock, context))
        return bound_port

    # ---- life ----
    async def start(self):
        loop = asyncio.get_running_loop()
        for sock, context in self._sockets:
            # a TLS handshake counts against read_timeout too (the connection starts once it is done)
            tls = {} if context is None else {"ssl": context, "ssl_handshake_timeout": self.read_timeout}
            if sock.family == socket.AF_UNIX:
                listener = await loop.create_unix_server(lambda: Connection(self), sock=sock, **tls)
            else:
                listener = await loop.create_server(lambda: Connection(self), sock=sock, **tls)
            self._listeners.append(listener)

    def note_over_limit(self):
        """A connection opened beyond max_connections: logged once until connections close."""
        if not self._full_noted:
            self._full_noted = True
            log.warning(
                f"gRPC server: {len(self.connections)} connections open, the limit (--max_connections): "
                f"the calls of further connections are refused"
            )

    def connection_closed(self, connection: Connection):
        self.connections.discard(connection)
        if len(self.connections) < self.max_connections:
            self._full_noted = False

    def connection_idle(self, connection: Connection):
        connection.close()
        if self._idle is not None and not any(c.streams for c in self.connections):
            self._idle.set()

    async def stop(self, grace: float | None):
        """Closes the ports and tells every connection to go away; calls running may finish within `grace`
        seconds (None or 0: none), the rest end with UNAVAILABLE."""
        self.stopping = True
        for listener in self._listeners:
            listener.close()
        self._idle = asyncio.Event()
        for connection in list(self.connections):
            connection.go_away()
            if not connection.streams:
                connection.close()
        if grace and any(c.streams for c in self.connections):
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except TimeoutError:
                pass
        for connection in list(self.connections):
            connection.abort_calls()
            connection.close()
        for listener in self._listeners:
            await listener.wait_closed()
        self._listeners = []


def buffered_bodies_limit(max_message_bytes: int) -> int:
    """The request bodies one connection may hold by default: two whole messages, at least 64 MiB (calls of
    small messages multiplexed on one connection)."""
    return max(2 * (max_message_bytes + 5), 64 << 20)
