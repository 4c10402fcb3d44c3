"""Small socket facts the processes need about each other's ports."""

import socket


def accepts_connections(host: str, port: int, timeout: float) -> bool:
    """Something listens on host:port now (a refused connection answers at once; a silent host takes `timeout`)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
