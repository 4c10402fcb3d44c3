"""The master <-> worker boundary (internal.proto): protocol version, socket paths, channel options."""
import hmac
import os
import secrets
import stat
import sys
from typing import Optional

import grpc

PROTOCOL_VERSION = 1
SOCKET_DIR = "unix_socket_files"
MAX_INTERNAL_MSG_BYTES = 512 * 1024 * 1024
INTERNAL_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_INTERNAL_MSG_BYTES),
    ("grpc.max_receive_message_length", MAX_INTERNAL_MSG_BYTES),
]
_MAX_NAME = 90


class WorkerConnectionError(ConnectionError):
    """A worker's Predict socket (predict_socket.py) cannot be reached, or closed before the reply (the worker
    stopped or died), or the call ran out of time."""


# what a master's call to a worker raises when the worker is gone (UsageError: its channel is already closed)
CONNECTION_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, WorkerConnectionError)


def _short(address: str) -> str:
    """Unix socket paths are limited: an address over 90 characters keeps its first and last 40, joined by '___'
    (as MindSpore Serving's workers shorten theirs)."""
    return address if len(address) <= _MAX_NAME else address[:40] + "___" + address[-40:]


def private_directory(path: str) -> str:
    """`path`, a directory only this user can enter (0700): made so, or created so. Refused when it is a link or
    not a directory, or belongs to another user (who could then read, replace or bind its sockets)."""
    try:
        os.mkdir(path, stat.S_IRWXU)
    except FileExistsError:
        pass
    info = os.lstat(path)
    where = os.path.abspath(path)
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeError(f"Serving Error: the socket directory {where} is not a directory (a link or a file); "
                           f"remove it, or start the server in another working directory")
    if info.st_uid != os.geteuid():
        raise RuntimeError(f"Serving Error: the socket directory {where} belongs to another user (uid "
                           f"{info.st_uid}); remove it, or start the server in another working directory")
    if stat.S_IMODE(info.st_mode) != stat.S_IRWXU:
        os.chmod(path, stat.S_IRWXU)
    return path


def socket_address(name: str) -> str:
    """A unix socket address in SOCKET_DIR, which only this user can enter (private_directory)."""
    private_directory(SOCKET_DIR)
    # relative to the working directory that the master and its workers share: unix socket paths are short-lived
    # and limited to about 100 characters
    return _short(f"unix:{SOCKET_DIR}/{name}")


def restrict_socket(address: str) -> None:
    """Makes a bound unix socket owner-only (0600); its directory already keeps other users out."""
    if address.startswith("unix:"):
        os.chmod(socket_path(address), stat.S_IRUSR | stat.S_IWUSR)


def socket_path(address: str) -> str:
    """The file of a `unix:` address (any other address as it is)."""
    return address[len("unix:"):] if address.startswith("unix:") else address


def predict_address(grpc_address: str) -> str:
    """Where a worker answers the master's Predict calls (predict_socket.py): beside its gRPC socket (a shortened
    address stays within the unix socket path limit with the suffix)."""
    return grpc_address + ".predict"


def master_address() -> str:
    return socket_address(f"serving_master_{os.getpid()}")


def worker_address(servable_name: str, device_label: str) -> str:
    return socket_address(f"serving_worker_{servable_name}_{device_label}_{os.getpid()}")


# ---- who is calling: the master hands each child it starts a secret of its own, through the child's stdin (never
# on the command line); the child sends it, with its key, on every call to the master, which refuses any other.

PEER_KEY = "ms-serving-peer"        # metadata: the caller's key (a worker key, or "frontend/<index>")
PEER_SECRET = "ms-serving-secret"   # metadata: the secret the master gave that child


def new_secret() -> str:
    return secrets.token_hex(32)


def read_secret(stream=None) -> str:
    """The secret of this child: the first line of its stdin ("" when it was given none)."""
    return ((stream or sys.stdin).readline() or "").strip()


def peer_metadata(key: str, secret: str) -> tuple:
    return ((PEER_KEY, key), (PEER_SECRET, secret))


def peer_of(metadata, secret_of) -> Optional[str]:
    """The key of the child that made a call, when its metadata carry the secret `secret_of(key)` (None: a key the
    master did not start); None for any other caller."""
    values = {name: value for name, value in metadata or ()}
    key, given = values.get(PEER_KEY), values.get(PEER_SECRET)
    if not key or not given:
        return None
    expected = secret_of(key)
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        return None
    return key


class _PeerCredentials(grpc.UnaryUnaryClientInterceptor):
    """Adds the child's key and secret to each unary call of a channel (sync gRPC)."""

    def __init__(self, key: str, secret: str):
        self.metadata = peer_metadata(key, secret)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(_Details(client_call_details, self.metadata), request)


class _Details(grpc.ClientCallDetails):  # pylint: disable=too-few-public-methods
    def __init__(self, details, metadata):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = tuple(details.metadata or ()) + metadata
        self.credentials = details.credentials
        self.wait_for_ready = details.wait_for_ready
        self.compression = details.compression


def master_channel(master_address: str, key: str, secret: str) -> grpc.Channel:
    """A channel to the master whose calls say which child makes them (sync gRPC)."""
    channel = grpc.insecure_channel(master_address, options=INTERNAL_CHANNEL_OPTIONS)
    return grpc.intercept_channel(channel, _PeerCredentials(key, secret))


def remove_socket(address: str):
    if address.startswith("unix:"):
        try:
            os.unlink(socket_path(address))
        except FileNotFoundError:
            pass
