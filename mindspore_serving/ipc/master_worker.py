"""The master <-> worker boundary (internal.proto): protocol version, socket paths, channel options."""

import hmac
import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import grpc

PROTOCOL_VERSION = 1
SOCKET_DIR = "unix_socket_files"
"""Where each server makes its runtime directory (runtime_directory), relative to the working directory that the
master and its children share: unix socket paths are limited to 107 bytes."""
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


def _short(directory: str, name: str) -> str:
    """The address of socket `name` in `directory`. Unix socket paths are limited: an address over 90 characters
    keeps its directory and as much of the start and the end of its name as fits, joined by '___' (MindSpore
    Serving's workers shorten theirs so)."""
    address = f"unix:{directory}/{name}"
    if len(address) <= _MAX_NAME:
        return address
    keep = max(8, (_MAX_NAME - len(address) + len(name) - 3) // 2)
    return f"unix:{directory}/{name[:keep]}___{name[-keep:]}"


def private_directory(path: str, create: bool = True) -> str:
    """`path`, a directory only this user can enter (0700): created so (`create`), or made so. Refused when it is
    a link or not a directory, or belongs to another user (who could then read, replace or bind its files). The
    checks and the chmod are made on one descriptor, which cannot be swapped for another directory in between."""
    if create:
        try:
            os.mkdir(path, stat.S_IRWXU)
        except FileExistsError:
            pass
    where = os.path.abspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except NotADirectoryError:
        raise RuntimeError(
            f"Serving Error: {where} is not a directory (a link or a file); remove it, or start the "
            f"server in another working directory"
        ) from None
    except OSError as err:
        raise RuntimeError(f"Serving Error: cannot open the directory {where}: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise RuntimeError(
                f"Serving Error: the directory {where} belongs to another user (uid {info.st_uid}); "
                f"remove it, or start the server in another working directory"
            )
        if stat.S_IMODE(info.st_mode) != stat.S_IRWXU:
            os.fchmod(fd, stat.S_IRWXU)
    finally:
        os.close(fd)
    return path


def runtime_directory() -> str:
    """A new directory of one server's own for its sockets, in SOCKET_DIR (made private first): unique, 0700 and
    made atomically (tempfile.mkdtemp). Its name, `<master pid>_<8 random characters>`, is short and relative, as
    socket paths must be. Directories that servers killed before they could remove theirs left are removed."""
    private_directory(SOCKET_DIR)
    _remove_stale_directories()
    return os.path.relpath(tempfile.mkdtemp(prefix=f"{os.getpid()}_", dir=SOCKET_DIR))


def runtime_directory_of(master_address: str) -> str:
    """The runtime directory of the server whose master listens on `master_address` (its socket's directory),
    where the master's children make their sockets; refused unless it is this user's and private."""
    return private_directory(os.path.dirname(socket_path(master_address)), create=False)


def remove_runtime_directory(master_address: str) -> None:
    """Removes the master's runtime directory and what its processes left there (a killed worker's sockets)."""
    shutil.rmtree(os.path.dirname(socket_path(master_address)), ignore_errors=True)


def _remove_stale_directories() -> None:
    """Removes the runtime directories of SOCKET_DIR whose master is not running and where no socket answers."""
    for entry in os.scandir(SOCKET_DIR):
        pid, separator, _ = entry.name.partition("_")
        if not separator or not pid.isdigit() or not entry.is_dir(follow_symlinks=False) or _running(int(pid)):
            continue
        try:
            sockets = [os.path.join(entry.path, name) for name in os.listdir(entry.path)]
        except OSError:
            continue
        if not any(_answers(path) for path in sockets):
            shutil.rmtree(entry.path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: running
        return True
    return True


def _answers(path: str) -> bool:
    """Whether a unix socket at `path` accepts a connection (a server in another pid namespace may use it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def socket_address(directory: str, name: str) -> str:
    """The address of unix socket `name` in a server's runtime directory (runtime_directory)."""
    return _short(directory, name)


def restrict_socket(address: str) -> None:
    """Makes a bound unix socket owner-only (0600); its directory already keeps other users out."""
    if address.startswith("unix:"):
        os.chmod(socket_path(address), stat.S_IRUSR | stat.S_IWUSR)


def socket_path(address: str) -> str:
    """The file of a `unix:` address (any other address as it is)."""
    return address[len("unix:") :] if address.startswith("unix:") else address


def predict_address(grpc_address: str) -> str:
    """Where a worker answers the master's Predict calls (predict_socket.py): beside its gRPC socket (a shortened
    address stays within the unix socket path limit with the suffix)."""
    return grpc_address + ".predict"


def master_address() -> str:
    """The master's socket, in a new runtime directory of its own (runtime_directory)."""
    return socket_address(runtime_directory(), f"serving_master_{os.getpid()}")


def worker_address(directory: str, servable_name: str, device_label: str) -> str:
    return socket_address(directory, f"serving_worker_{servable_name}_{device_label}_{os.getpid()}")


# ---- who is calling: the master hands each child it starts a secret of its own, through the child's stdin (never
# on the command line); the child sends it, with its key, on every call to the master, which refuses any other.

PEER_KEY = "ms-serving-peer"  # metadata: the caller's key (a worker key, or "frontend/<index>")
PEER_SECRET = "ms-serving-secret"  # metadata: the secret the master gave that child


def new_secret() -> str:
    return secrets.token_hex(32)


def read_secret(stream: TextIO | None = None) -> str:
    """The secret of this child: the first line of its stdin ("" when it was given none)."""
    return ((stream or sys.stdin).readline() or "").strip()


def peer_metadata(key: str, secret: str) -> tuple[tuple[str, str], ...]:
    return ((PEER_KEY, key), (PEER_SECRET, secret))


def peer_of(metadata: Iterable[tuple[str, str]] | None, secret_of: Callable[[str], str | None]) -> str | None:
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

    def __init__(self, key: str, secret: str) -> None:
        self.metadata = peer_metadata(key, secret)

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: grpc.ClientCallDetails, request: object
    ) -> Any:
        return continuation(_Details(client_call_details, self.metadata), request)


class _Details(grpc.ClientCallDetails):  # pylint: disable=too-few-public-methods
    def __init__(self, details: grpc.ClientCallDetails, metadata: tuple[tuple[str, str], ...]) -> None:
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


def remove_socket(address: str) -> None:
    if address.startswith("unix:"):
        try:
            os.unlink(socket_path(address))
        except FileNotFoundError:
            pass
