"""startup_agents' checks and rank selection (pure logic, MindSpore Serving's texts)."""

import os
import socket
from collections.abc import Callable, Sequence

from mindspore_serving.common import check_type

DEC_MODES = ("AES-GCM", "AES-CBC")


def check_startup_args(
    distributed_address, model_files, group_config_files, agent_start_port, dec_key, dec_mode
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """The parameters of startup_agents; returns model_files (and group_config_files) as tuples."""
    check_type.check_str("distributed_address", distributed_address)
    check_type.check_int("agent_start_port", agent_start_port, 1, 65535 - 7)
    model_files = _file_tuple("model_files", model_files)
    if group_config_files is not None:
        group_config_files = _file_tuple("group_config_files", group_config_files)
    if dec_key is not None:
        if not isinstance(dec_key, bytes):
            raise RuntimeError(f"Parameter 'dec_key' should be bytes, but actually {type(dec_key)}")
        if not dec_key:
            raise RuntimeError("Parameter 'dec_key' should not be empty bytes")
        if len(dec_key) not in (16, 24, 32):
            raise RuntimeError(f"Parameter 'dec_key' length {len(dec_key)} expected to be 16, 24 or 32")
    check_type.check_str("dec_mode", dec_mode)
    if dec_mode not in DEC_MODES:
        raise RuntimeError("Parameter 'dec_mode' expected to be 'AES-GCM' or 'AES-CBC'")
    return model_files, group_config_files


def _file_tuple(name: str, files) -> tuple[str, ...]:
    if isinstance(files, (list, tuple)) and any(isinstance(item, (list, tuple)) for item in files):
        raise RuntimeError(f"Parameter '{name}' with several graphs per rank is not supported, give one file per rank")
    return check_type.check_and_as_str_tuple_list(name, files)


def can_bind(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
            return True
        except OSError:
            return False


def select_local_ranks(
    rank_ips: Sequence[str],
    agent_ip,
    rank_start,
    agent_start_port: int,
    bindable: Callable[[str, int], bool] = can_bind,
) -> tuple[str, list[int]]:
    """(this machine's ip, the rank ids it runs). Without agent_ip the ip is the first rank table ip (in rank
    order) that this machine can bind; with agent_ip and rank_start, the ranks are those on rank_start's machine."""
    if agent_ip is None:
        if rank_start is not None:
            raise RuntimeError(
                "Parameter 'agent_ip' and parameter 'rank_start' must have values at the same time, "
                "or both None at the same time."
            )
        ips = list(dict.fromkeys(rank_ips))
        local_ip = next((ip for ip in ips if bindable(ip, agent_start_port)), None)
        if local_ip is None:
            raise RuntimeError(f"Get local machine ip failed, rank table ips: {set(ips)}, bind port {agent_start_port}")
        return local_ip, [rank for rank, ip in enumerate(rank_ips) if ip == local_ip]
    if rank_start is None:
        raise RuntimeError(
            "Parameter 'agent_ip' and parameter 'rank_start' must have values at the same time, "
            "or both None at the same time."
        )
    check_type.check_str("agent_ip", agent_ip)
    check_type.check_int("rank_start", rank_start, 0)
    if rank_start >= len(rank_ips):
        raise RuntimeError(f"Parameter 'rank_start' cannot equal or larger than rank size {len(rank_ips)}.")
    if not any(bindable(agent_ip, agent_start_port + i) for i in range(8)):
        raise RuntimeError(f"Check ip 'agent_ip' valid failed, agent_ip: {agent_ip}")
    table_ip = rank_ips[rank_start]
    return agent_ip, [rank for rank, ip in enumerate(rank_ips) if ip == table_ip]


def resolve_model_files(model_files: Sequence[str], local_ranks: Sequence[int], base_dir: str) -> list[str]:
    """One readable file per local rank, made absolute against `base_dir` (the running script's directory)."""
    if len(local_ranks) != len(model_files):
        raise RuntimeError(
            f"Card count {list(local_ranks)} described rank table does not equal to model files size "
            f"{len(model_files)}, model files: {tuple(model_files)}"
        )
    paths = []
    for name in model_files:
        path = os.path.realpath(os.path.join(base_dir, name))
        if not os.access(path, os.R_OK):
            raise RuntimeError(f"Cannot access model file '{path}'")
        paths.append(path)
    return paths
