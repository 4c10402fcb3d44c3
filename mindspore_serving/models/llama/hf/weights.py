"""A Hugging Face checkpoint's *.safetensors -> float32 arrays under `LlamaModel`'s parameter names.

`SafetensorsCheckpoint` lists a directory's tensors (one model.safetensors, or the shards that
model.safetensors.index.json maps) from the files' headers and reads one tensor at a time: float32 and float16 with
the `safetensors` library's NumPy API, bfloat16 (which NumPy lacks) from its raw bytes, widened to float32 exactly
(a bfloat16 is the top half of a float32). `hf_parameter_sources` is the pure name and shape mapping, and
`load_hf_weights` checks a checkpoint against it (missing, unexpected and misshapen tensors are refused, naming
them) before reading anything. Messages name files relative to the model directory.
"""

import glob
import json
import os
import struct
from collections.abc import Mapping

import numpy as np
from safetensors import safe_open

from ..config import LlamaConfig
from .config import UnsupportedModelError, read_json

INDEX_FILE = "model.safetensors.index.json"
_ITEM_SIZE = {"F32": 4, "F16": 2, "BF16": 2}
_MAX_HEADER = 100 << 20
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # buffers some checkpoints store; recomputed from the config


def bfloat16_to_float32(raw: np.ndarray) -> np.ndarray:
    """Little-endian bfloat16 bit patterns (uint16) -> the equal float32 values (bits << 16)."""
    return (raw.astype("<u4") << 16).view("<f4").astype(np.float32, copy=False)


class SafetensorsCheckpoint:
    """The tensors of a model directory's safetensors files: name -> (file, dtype, shape, data offset, bytes)."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.entries: dict[str, tuple[str, str, tuple[int, ...], int, int]] = {}
        index = read_json(model_dir, INDEX_FILE, required=False)
        if index is not None:
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise UnsupportedModelError(f"{INDEX_FILE} has no weight_map object")
            files = sorted(set(weight_map.values()))
            for file in files:
                if not isinstance(file, str) or os.path.basename(file) != file:
                    raise UnsupportedModelError(f"{INDEX_FILE} names a shard {file!r} outside the model directory")
        else:
            files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_dir, "*.safetensors")))
            if not files:
                raise UnsupportedModelError("the model directory has no *.safetensors weights")
        for file in files:
            for name, entry in self._read_header(file).items():
                if name in self.entries:
                    raise UnsupportedModelError(f"tensor {name} is in both {self.entries[name][0]} and {file}")
                self.entries[name] = entry
        if index is not None:
            for name, file in sorted(weight_map.items()):
                if name not in self.entries or self.entries[name][0] != file:
                    raise UnsupportedModelError(f"{INDEX_FILE} maps {name} to {file}, which does not hold it")

    def _read_header(self, file: str) -> dict[str, tuple[str, str, tuple[int, ...], int, int]]:
        path = os.path.join(self.model_dir, file)
        if not os.path.isfile(path):
            raise UnsupportedModelError(f"weight file {file} is missing")
        size = os.path.getsize(path)
        try:
            with open(path, "rb") as f:
                head = f.read(8)
                (length,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
                if length is None or length > min(_MAX_HEADER, size - 8):
                    raise ValueError("bad header length")
                header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error) as err:
            raise UnsupportedModelError(f"{file} is not a safetensors file ({type(err).__name__}: {err})") from None
        if not isinstance(header, dict):
            raise UnsupportedModelError(f"{file} is not a safetensors file (its header is not an object)")
        entries = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
                if not all(isinstance(v, int) and v >= 0 for v in shape + (begin, end)):
                    raise ValueError
            except (KeyError, TypeError, ValueError):
                raise UnsupportedModelError(f"{file}: tensor {name} has a malformed header entry") from None
            if dtype not in _ITEM_SIZE:
                raise UnsupportedModelError(f"{file}: tensor {name} has dtype {dtype}; supported: {sorted(_ITEM_SIZE)}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * _ITEM_SIZE[dtype]
            if end - begin != nbytes or 8 + length + end > size:
                raise UnsupportedModelError(
                    f"{file}: tensor {name} ({dtype} {list(shape)}) does not fit its "
                    "data offsets; the file is truncated or corrupt"
                )
            entries[name] = (file, dtype, shape, 8 + length + begin, nbytes)
        return entries

    def names(self) -> list[str]:
        return sorted(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][2]

    def dtype(self, name: str) -> str:
        return self.entries[name][1]

    def read(self, name: str) -> np.ndarray:
        """Tensor `name` as float32."""
        file, dtype, shape, offset, nbytes = self.entries[name]
        path = os.path.join(self.model_dir, file)
        if dtype == "BF16":
            raw = np.fromfile(path, dtype="<u2", count=nbytes // 2, offset=offset)
            return bfloat16_to_float32(raw).reshape(shape)
        with safe_open(path, framework="numpy") as f:
            return np.asarray(f.get_tensor(name), dtype=np.float32)


def hf_parameter_sources(cfg: LlamaConfig) -> dict[str, tuple[tuple[str, tuple[int, ...]], ...]]:
    """LlamaModel (tp=1) parameter name -> the Hugging Face tensors (name, shape) stacked by rows to make it."""
    hidden, head_dim = cfg.hidden_size, cfg.head_dim
    q_rows, kv_rows, inter = cfg.num_heads * head_dim, cfg.num_kv_heads * head_dim, cfg.intermediate_size
    sources = {
        "embed_tokens": (("model.embed_tokens.weight", (cfg.vocab_size, hidden)),),
        "norm": (("model.norm.weight", (hidden,)),),
    }
    if not cfg.tie_word_embeddings:
        sources["lm_head"] = (("lm_head.weight", (cfg.vocab_size, hidden)),)
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        attn, mlp = hf + "self_attn.", hf + "mlp."
        sources.update(
            {
                ours + "input_norm": ((hf + "input_layernorm.weight", (hidden,)),),
                ours + "q_proj": ((attn + "q_proj.weight", (q_rows, hidden)),),
                ours + "kv_proj": (
                    (attn + "k_proj.weight", (kv_rows, hidden)),
                    (attn + "v_proj.weight", (kv_rows, hidden)),
                ),
                ours + "o_proj": ((attn + "o_proj.weight", (hidden, q_rows)),),
                ours + "post_attn_norm": ((hf + "post_attention_layernorm.weight", (hidden,)),),
                ours + "gate_up_proj": (
                    (mlp + "gate_proj.weight", (inter, hidden)),
                    (mlp + "up_proj.weight", (inter, hidden)),
                ),
                ours + "down_proj": ((mlp + "down_proj.weight", (hidden, inter)),),
            }
        )
        if cfg.qkv_bias:
            sources[ours + "q_bias"] = ((attn + "q_proj.bias", (q_rows,)),)
            sources[ours + "kv_bias"] = ((attn + "k_proj.bias", (kv_rows,)), (attn + "v_proj.bias", (kv_rows,)))
        if cfg.qk_norm:
            sources[ours + "q_norm"] = ((attn + "q_norm.weight", (head_dim,)),)
            sources[ours + "k_norm"] = ((attn + "k_norm.weight", (head_dim,)),)
    return sources


def _listed(names) -> str:
    names = sorted(names)
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def check_checkpoint(cfg: LlamaConfig, shapes: Mapping[str, tuple[int, ...]]):
    """Raises UnsupportedModelError unless the checkpoint's tensors (name -> shape) are exactly those of `cfg`'s
    model (lm_head.weight may be present, and is then unused, when the embeddings are tied)."""
    expected = {name: shape for parts in hf_parameter_sources(cfg).values() for name, shape in parts}
    present = {n for n in shapes if not n.endswith(_IGNORED_SUFFIXES)}
    if cfg.tie_word_embeddings:
        present.discard("lm_head.weight")
    missing, unexpected = set(expected) - present, present - set(expected)
    if missing:
        hint = " (tie_word_embeddings is false in config.json)" if missing == {"lm_head.weight"} else ""
        raise UnsupportedModelError(
            f"the checkpoint lacks {len(missing)} tensor(s) the config needs: {_listed(missing)}{hint}"
        )
    if unexpected:
        raise UnsupportedModelError(
            f"the checkpoint has {len(unexpected)} tensor(s) the {cfg.num_layers}-layer "
            f"model of config.json does not use: {_listed(unexpected)}"
        )
    for name in sorted(expected):
        if tuple(shapes[name]) != expected[name]:
            raise UnsupportedModelError(
                f"tensor {name} has shape {list(shapes[name])}, config.json implies {list(expected[name])}"
            )


def load_hf_weights(model_dir: str, cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """`model_dir`'s checkpoint as float32 arrays under LlamaModel's (tp=1) parameter names, k and v stacked in
    kv_proj (and kv_bias), gate and up in gate_up_proj; ready for `shard_weights` or `set_data`."""
    ckpt = SafetensorsCheckpoint(model_dir)
    check_checkpoint(cfg, {name: ckpt.shape(name) for name in ckpt.names()})
    weights = {}
    for param, parts in hf_parameter_sources(cfg).items():
        arrays = [ckpt.read(name) for name, _ in parts]
        weights[param] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
    return weights
