"""Typed, validated configuration of the reference LLaMA model and of its graph export.

A model YAML file has two sections (both dicts of the fields below)::

    model:            # LlamaConfig: the network's shape
      vocab_size: 2048
      hidden_size: 128
      ...
    export:           # ExportConfig: the paged KV cache's layout
      block_size: 16

Unknown keys are rejected (a typo must not silently fall back to a default).
"""

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from mindspore_serving.common.check_type import IntFault, int_fault


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
    fault = int_fault(value, low)
    if fault is IntFault.NOT_INT:
        raise ValueError(f"{type(obj).__name__}.{name} must be an int, got {value!r}")
    if fault is not None:
        raise ValueError(f"{type(obj).__name__}.{name} must be >= {low}, got {value}")


ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
"""The rope_scaling types implemented (`rope_inv_freq`) and the keys each one needs."""


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a LLaMA-architecture decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention).

    The fields after `pad_token_id` cover the LLaMA, Mistral and Qwen2/Qwen3 variants of the architecture; their
    defaults are the plain LLaMA decoder, and `to_dict` leaves them out while they hold their defaults.
    """

    vocab_size: int
    """Number of token ids (embedding rows and logits)."""
    hidden_size: int
    """Width of the residual stream; a multiple of num_heads unless head_dim is given."""
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
    bos_token_id: int | None = None
    """Beginning-of-sequence id, if the tokenizer has one."""
    eos_token_id: int | None = None
    """End-of-sequence id, if the tokenizer has one."""
    pad_token_id: int | None = None
    """Padding id, if the tokenizer has one."""
    head_dim: int | None = None
    """Width of one attention head; None (read back as hidden_size // num_heads) unless given (Qwen3 and some
    LLaMA/Mistral models have num_heads * head_dim != hidden_size)."""
    qkv_bias: bool = False
    """q, k and v projections have biases (Qwen2); o never has one."""
    qk_norm: bool = False
    """An RMSNorm (weight [head_dim], eps rms_norm_eps) over each head's q and k, before the rotary embedding
    (Qwen3)."""
    rope_scaling: Mapping[str, Any] | None = None
    """None, {"rope_type": "linear", "factor": f} or {"rope_type": "llama3", "factor", "low_freq_factor",
    "high_freq_factor", "original_max_position_embeddings"}: how the rotary frequencies are rescaled."""
    sliding_window: int | None = None
    """Attention window of the model (Mistral); it must cover max_seq_len, where it changes nothing."""

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_seq_len",
        ):
            _check_int(self, name)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"LlamaConfig.hidden_size={self.hidden_size} is not a multiple of "
                    f"num_heads={self.num_heads}; choose num_heads dividing hidden_size or give "
                    "head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _check_int(self, "head_dim")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"LlamaConfig.num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}; choose num_kv_heads dividing num_heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig head_dim={self.head_dim} is odd; rotary embeddings need an even head_dim")
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
        for name in ("qkv_bias", "qk_norm", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LlamaConfig.{name} must be true or false, got {getattr(self, name)!r}")
        _check_rope_scaling(self.rope_scaling)
        if self.sliding_window is not None:
            _check_int(self, "sliding_window")
            if self.sliding_window < self.max_seq_len:
                raise ValueError(
                    f"LlamaConfig.sliding_window={self.sliding_window} is smaller than max_seq_len="
                    f"{self.max_seq_len}: sliding-window attention is not implemented; serve at most "
                    f"{self.sliding_window} tokens per sequence"
                )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LlamaConfig":
        return _from_mapping(cls, data, "LlamaConfig")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.head_dim == self.hidden_size // self.num_heads and not self.hidden_size % self.num_heads:
            del d["head_dim"]
        for name in ("qkv_bias", "qk_norm", "rope_scaling", "sliding_window"):
            if d[name] == _FIELD_DEFAULTS[name]:
                del d[name]
        if d.get("rope_scaling") is not None:
            d["rope_scaling"] = dict(d["rope_scaling"])
        return d

    def rope_inv_freq(self) -> np.ndarray:
        """The rotary inverse frequencies float32 [head_dim // 2], computed as transformers does (float32, with
        `rope_scaling` applied)."""
        return rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling)


_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LlamaConfig)}


def _check_rope_scaling(scaling):
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise ValueError(f"LlamaConfig.rope_scaling must be null or a mapping, got {scaling!r}")
    kind = scaling.get("rope_type")
    if kind not in ROPE_SCALING_KEYS:
        raise ValueError(
            f"LlamaConfig.rope_scaling rope_type={kind!r} is not supported; supported: null, "
            f"{sorted(ROPE_SCALING_KEYS)}"
        )
    needed = ("rope_type",) + ROPE_SCALING_KEYS[kind]
    missing = [k for k in needed if k not in scaling]
    unknown = sorted(set(scaling) - set(needed))
    if missing or unknown:
        raise ValueError(
            f"LlamaConfig.rope_scaling of rope_type {kind!r} needs exactly the keys {list(needed)}; "
            f"missing {missing}, unknown {unknown}"
        )
    for k in ROPE_SCALING_KEYS[kind]:
        value = scaling[k]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"LlamaConfig.rope_scaling.{k} must be a number > 0, got {value!r}")
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ValueError(
            "LlamaConfig.rope_scaling: llama3 needs high_freq_factor > low_freq_factor, got "
            f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}"
        )


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping[str, Any] | None = None) -> np.ndarray:
    """float32 [head_dim // 2] inverse frequencies of rotate-half RoPE, in float32 arithmetic as transformers'
    `_compute_{default,linear_scaling,llama3}_rope_parameters` compute them.

    linear divides every frequency by `factor`. llama3 keeps the frequencies whose wavelength 2*pi/f is shorter
    than original_max_position_embeddings / high_freq_factor, divides by `factor` those whose wavelength is longer
    than original_max_position_embeddings / low_freq_factor, and in between blends f / factor and f with weight
    s = (original_max_position_embeddings / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor).
    """
    f32 = np.float32
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(f32) / f32(head_dim)
    inv_freq = (f32(1.0) / (f32(theta) ** exponent)).astype(f32)
    if scaling is None:
        return inv_freq
    factor = f32(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return (inv_freq / factor).astype(f32)
    low, high = f32(scaling["low_freq_factor"]), f32(scaling["high_freq_factor"])
    old_len = f32(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = f32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq).astype(f32)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (f32(1) - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(f32)


REMOVED_EXPORT_FIELDS = (
    "prefill_batch_buckets",
    "prefill_len_buckets",
    "decode_batch_buckets",
    "mixed_decode_buckets",
    "mixed_len_buckets",
    "mixed_prefill_rows",
    "score_len_buckets",
    "spec_tokens",
    "spec_batch_buckets",
    "num_blocks",
)
"""Fields of the per-shape-bucket exports, gone with them: the step graphs take any batch, length and cache size."""


def removed_export_field(name: str) -> str:
    """What replaces the removed export field `name` (REMOVED_EXPORT_FIELDS), as an error message."""
    if name == "num_blocks":
        replacement = "the KV cache's size is chosen when serving (engine.num_blocks or engine.kv_cache_memory)"
    else:
        replacement = (
            "one dynamic-shape export computes every step of any batch, prompt length and speculative proposal; "
            "the tokens of a step are bounded by engine.max_num_batched_tokens"
        )
    return f"export.{name} was removed: {replacement}; delete it"


@dataclass(frozen=True)
class ExportConfig:
    """The paged KV cache's layout, fixed at export; everything else about a step's shape is dynamic."""

    block_size: int = 16
    """Tokens per KV-cache block; divides max_seq_len."""

    def __post_init__(self):
        _check_int(self, "block_size")

    def validate_for(self, model: LlamaConfig):
        if model.max_seq_len % self.block_size:
            raise ValueError(
                f"ExportConfig.block_size={self.block_size} does not divide "
                f"LlamaConfig.max_seq_len={model.max_seq_len}; pick a divisor"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExportConfig":
        if isinstance(data, Mapping):
            for name in REMOVED_EXPORT_FIELDS:
                if name in data:
                    raise ValueError(removed_export_field(name))
        return _from_mapping(cls, data, "ExportConfig")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def merged(self, overrides: Mapping[str, Any]) -> "ExportConfig":
        """This config with the fields of `overrides` (a mapping of ExportConfig fields, e.g. an LLM YAML's
        `model.export`) replacing its own; validated as `from_dict` does."""
        return ExportConfig.from_dict({**self.to_dict(), **dict(overrides)})


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

    def to_dict(self) -> dict[str, Any]:
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


def check_tensor_parallel(cfg: LlamaConfig, tp: int, field_names: Mapping[str, str] | None = None):
    """Raises ValueError unless the model's heads, KV heads and MLP width split evenly over `tp` ranks; the message
    names the fields as `field_names` says (e.g. a Hugging Face config.json's names), else as LlamaConfig does."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel must be an int >= 1, got {tp!r}")
    sizes = {
        (field_names or {}).get(name, name): getattr(cfg, name)
        for name in ("num_heads", "num_kv_heads", "intermediate_size")
    }
    for name, size in sizes.items():
        if size % tp:
            common = math.gcd(*sizes.values())
            valid = [d for d in range(1, common + 1) if common % d == 0]
            raise ValueError(
                f"tensor_parallel={tp} does not divide the model's {name}={size} "
                f"({', '.join(f'{k}={v}' for k, v in sizes.items())}); valid tensor_parallel values: "
                f"{valid}"
            )
