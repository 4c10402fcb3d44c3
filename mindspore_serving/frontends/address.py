"""Checks of front-end listening addresses, with MindSpore Serving's messages."""

import os


def check_address(address: str, server_tag: str):
    """`ip:port` (split at the last ':'); raises RuntimeError("Serving Error: ...") otherwise.

    `server_tag` is "Serving gRPC" or "RESTful server" as it appears in the messages."""
    if not isinstance(address, str):
        raise RuntimeError(f"Parameter 'address' should be str, but actually {type(address)}")
    if ":" not in address:
        raise RuntimeError(f"Serving Error: The format of the {server_tag} address '{address}' is illegal")
    ip, port = address.rsplit(":", 1)
    if not ip or not port:
        raise RuntimeError(f"Serving Error: Missing ip or port of the {server_tag} address '{address}'")
    if not port.isdigit():
        raise RuntimeError(f"Serving Error: The type of {server_tag} address '{address}' port is not a number")
    if not 1 <= int(port) <= 65535:
        raise RuntimeError(
            f"Serving Error: The port of the {server_tag} address '{address}' is out of legal range [1 ~ 65535]"
        )
    return ip.strip("[]"), int(port)


def check_unix_address(address: str):
    path = address[len("unix:") :]
    if not path:
        raise RuntimeError("Serving Error: Empty grpc server unix domain socket address")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise RuntimeError(f"Serving Error: Serving gRPC server start failed, create server failed, address {address}")
    return path


def check_max_msg_mb_size(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuntimeError(f"Parameter 'max_msg_mb_size' should be int, but actually {type(value)}")
    if not 1 <= value <= 512:
        raise RuntimeError("Parameter 'max_msg_mb_size' should be in range [1,512]")
    return value
