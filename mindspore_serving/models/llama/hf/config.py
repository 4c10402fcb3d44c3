"""A Hugging Face model directory's config.json -> LlamaConfig (generation_config.json is the serving config's:
llm/generation_defaults.py reads it).

Each field of config.json is mapped onto `LlamaConfig`, checked to hold a value under which transformers computes
what `LlamaModel` computes, or known to leave the forward pass alone (bookkeeping, training-only settings,
generation defaults). Any other field, and any value we do not implement, raises `UnsupportedModelError` naming the
field and its value: a model is served exactly or not at all. Messages name files relative to the model directory.
"""

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import ROPE_SCALING_KEYS, LlamaConfig


class UnsupportedModelError(ValueError):
    """The model directory holds a model (or a file) this network does not compute or cannot read."""


@dataclass(frozen=True)
class Architecture:
    """How one transformers architecture differs from the plain LLaMA decoder."""

    model_type: str
    qkv_bias: bool = False
    """q, k and v projections always have biases (o never)."""
    qk_norm: bool = False
    """Per-head RMSNorm of q and k before RoPE."""
    always_slides: bool = False
    """sliding_window applies whenever it is set (Mistral); otherwise only with use_sliding_window (Qwen)."""


ARCHITECTURES = {
    "LlamaForCausalLM": Architecture("llama"),
    "MistralForCausalLM": Architecture("mistral", always_slides=True),
    "Qwen2ForCausalLM": Architecture("qwen2", qkv_bias=True),
    "Qwen3ForCausalLM": Architecture("qwen3", qk_norm=True),
}

# Fields that do not change the forward pass: bookkeeping, training-only settings, and generation defaults
# (those of generation_config.json are read separately).
_NEUTRAL_FIELDS = frozenset(
    {
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "_name_or_path",
        "_commit_hash",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "attn_implementation",
        "use_cache",
        "initializer_range",
        "attention_dropout",
        "pretraining_tp",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "use_bfloat16",
        "tf_legacy_loss",
        "pruned_heads",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "cross_attention_hidden_size",
        "add_cross_attention",
        "tie_encoder_decoder",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "finetuning_task",
        "id2label",
        "label2id",
        "num_labels",
        "tokenizer_class",
        "prefix",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
        "problem_type",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    }
)
# Fields read below (mapped or checked).
_MATH_FIELDS = frozenset(
    {
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
    }
)
_RMS_NORM_EPS_DEFAULT = 1e-6  # transformers' default for the four architectures


def _refuse(field: str, value: Any, why: str):
    raise UnsupportedModelError(f"config.json: {field}={json.dumps(value)} is not supported: {why}")


def read_json(model_dir: str, name: str, required: bool = True) -> dict[str, Any] | None:
    """The JSON object in `model_dir/name`; None when it is absent and not required."""
    path = os.path.join(model_dir, name)
    if not os.path.isfile(path):
        if required:
            raise UnsupportedModelError(f"the model directory has no {name}")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UnsupportedModelError(f"{name} cannot be read: {type(err).__name__}: {err}") from None
    if not isinstance(data, dict):
        raise UnsupportedModelError(f"{name} must hold a JSON object, got {type(data).__name__}")
    return data


def _int_field(cfg: Mapping[str, Any], name: str, required: bool = True) -> int | None:
    """config.json's positive int `name`; None when it is absent or null and not required."""
    value = cfg.get(name)
    if value is None:
        if required:
            raise UnsupportedModelError(f"config.json has no {name}")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedModelError(f"config.json: {name} must be a positive integer, got {json.dumps(value)}")
    return value


def _number_field(cfg: Mapping[str, Any], name: str, default: float) -> float:
    value = cfg.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UnsupportedModelError(f"config.json: {name} must be a number > 0, got {json.dumps(value)}")
    return float(value)


def architecture_of(cfg: Mapping[str, Any]) -> tuple[str, Architecture]:
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise UnsupportedModelError(
            f"config.json: architectures={json.dumps(archs)} must name exactly one "
            f"architecture; supported: {sorted(ARCHITECTURES)}"
        )
    name = archs[0]
    if name not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"config.json: architecture {name!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    arch = ARCHITECTURES[name]
    if cfg.get("model_type", arch.model_type) != arch.model_type:
        _refuse("model_type", cfg["model_type"], f"{name} has model_type {arch.model_type!r}")
    return name, arch


def _rope(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling as LlamaConfig takes it) from rope_theta/rope_scaling or (newer transformers)
    rope_parameters."""
    field = "rope_parameters" if cfg.get("rope_parameters") is not None else "rope_scaling"
    params = cfg.get(field)
    theta = cfg.get("rope_theta")
    if params is not None and not isinstance(params, dict):
        _refuse(field, params, "expected null or an object")
    params = dict(params or {})
    if field == "rope_parameters" and "rope_theta" in params:
        theta = params.pop("rope_theta")
    if theta is None:
        theta = 10000.0
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        _refuse("rope_theta", theta, "must be a number > 0")
    partial = params.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1:
        _refuse("partial_rotary_factor", partial, "rotary embeddings cover the whole head here (1.0)")
    kind = params.pop("rope_type", None)
    legacy = params.pop("type", None)
    kind = kind if kind is not None else legacy
    if kind is None and not params:
        return float(theta), None
    if kind == "default":
        if params:
            _refuse(field, cfg.get(field), f"unknown key(s) {sorted(params)} for rope_type 'default'")
        return float(theta), None
    if kind not in ROPE_SCALING_KEYS:
        _refuse(f"{field}.rope_type", kind, f"supported rope types: default (null), {sorted(ROPE_SCALING_KEYS)}")
    needed = ROPE_SCALING_KEYS[kind]
    missing = [k for k in needed if k not in params]
    unknown = sorted(set(params) - set(needed))
    if missing or unknown:
        _refuse(
            field,
            cfg.get(field),
            f"rope_type {kind!r} takes exactly the keys {list(needed)} (missing {missing}, unknown {unknown})",
        )
    scaling = {"rope_type": kind}
    for k in needed:
        value = params[k]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            _refuse(f"{field}.{k}", value, "must be a number > 0")
        scaling[k] = value if k == "original_max_position_embeddings" else float(value)
    return float(theta), scaling


def _sliding_window(cfg: Mapping[str, Any], arch: Architecture, num_layers: int, max_seq_len: int) -> int | None:
    """The attention window some layer uses (None: none does); refused when it is shorter than max_seq_len,
    since attention here always sees the whole sequence."""
    window = cfg.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        _refuse("sliding_window", window, "must be null or a positive integer")
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            _refuse("layer_types", layer_types, f"expected a list of {num_layers} layer types")
        for kind in layer_types:
            if kind not in ("full_attention", "sliding_attention"):
                _refuse("layer_types", layer_types, f"layer type {kind!r} is not implemented")
        slides = "sliding_attention" in layer_types
        switch = "used by the sliding_attention layers of layer_types"
    elif arch.always_slides:
        slides, switch = True, f"which {arch.model_type} applies whenever it is set"
    else:
        slides = cfg.get("use_sliding_window") is True
        max_window_layers = cfg.get("max_window_layers")
        if slides and isinstance(max_window_layers, int) and max_window_layers >= num_layers:
            slides = False  # layers from max_window_layers on slide: none does
        switch = "enabled by use_sliding_window"
    if not slides or window is None:
        return None
    if window < max_seq_len:
        raise UnsupportedModelError(
            f"config.json: sliding_window={window} ({switch}) is smaller than the served max length "
            f"{max_seq_len}: sliding-window attention is not implemented; serve at most {window} tokens per "
            "sequence (max_model_len)"
        )
    return window


def _token_ids(value: Any, field: str, file: str = "config.json") -> list[int]:
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise UnsupportedModelError(f"{file}: {field}={json.dumps(value)} must be a token id or a list of them")
    return list(ids)


def hf_llama_config(cfg: Mapping[str, Any], max_seq_len: int | None = None) -> tuple[LlamaConfig, dict[str, Any]]:
    """config.json's object -> (LlamaConfig, extras); see `read_hf_config`."""
    arch_name, arch = architecture_of(cfg)
    unknown = sorted(set(cfg) - _NEUTRAL_FIELDS - _MATH_FIELDS)
    if unknown:
        name = unknown[0]
        others = f" (nor are {unknown[1:]})" if unknown[1:] else ""
        _refuse(
            name,
            cfg[name],
            f"it is not a {arch_name} field known to leave the computation unchanged or implemented here{others}",
        )
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        _refuse("hidden_act", act, "the MLP is SwiGLU (silu)")
    if cfg.get("mlp_bias", False) is not False:
        _refuse("mlp_bias", cfg["mlp_bias"], "the MLP projections have no biases here")
    if cfg.get("attention_bias", False) is not False:
        _refuse(
            "attention_bias", cfg["attention_bias"], f"{arch_name} then adds an o_proj bias, which is not implemented"
        )
    num_heads = _int_field(cfg, "num_attention_heads")
    num_layers = _int_field(cfg, "num_hidden_layers")
    max_pos = _int_field(cfg, "max_position_embeddings", required=False)
    if max_seq_len is None:
        if max_pos is None:
            raise UnsupportedModelError("config.json has no max_position_embeddings; give the max model length")
        max_seq_len = max_pos
    elif max_pos is not None and max_seq_len > max_pos:
        raise UnsupportedModelError(
            f"the max model length {max_seq_len} exceeds config.json's max_position_embeddings={max_pos}"
        )
    theta, scaling = _rope(cfg)
    window = _sliding_window(cfg, arch, num_layers, max_seq_len)
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        _refuse("tie_word_embeddings", tie, "must be true or false")
    vocab = _int_field(cfg, "vocab_size")
    eos_ids = _token_ids(cfg.get("eos_token_id"), "eos_token_id")
    bos_ids = _token_ids(cfg.get("bos_token_id"), "bos_token_id")
    pad_ids = _token_ids(cfg.get("pad_token_id"), "pad_token_id")

    def first_in_vocab(ids):
        return next((i for i in ids if i < vocab), None)

    try:
        model = LlamaConfig(
            vocab_size=vocab,
            hidden_size=_int_field(cfg, "hidden_size"),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=_int_field(cfg, "num_key_value_heads", required=False) or num_heads,
            intermediate_size=_int_field(cfg, "intermediate_size"),
            max_seq_len=max_seq_len,
            rope_theta=theta,
            rms_norm_eps=_number_field(cfg, "rms_norm_eps", _RMS_NORM_EPS_DEFAULT),
            tie_word_embeddings=tie,
            bos_token_id=first_in_vocab(bos_ids),
            eos_token_id=first_in_vocab(eos_ids),
            pad_token_id=first_in_vocab(pad_ids),
            head_dim=_int_field(cfg, "head_dim", required=False),
            qkv_bias=arch.qkv_bias,
            qk_norm=arch.qk_norm,
            rope_scaling=scaling,
            sliding_window=window,
        )
    except ValueError as err:
        raise UnsupportedModelError(f"config.json: {err}") from None
    extras = {
        "architecture": arch_name,
        "model_type": arch.model_type,
        "max_position_embeddings": max_pos,
        "eos_token_ids": eos_ids,
        "torch_dtype": cfg.get("torch_dtype", cfg.get("dtype")),
    }
    return model, extras


def read_hf_config(model_dir: str, max_seq_len: int | None = None) -> tuple[LlamaConfig, dict[str, Any]]:
    """Reads `model_dir`'s config.json -> (LlamaConfig, extras).

    max_seq_len: the served max length (default: max_position_embeddings, which it may not exceed). extras:
    architecture, model_type, max_position_embeddings, torch_dtype (the checkpoint's), eos_token_ids (config.json's
    end-of-sequence ids; LlamaConfig.eos_token_id holds the first in the vocabulary). Raises UnsupportedModelError
    naming the field that is not implemented.
    """
    return hf_llama_config(read_json(model_dir, "config.json"), max_seq_len)
