"""Rank table parsing and the checks of a distributed servable's ranks (pure logic, MindSpore Serving's texts).

A rank table is either `{"server_list": [{"server_id": ip, "device": [{"device_id", "device_ip", "rank_id"}]}]}`
or `{"group_list": [{"instance_list": [{"server_id", "rank_id", "devices": [{"device_id", ...}]}]}]}`; ids are
strings of digits and rank ids must count up from 0 in file order.
"""

import json
from dataclasses import dataclass

CARDS_PER_MACHINE = 8


@dataclass(frozen=True)
class RankConfig:
    """One rank of the table: the machine (server_id) and the device on it."""

    ip: str
    device_id: int


def _array(obj, key: str) -> list:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def _string(obj, key: str) -> str:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


def _to_int(path: str, text: str, key: str) -> int:
    if not text.isdigit() or str(int(text)) != text:
        raise RuntimeError(f"{key}attr is invalid argument in{path}")
    return int(text)


def _one_rank(path: str, ip: str, device: dict, rank_holder: dict, expected_rank: int) -> RankConfig:
    device_text = _string(device, "device_id")
    if not device_text:
        raise RuntimeError(f"device_id attr is empty in{path}")
    device_id = _to_int(path, device_text, "device_id")
    rank_text = _string(rank_holder, "rank_id")
    if not rank_text:
        raise RuntimeError(f"rank_id attr is empty in{path}")
    if _to_int(path, rank_text, "rank_id") != expected_rank:
        raise RuntimeError(f"device size not match rank_id in{path}")
    return RankConfig(ip, device_id)


def _required(obj, name: str, get, path: str):
    """obj[name] read by `get` (_array or _string); RuntimeError when it is empty."""
    value = get(obj, name)
    if not value:
        raise RuntimeError(f"{name} attr is empty in{path}")
    return value


def parse_rank_table(content: str, path: str) -> list[RankConfig]:
    """The ranks of a rank table's text (`path` only names the file in errors); RuntimeError when invalid."""
    try:
        table = json.loads(content)
    except json.JSONDecodeError as err:
        raise RuntimeError(f"parse error:{err}") from None
    if not isinstance(table, dict):
        raise RuntimeError(f"{path} is not json object")
    ranks: list[RankConfig] = []
    if "group_list" in table:
        for group in _required(table, "group_list", _array, path):
            for instance in _required(group, "instance_list", _array, path):
                ip = _required(instance, "server_id", _string, path)
                devices = _required(instance, "devices", _array, path)
                ranks.append(_one_rank(path, ip, devices[0], instance, len(ranks)))
        return ranks
    for server in _required(table, "server_list", _array, path):
        ip = _required(server, "server_id", _string, path)
        devices = _required(server, "device", _array, path)
        for device in devices:
            ranks.append(_one_rank(path, ip, device, device, len(ranks)))
    return ranks


def read_rank_table(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read()
    except OSError:
        raise RuntimeError(f"failed to open rank table file：{path}") from None


def check_rank_config(ranks: list[RankConfig], rank_size: int, stage_size: int, path: str):
    """The rank table against the servable's declare_servable(rank_size, stage_size).

    MindSpore Serving's Ascend-only layout rules for stage_size > 1 (8 cards per machine, device id = position on
    the machine) are not applied: on CPU and GPU a rank may be any process."""
    if stage_size == 0 or rank_size == 0:
        raise RuntimeError(f"Rank size or stage size cannot be 0, rank size: {rank_size}, stage size: {stage_size}")
    if rank_size % stage_size != 0:
        raise RuntimeError(
            f"Rank size must be an integral multiple of stage size, rank size: {rank_size}, stage size: {stage_size}"
        )
    if len(ranks) != rank_size:
        raise RuntimeError(
            f"Rank size {len(ranks)} declared in rank table file '{path}' not equal to {rank_size} "
            f"declared in servable config"
        )
    if stage_size == 1:
        used: dict[str, set[int]] = {}
        for rank_id, rank in enumerate(ranks):
            devices = used.setdefault(rank.ip, set())
            if rank.device_id in devices:
                raise RuntimeError(
                    f"Check rank table config failed, device id repeatedly used by rank {rank_id} in "
                    f"device ip {rank.ip}"
                )
            if rank.device_id >= CARDS_PER_MACHINE:
                raise RuntimeError("Check rank table config failed, device id cannot larger than 8")
            devices.add(rank.device_id)


def stage_ranks(rank_size: int, stage_size: int) -> list[list[int]]:
    """The rank ids of each pipeline stage, in order: stage s holds ranks [s*k, (s+1)*k) with k = rank/stage."""
    per_stage = rank_size // stage_size
    return [list(range(s * per_stage, (s + 1) * per_stage)) for s in range(stage_size)]
