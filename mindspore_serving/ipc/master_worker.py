"""The master <-> worker boundary (internal.proto): protocol version, socket paths, channel options."""
import os

PROTOCOL_VERSION = 1
SOCKET_DIR = "unix_socket_files"
MAX_INTERNAL_MSG_BYTES = 512 * 1024 * 1024
INTERNAL_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_INTERNAL_MSG_BYTES),
    ("grpc.max_receive_message_length", MAX_INTERNAL_MSG_BYTES),
]
_MAX_NAME = 90


def _short(name: str) -> str:
    """Unix socket paths are limited: long names keep their first and last 40 characters."""
    return name if len(name) <= _MAX_NAME else name[:40] + "___" + name[-40:]


def socket_address(name: str) -> str:
    os.makedirs(SOCKET_DIR, exist_ok=True)
    # relative to the working directory that the master and its workers share: unix socket paths are short-lived
    # and limited to about 100 characters
    return "unix:" + os.path.join(SOCKET_DIR, _short(name))


def master_address() -> str:
    return socket_address(f"serving_master_{os.getpid()}")


def worker_address(servable_name: str, device_label: str) -> str:
    return socket_address(f"serving_worker_{servable_name}_{device_label}_{os.getpid()}")


def remove_socket(address: str):
    if address.startswith("unix:"):
        try:
            os.unlink(address[len("unix:"):])
        except FileNotFoundError:
            pass
