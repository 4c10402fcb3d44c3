"""How many paged KV-cache blocks a memory budget holds: pure arithmetic over an export's manifest, no I/O.

A rank's cache is 2 * num_layers tensors (keys and values) of [num_blocks, block_size, num_kv_heads, head_dim]
elements of the cache dtype, num_kv_heads being the rank's own share with tensor parallelism (its manifest's
`cache` says so). A budget of B bytes holds floor(B / bytes_per_block) blocks, block 0 (the scratch block)
included, and must hold at least one sequence of max_model_len plus that scratch block.

The budget is given as `engine.kv_cache_memory` (bytes: an int, or "2GiB", "512MiB", "1.5GB") or
`engine.kv_cache_memory_fraction` (of the memory available to the rank, less its weights), instead of
`engine.num_blocks`; `KvCacheBudget` records which one a configuration chose.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mindspore_serving.llm.config import blocks_for

NUM_BLOCKS, MEMORY, FRACTION = "num_blocks", "kv_cache_memory", "kv_cache_memory_fraction"
"""The engine fields that size the cache, exactly one of which a configuration may give."""
MIB = 1 << 20

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1}
DEFAULT_CACHE_DTYPE = "float32"
"""The cache dtype of a manifest that names none (the exporter's today)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")


class KvBudgetError(ValueError):
    """The budget cannot size the cache (too small, or a value that is not a size); the message says why."""


def parse_size(value: object, name: str = MEMORY) -> int:
    """Bytes of a size: an int, or a string of a number and an optional unit, B, KB/MB/GB/TB (powers of 1000)
    or KiB/MiB/GiB/TiB (powers of 1024), any case: "2GiB", "512 MiB", "1.5GB", "1000000". A fraction of a
    byte is dropped. Raises KvBudgetError, naming `name`, for anything else or a size that is not positive."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise KvBudgetError(
            f"{name} must be a size in bytes (an int, or a string such as '2GiB', '512MiB', '1.5GB'), got {value!r}"
        )
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise KvBudgetError(
                f"{name} {value!r} is not a size: give bytes, or a number with B, KB, MB, GB, TB "
                f"(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. '2GiB'"
            )
        number = match.group(1)
        whole, _, decimals = number.partition(".")
        # exact for decimals (1.5GB is 1500000000 bytes, not a float's rounding of it)
        size = (int(whole or "0") * 10 ** len(decimals) + int(decimals or "0")) * _UNITS[unit] // 10 ** len(decimals)
    if size <= 0:
        raise KvBudgetError(f"{name} must be a positive number of bytes, got {value!r}")
    return size


def parse_fraction(value: object, name: str = FRACTION) -> float:
    """A fraction in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise KvBudgetError(
            f"{name} must be a number in (0, 1], the share of the memory available to a rank, got {value!r}"
        )
    return float(value)


def min_blocks(max_model_len: int, block_size: int) -> int:
    """Blocks of one sequence of max_model_len (its last token is never cached) plus the scratch block: the
    least a cache may have (what SchedulerConfig requires)."""
    return blocks_for(max_model_len - 1, block_size) + 1


@dataclass(frozen=True)
class CacheGeometry:
    """What one KV-cache block of a rank takes: its layers, the rank's KV heads, head dim, tokens and dtype."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str = DEFAULT_CACHE_DTYPE

    @classmethod
    def from_manifest(cls, manifest: Mapping) -> "CacheGeometry":
        """From an export's manifest.json: `cache` {num_layers, num_kv_heads (this rank's), head_dim, dtype
        (default float32)} and `block_size`."""
        cache = manifest.get("cache")
        if not isinstance(cache, Mapping):
            raise KvBudgetError(
                "the graphs' manifest has no 'cache' section (num_layers, num_kv_heads, head_dim); re-export the graphs"
            )
        try:
            geometry = cls(
                int(cache["num_layers"]),
                int(cache["num_kv_heads"]),
                int(cache["head_dim"]),
                int(manifest["block_size"]),
                str(cache.get("dtype") or DEFAULT_CACHE_DTYPE),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise KvBudgetError(
                f"the graphs' manifest lacks a valid cache geometry ({err!r}); re-export the graphs"
            ) from None
        if geometry.dtype not in DTYPE_BYTES:
            raise KvBudgetError(f"the graphs' KV cache dtype {geometry.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        if min(geometry.num_layers, geometry.num_kv_heads, geometry.head_dim, geometry.block_size) < 1:
            raise KvBudgetError(f"the graphs' manifest has an empty cache geometry {geometry}; re-export the graphs")
        return geometry

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over all layers, keys and values."""
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def min_blocks(self, max_model_len: int) -> int:
        return min_blocks(max_model_len, self.block_size)

    def blocks(self, max_model_len: int, budget_bytes: int, budget_text: str | None = None) -> int:
        """The blocks `budget_bytes` holds; KvBudgetError when fewer than min_blocks. `budget_text` says what the
        budget came from in the error (default: the bytes)."""
        blocks = budget_bytes // self.block_bytes if budget_bytes > 0 else 0
        need = self.min_blocks(max_model_len)
        if blocks < need:
            raise KvBudgetError(
                f"too little memory for even one sequence: {need * self.block_bytes} bytes needed "
                f"for max_model_len={max_model_len}, kv_cache_memory is "
                f"{budget_text or budget_bytes}"
            )
        return blocks


def kv_cache_blocks(manifest: Mapping, max_model_len: int, budget_bytes: int) -> int:
    """KV-cache blocks (scratch block included) that `budget_bytes` per rank holds for the graphs of `manifest`
    (a rank's manifest.json, as a dict). Raises KvBudgetError when the budget cannot hold one sequence of
    `max_model_len` plus the scratch block."""
    return CacheGeometry.from_manifest(manifest).blocks(max_model_len, budget_bytes)


def fraction_budget(fraction: float, available_bytes: int, weight_bytes: int, ranks_sharing: int = 1) -> int:
    """Bytes per rank for the cache when `ranks_sharing` ranks share `available_bytes` (a CPU host's memory;
    1 for a device of its own): `fraction` of it, less the weights those ranks will load, split evenly."""
    return int((fraction * available_bytes - weight_bytes) // max(1, ranks_sharing))


@dataclass(frozen=True)
class KvCacheBudget:
    """How a configuration sizes the KV cache: `kind` is NUM_BLOCKS (engine.num_blocks, or its default), MEMORY
    (`value` bytes per rank) or FRACTION (`value` of the memory available to a rank)."""

    kind: str = NUM_BLOCKS
    value: float = 0

    @property
    def from_memory(self) -> bool:
        return self.kind != NUM_BLOCKS


def choose_budget(engine: Mapping) -> KvCacheBudget:
    """The budget an `engine` section gives: at most one of num_blocks, kv_cache_memory, kv_cache_memory_fraction
    (none: num_blocks' default). Raises KvBudgetError naming them when several are given, or a bad value."""
    given = [name for name in (NUM_BLOCKS, MEMORY, FRACTION) if engine.get(name) is not None]
    if len(given) > 1:
        raise KvBudgetError(
            f"give only one of engine.num_blocks, engine.kv_cache_memory and "
            f"engine.kv_cache_memory_fraction to size the KV cache, got {' and '.join(given)}"
        )
    if given == [MEMORY]:
        return KvCacheBudget(MEMORY, parse_size(engine[MEMORY], f"engine.{MEMORY}"))
    if given == [FRACTION]:
        return KvCacheBudget(FRACTION, parse_fraction(engine[FRACTION], f"engine.{FRACTION}"))
    return KvCacheBudget()


@dataclass(frozen=True)
class KvCacheCapacity:
    """What a cache of `num_blocks` blocks (scratch block included) holds, for the log and /metrics."""

    num_blocks: int
    block_size: int
    max_model_len: int
    block_bytes: int = 0
    """0: unknown (no manifest at hand); the memory is then not reported."""

    @property
    def tokens(self) -> int:
        """Tokens the usable blocks (all but the scratch block) hold."""
        return (self.num_blocks - 1) * self.block_size

    @property
    def sequences(self) -> int:
        """Sequences of max_model_len that fit at once."""
        return (self.num_blocks - 1) // blocks_for(max(1, self.max_model_len - 1), self.block_size)

    @property
    def memory_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def describe(self) -> str:
        memory = f" in {self.memory_bytes / MIB:.1f} MiB per rank" if self.block_bytes else " per rank"
        return (
            f"KV cache: {self.num_blocks} blocks of {self.block_size} tokens, {self.tokens} tokens "
            f"({self.sequences} sequences of max_model_len={self.max_model_len}){memory}"
        )


def step_working_bytes(manifest: Mapping, max_num_tokens: int, max_model_len: int) -> int:
    """An upper estimate of the memory one step of `max_num_tokens` tokens takes beside the weights and the cache:
    the intermediate tensors of one decoder layer's graph call (the runner calls the layer graph once per layer and
    each call's tensors are released before the next, models/llama/step_graphs.py), with every token in one
    chunk row attending over `max_model_len` positions (the scores, their bias and softmax), and the logits of
    every token (a scored prompt's). Measured on the 0.5B shape (bench/llm_real.py): a 512-token step over a
    512-token context took ~0.2 GB; this says 0.47 GB, 0.31 GB of it the logits of every token, which only a
    scored prompt asks for. 0 for a manifest without the model's dimensions."""
    model = manifest.get("model") or {}
    if not all(key in model for key in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "intermediate_size")):
        return 0
    tp = int((manifest.get("tensor_parallel") or {}).get("size", 1))
    hidden, vocab = int(model["hidden_size"]), int(model["vocab_size"])
    heads, kv_heads = int(model["num_heads"]) // tp, int(model["num_kv_heads"]) // tp
    head_dim = int(model.get("head_dim") or hidden // int(model["num_heads"]))
    intermediate = int(model["intermediate_size"]) // tp
    # per token: ~8 hidden-wide tensors (norms, residuals, projections' outputs), ~6 of q, k and v (projections,
    # biases, the rotary halves), and 3 MLP-wide ones (gate/up, silu, their product)
    per_token = 8 * hidden + 6 * (heads + 2 * kv_heads) * head_dim + 3 * 2 * intermediate
    # scores, scaled, biased, softmax, the bias itself, per query token: the runner pads a call's prompt rows to
    # the longest, up to twice its tokens (agent/step_inputs.py, PADDED_FACTOR)
    attention = 2 * 5 * heads * max_model_len
    context = 4 * kv_heads * head_dim * max_model_len  # a row's keys and values, gathered and transposed
    floats = max_num_tokens * (per_token + attention + vocab) + context
    return 4 * floats
