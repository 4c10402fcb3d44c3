"""The KV cache's size where it needs the machine: the memory a fraction budget takes (measured once by whoever
starts the agents, so that every rank it starts gets the same number of blocks) and what the cache holds, for the
worker's log and /metrics. The arithmetic is llm/kv_budget.py's.

engine.kv_cache_memory_fraction is measured on a CPU host only: MemAvailable from /proc/meminfo, less the weights
of the ranks started there (the bytes of their graph directories: today every graph embeds its weights, and a
weights file beside small graphs counts the same), split between those ranks. MindSpore offers no reliable query
of a device's free memory (mindspore.hal.get_device_properties has no free memory on GPU and needs an initialised
Ascend device), so on GPU and Ascend the fraction is refused in favour of engine.kv_cache_memory.
"""

import os
from collections.abc import Sequence

from mindspore_serving import log
from mindspore_serving.common.ms_device import resolve_device
from mindspore_serving.llm.kv_budget import (
    FRACTION,
    MIB,
    CacheGeometry,
    KvBudgetError,
    KvCacheCapacity,
    fraction_budget,
    step_working_bytes,
)
from mindspore_serving.spec.llm_config import read_manifest

MEMINFO = "/proc/meminfo"


def mem_available(meminfo_text: str) -> int:
    """Bytes of MemAvailable in the text of /proc/meminfo."""
    for line in meminfo_text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "MemAvailable":
            fields = rest.split()
            return int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    raise ValueError("/proc/meminfo has no MemAvailable line")


def host_available_bytes(path: str = MEMINFO) -> int:
    with open(path, encoding="ascii") as stream:
        return mem_available(stream.read())


def weight_bytes(graphs_dir: str) -> int:
    """What loading a rank's graphs takes beside its KV cache: the bytes of the files of its graph directory."""
    total = 0
    for entry in os.scandir(graphs_dir):
        if entry.is_file():
            total += entry.stat().st_size
    return total


def _graphs_of(config, rank: int) -> str:
    graphs = config.model.graphs
    return graphs[rank] if len(graphs) > 1 else graphs[0]


def measured_num_blocks(config, ranks: Sequence[int], available: int | None = None) -> int | None:
    """The blocks per rank of engine.kv_cache_memory_fraction for the agents of `ranks` started on this host (None
    for the other ways of sizing the cache, which every process reads from the configuration alike).
    `available`: the host's available bytes (default: measured now). Raises RuntimeError with the reason when
    the memory cannot be measured or holds too little."""
    budget = config.kv_cache
    if budget.kind != FRACTION:
        return None
    device = config.agents.device_type
    if device is None or device.lower() == "none":
        device = resolve_device(None)
    if device.upper() != "CPU":
        raise RuntimeError(
            f"engine.{FRACTION} is measured on CPU hosts only; the agents run on {device}, whose free "
            f"memory MindSpore does not report: give engine.kv_cache_memory (bytes per rank, e.g. "
            f"'2GiB') instead"
        )
    ranks = list(ranks)
    try:
        manifest = read_manifest(_graphs_of(config, ranks[0]))
        if manifest is None:
            raise RuntimeError(f"engine.{FRACTION}: the graphs of rank {ranks[0]} are not exported (no manifest)")
        weights = sum(weight_bytes(_graphs_of(config, rank)) for rank in ranks)
        # each rank's step working memory at the largest step the engine plans, kept out of the cache's share
        working = len(ranks) * step_working_bytes(
            manifest, config.engine.max_num_batched_tokens, config.engine.max_model_len
        )
        if available is None:
            available = host_available_bytes()
    except (OSError, ValueError) as err:
        raise RuntimeError(f"engine.{FRACTION}: cannot measure the memory: {err}") from None
    per_rank = fraction_budget(budget.value, available, weights + working, len(ranks))
    text = (
        f"{per_rank} ({budget.value:g} of {available / MIB:.0f} MiB available, less {weights / MIB:.1f} MiB "
        f"of weights and {working / MIB:.0f} MiB of step working memory, for {len(ranks)} rank(s))"
    )
    try:
        blocks = CacheGeometry.from_manifest(manifest).blocks(config.engine.max_model_len, per_rank, text)
    except KvBudgetError as err:
        raise RuntimeError(f"engine.{FRACTION}: {err}") from None
    log.info(f"engine.{FRACTION}: {blocks} KV-cache blocks per rank from kv_cache_memory {text}")
    return blocks


def capacity(config, num_blocks: int) -> KvCacheCapacity:
    """What `num_blocks` blocks of rank 0 hold; the memory is left unknown when its manifest cannot be read here
    (ranks on another host)."""
    block_bytes = 0
    try:
        manifest = read_manifest(config.model.graphs[0])
        if manifest is not None:
            block_bytes = CacheGeometry.from_manifest(manifest).block_bytes
    except (OSError, ValueError) as err:
        log.warning(f"the KV cache's memory is unknown: rank 0's manifest cannot be read ({err})")
    return KvCacheCapacity(num_blocks, config.engine.block_size, config.engine.max_model_len, block_bytes)
