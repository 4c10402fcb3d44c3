"""Typed, validated configuration of the reference LLaMA model and of its graph export.

A model YAML file has two sections (both dicts of the fields below)::

    model:            # LlamaConfig: the network's shape
      vocab_size: 2048
      hidden_size: 128
      ...
    export:           # ExportConfig: the paged KV cache and the static shape buckets of the graphs
      block_size: 16
      prefill_batch_buckets: [1, 2, 4]
      ...

Unknown keys are rejected (a typo must not silently fall back to a default).
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

import yaml


def _from_mapping(cls, data: Mapping[str, Any], what: str):
    if not isinstance(data, Mapping):
        raise ValueError(f"{what}: expected a mapping of fields, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {unknown}; valid fields are {sorted(names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            value = data[f.name]
            if isinstance(value, list):
                value = tuple(value)
            kwargs[f.name] = value
    return cls(**kwargs)


def _check_int(obj, name: str, low: int = 1):
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{type(obj).__name__}.{name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{type(obj).__name__}.{name} must be >= {low}, got {value}")


def _check_buckets(obj, name: str, upper: Optional[int] = None, upper_name: str = "", allow_empty: bool = False):
    value = getattr(obj, name)
    if allow_empty and value == ():
        return
    if not isinstance(value, tuple) or not value:
        raise ValueError(f"{type(obj).__name__}.{name} must be a non-empty list of ints, got {value!r}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{type(obj).__name__}.{name} must hold positive ints, got {value!r}")
    if list(value) != sorted(set(value)):
        raise ValueError(f"{type(obj).__name__}.{name} must be strictly increasing, got {value!r}; sort it "
                         "and drop duplicates")
    if upper is not None and value[-1] > upper:
        raise ValueError(f"{type(obj).__name__}.{name} holds {value[-1]} > {upper_name}={upper}; "
                         f"use buckets <= {upper}")


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a LLaMA-architecture decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention)."""

    vocab_size: int
    """Number of token ids (embedding rows and logits)."""
    hidden_size: int
    """Width of the residual stream; a multiple of num_heads."""
    num_layers: int
    """Number of decoder blocks."""
    num_heads: int
    """Query heads per layer."""
    num_kv_heads: int
    """Key/value heads per layer (grouped-query attention); divides num_heads."""
    intermediate_size: int
    """Width of the SwiGLU MLP."""
    max_seq_len: int
    """Longest sequence (prompt + generated tokens) the graphs can hold."""
    rope_theta: float = 10000.0
    """Base of the rotary embedding frequencies."""
    rms_norm_eps: float = 1e-5
    """Epsilon inside RMSNorm."""
    tie_word_embeddings: bool = True
    """Share the token embedding matrix with the lm head."""
    initializer_range: float = 0.02
    """Standard deviation of the random normal initialisation."""
    bos_token_id: Optional[int] = None
    """Beginning-of-sequence id, if the tokenizer has one."""
    eos_token_id: Optional[int] = None
    """End-of-sequence id, if the tokenizer has one."""
    pad_token_id: Optional[int] = None
    """Padding id, if the tokenizer has one."""

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "max_seq_len"):
            _check_int(self, name)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"LlamaConfig.hidden_size={self.hidden_size} is not a multiple of "
                             f"num_heads={self.num_heads}; choose num_heads dividing hidden_size")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"LlamaConfig.num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}; choose num_kv_heads dividing num_heads")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig head_dim = hidden_size/num_heads = {self.head_dim} is odd; rotary "
                             "embeddings need an even head_dim")
        if not self.rope_theta > 0:
            raise ValueError(f"LlamaConfig.rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"LlamaConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not self.initializer_range > 0:
            raise ValueError(f"LlamaConfig.initializer_range must be > 0, got {self.initializer_range}")
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and 0 <= value < self.vocab_size):
                raise ValueError(f"LlamaConfig.{name}={value!r} must be an id in [0, vocab_size={self.vocab_size})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LlamaConfig":
        return _from_mapping(cls, data, "LlamaConfig")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ExportConfig:
    """Paged KV-cache layout and the static shape buckets of the exported graphs."""

    block_size: int = 16
    """Tokens per KV-cache block; divides max_seq_len. MAXB = max_seq_len // block_size."""
    prefill_batch_buckets: Tuple[int, ...] = (1, 2, 4)
    """Batch sizes of the prefill graphs."""
    prefill_len_buckets: Tuple[int, ...] = (16, 64, 128)
    """Query lengths of the prefill graphs (longer prompts are computed in chunks)."""
    decode_batch_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16)
    """Batch sizes of the decode graphs (one token per sequence)."""
    mixed_decode_buckets: Tuple[int, ...] = ()
    """Decode rows of the mixed graphs, which compute decode rows and one prefill row in a single call
    (empty: no mixed graphs; a step mixing both then takes one decode and one prefill call)."""
    mixed_len_buckets: Tuple[int, ...] = ()
    """Prefill-row lengths of the mixed graphs."""
    mixed_prefill_rows: Tuple[int, ...] = (1,)
    """Prefill rows of the mixed graphs (prompts admitted in the same call as the decodes). One mixed graph per
    mixed_decode_buckets x mixed_prefill_rows x mixed_len_buckets."""
    num_blocks: Optional[int] = None
    """Cache blocks fixed in the graphs; None exports a dynamic first cache dimension, chosen at load time."""

    def __post_init__(self):
        _check_int(self, "block_size")
        _check_buckets(self, "prefill_batch_buckets")
        _check_buckets(self, "prefill_len_buckets")
        _check_buckets(self, "decode_batch_buckets")
        _check_buckets(self, "mixed_decode_buckets", allow_empty=True)
        _check_buckets(self, "mixed_len_buckets", allow_empty=True)
        _check_buckets(self, "mixed_prefill_rows")
        if bool(self.mixed_decode_buckets) != bool(self.mixed_len_buckets):
            raise ValueError("ExportConfig.mixed_decode_buckets and mixed_len_buckets must both be set (mixed "
                             "graphs) or both be empty (none)")
        if self.num_blocks is not None:
            _check_int(self, "num_blocks", low=2)

    def validate_for(self, model: LlamaConfig):
        if model.max_seq_len % self.block_size:
            raise ValueError(f"ExportConfig.block_size={self.block_size} does not divide "
                             f"LlamaConfig.max_seq_len={model.max_seq_len}; pick a divisor")
        _check_buckets(self, "prefill_len_buckets", model.max_seq_len, "max_seq_len")
        _check_buckets(self, "prefill_batch_buckets", model.max_seq_len, "max_seq_len")
        _check_buckets(self, "decode_batch_buckets", model.max_seq_len, "max_seq_len")
        _check_buckets(self, "mixed_decode_buckets", model.max_seq_len, "max_seq_len", allow_empty=True)
        _check_buckets(self, "mixed_len_buckets", model.max_seq_len, "max_seq_len", allow_empty=True)
        _check_buckets(self, "mixed_prefill_rows", model.max_seq_len, "max_seq_len")

    def max_blocks_per_seq(self, model: LlamaConfig) -> int:
        return model.max_seq_len // self.block_size

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExportConfig":
        return _from_mapping(cls, data, "ExportConfig")

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass(frozen=True)
class ModelFile:
    """A model YAML file: the network and its export settings."""

    model: LlamaConfig
    export: ExportConfig = field(default_factory=ExportConfig)

    def __post_init__(self):
        self.export.validate_for(self.model)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelFile":
        if not isinstance(data, Mapping) or "model" not in data:
            raise ValueError("a model config needs a 'model:' section (and optionally 'export:')")
        unknown = sorted(set(data) - {"model", "export"})
        if unknown:
            raise ValueError(f"unknown top-level section(s) {unknown}; valid sections are ['export', 'model']")
        return cls(LlamaConfig.from_dict(data["model"]), ExportConfig.from_dict(data.get("export") or {}))

    def to_dict(self) -> Dict[str, Any]:
        return {"model": self.model.to_dict(), "export": self.export.to_dict()}


def load_config(path: str) -> ModelFile:
    """Reads a model YAML file (sections `model` and `export`)."""
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    try:
        return ModelFile.from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def save_config(cfg: ModelFile, path: str):
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
