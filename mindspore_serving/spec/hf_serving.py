"""Serving a Hugging Face model directory, as plain data: the settings asked for, the graphs they need, the key of
those graphs in the model cache, and the LLM configuration served from them. No file I/O here: the worker's
`llm/hf_model.py` reads the directory, exports and writes what these functions compute.

    settings = HfModelSettings(model_dir, "qwen2", tensor_parallel=2)   # serving_server.py --model, declare_llm
    max_len = served_max_model_len(settings, config_json)               # min(max_position_embeddings, 2048)
    model_file = export_model_file(settings, llama_config, max_len)     # the network and the cache's block size
    key = cache_key(file_digests, model_file, settings.tensor_parallel) # content + export settings
    llm = llm_config(settings, model_file, max_len, tokenizer, generation_config)   # the YAML's content

The graphs: the dynamic-shape step graphs of models/llama/step_graphs.py, for any batch, prompt length and
speculative proposal, over a KV cache of 16-token blocks; they hold max_model_len rounded up to the block size. The
engine runs up to DEFAULT_MAX_NUM_SEQS requests at once, with a step budget of DEFAULT_MAX_NUM_BATCHED_TOKENS
tokens. Speculative decoding (`speculative_config`, vLLM's JSON object of SpeculativeConfig fields) is llm.yaml's
engine.speculative; it needs nothing of the export.
"""

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mindspore_serving.llm.config import SpeculativeConfig
from mindspore_serving.llm.kv_budget import CacheGeometry, KvBudgetError, min_blocks, parse_size
from mindspore_serving.models.llama.config import ExportConfig, LlamaConfig, ModelFile
from mindspore_serving.models.llama.config import check_tensor_parallel as check_sharding
from mindspore_serving.models.llama.manifest import MANIFEST_VERSION

BLOCK_SIZE = 16
DEFAULT_MAX_MODEL_LEN = 2048
"""The default max model length is max_position_embeddings capped to this: what a CPU host serves in reasonable
memory and time (the KV cache and the prefill work grow with it)."""
DEFAULT_MAX_NUM_SEQS = 32
"""Requests decoded at once (engine.max_num_seqs)."""
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
"""Tokens of one engine step (engine.max_num_batched_tokens): the running requests' decode tokens, then prompt
tokens from as many waiting requests as fit, a long prompt in chunks. On the 0.5B shape (bench/llm_real.py) a step
costs about what its tokens cost past ~128 tokens, so a larger budget admits more prompts per step (a lower TTFT
under load) at the price of a slower step for the requests decoding beside them (docs/benchmarks.md)."""
DEFAULT_SEQUENCES_IN_CACHE = 4
"""Without a KV-cache budget the cache holds this many sequences of max_model_len (engine.num_blocks)."""
KEY_FILES = ("config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json")
"""The files of the directory whose content keys the graphs (when present), besides every weights file."""
LLM_CONFIG_FILE = "llm.yaml"
MODEL_CONFIG_FILE = "model.yaml"
GRAPHS_DIR = "graphs"
SERVABLES_DIR = "servables"
MARKER_FILE = "export.json"
"""Written last in a cache directory: the export there is complete (it holds the key)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


class HfModelError(ValueError):
    """A model directory or a setting that cannot be served; the message says which and how to fix it."""


def _positive_int(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise HfModelError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def default_served_name(model_dir: str) -> str:
    """The name a model directory is served under by default: its own name, with every character but letters,
    digits, '_' and '-' made '_' (servable names are Python package names' parts)."""
    base = os.path.basename(os.path.normpath(model_dir))
    name = re.sub(r"[^A-Za-z0-9_-]", "_", base).lstrip("_-")
    return name or "model"


@dataclass(frozen=True)
class HfModelSettings:
    """What serving a Hugging Face model directory was asked for (serving_server.py --model and its flags,
    `register.declare_llm(model_dir=...)`). Validated when built; errors name the setting."""

    model_dir: str
    """Absolute path of the directory (config.json, *.safetensors, tokenizer.json, ...)."""
    served_model_name: str
    """The servable name clients use (letters, digits, '_', '-')."""
    model_cache: str
    """Absolute path of the directory holding one cache directory per (name, key)."""
    tensor_parallel: int = 1
    max_model_len: int | None = None
    """None: what kv_cache_memory holds, up to max_position_embeddings; without a budget, max_position_embeddings
    capped to DEFAULT_MAX_MODEL_LEN (`served_max_model_len`)."""
    kv_cache_memory: None | int | str = None
    """KV-cache bytes per rank (engine.kv_cache_memory); None: engine.num_blocks for DEFAULT_SEQUENCES_IN_CACHE."""
    max_num_seqs: int | None = None
    """Requests decoded at once (engine.max_num_seqs); None: DEFAULT_MAX_NUM_SEQS."""
    max_num_batched_tokens: int | None = None
    """Tokens of one engine step (engine.max_num_batched_tokens); None: DEFAULT_MAX_NUM_BATCHED_TOKENS, or twice the
    decode tokens of a full batch when that is more."""
    device_type: str | None = None
    """The agents' device (None: the best available); the graphs are exported on it (None: CPU)."""
    device_ids: tuple[int, ...] = ()
    """The agents' device ids, one per rank (empty: 0 .. tensor_parallel - 1)."""
    speculative: SpeculativeConfig | None = None
    """n-gram speculative decoding (engine.speculative); None: off."""

    def __post_init__(self) -> None:
        if not isinstance(self.model_dir, str) or not self.model_dir:
            raise HfModelError(f"the model directory must be a path, got {self.model_dir!r}")
        if not isinstance(self.served_model_name, str) or not _NAME.fullmatch(self.served_model_name):
            raise HfModelError(
                f"served model name {self.served_model_name!r} is not valid: use letters, digits, "
                f"'_' and '-', starting with a letter or digit"
            )
        _positive_int("tensor_parallel", self.tensor_parallel)
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len, 2)
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        seqs = self.max_num_seqs or DEFAULT_MAX_NUM_SEQS
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < seqs:
            raise HfModelError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} is below max_num_seqs {seqs}, so the running "
                f"requests could not all decode in one step; raise it to >= {seqs} or lower max_num_seqs"
            )
        if self.kv_cache_memory is not None:
            try:
                parse_size(self.kv_cache_memory, "kv_cache_memory")
            except KvBudgetError as err:
                raise HfModelError(str(err)) from None
        if self.device_ids and len(self.device_ids) != self.tensor_parallel:
            raise HfModelError(
                f"{len(self.device_ids)} device id(s) {list(self.device_ids)} for tensor_parallel="
                f"{self.tensor_parallel}: give one device id per rank"
            )
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise HfModelError(f"speculative must be a SpeculativeConfig or None, got {self.speculative!r}")

    @classmethod
    def create(
        cls,
        model_dir: str,
        served_model_name: str | None = None,
        model_cache: str = "model_cache",
        speculative_config: Any = None,
        **settings: Any,
    ) -> "HfModelSettings":
        """Settings from a user's values: paths as given (the caller makes them absolute), the name defaulting to
        the directory's (`default_served_name`), `speculative_config` as `parse_speculative_config` takes it."""
        return cls(
            model_dir=model_dir,
            served_model_name=served_model_name or default_served_name(model_dir),
            model_cache=model_cache,
            speculative=parse_speculative_config(speculative_config),
            **settings,
        )


SPECULATIVE_EXAMPLE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'


def parse_speculative_config(value: None | str | Mapping[str, Any] | SpeculativeConfig) -> SpeculativeConfig | None:
    """The speculative decoding asked for, as vLLM's `--speculative_config` takes it: a JSON object of
    SpeculativeConfig fields (text, or the mapping it reads as), a SpeculativeConfig, or None / JSON null (off).
    HfModelError, saying what is wrong, for text that is not JSON, anything but an object, an unknown field or a
    bad value."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise HfModelError(
                f"speculative_config {value!r} is not JSON ({err}); give an object of "
                f"SpeculativeConfig fields, e.g. {SPECULATIVE_EXAMPLE}"
            ) from None
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if not isinstance(value, Mapping):
        raise HfModelError(
            f"speculative_config must be an object of SpeculativeConfig fields (or null: off), got "
            f"{value!r}; e.g. {SPECULATIVE_EXAMPLE}"
        )
    try:
        return SpeculativeConfig.of(value)
    except ValueError as err:
        raise HfModelError(f"speculative_config: {err}") from None


def speculative_per_model(values: Sequence[str], models: int) -> tuple[SpeculativeConfig | None, ...]:
    """The speculative decoding of each of `models` served models from the texts given (serving_server.py's
    repeatable --speculative_config): none, off for all; one, for all; one per model, in their order ("null": off
    for that one)."""
    if len(values) not in (0, 1, models):
        raise HfModelError(
            f"speculative_config is given {len(values)} time(s) for {models} model(s): give one "
            f"(every model), one per model in their order (null: none), or none"
        )
    configs = tuple(parse_speculative_config(value) for value in values)
    return configs * models if len(configs) == 1 else configs or (None,) * models


def served_max_model_len(
    settings: HfModelSettings, max_position_embeddings: int | None, cfg: LlamaConfig | None = None
) -> int:
    """The max model length served: the one asked for, which may not exceed max_position_embeddings; else
    max_position_embeddings capped to DEFAULT_MAX_MODEL_LEN, or, with a KV-cache budget (settings.kv_cache_memory)
    and the network `cfg`, the longest sequence the budget holds when that is more, up to max_position_embeddings
    and the model's sliding window (a budget that holds less is refused by `check_kv_cache_memory`)."""
    capped = min(max_position_embeddings or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)
    if settings.max_model_len is None and settings.kv_cache_memory is not None and cfg is not None:
        model_file = ModelFile(cfg, ExportConfig(block_size=BLOCK_SIZE))
        block_bytes = cache_geometry(model_file, settings.tensor_parallel).block_bytes
        # the budget's blocks less the scratch block; a sequence's last token is never cached
        held = (parse_size(settings.kv_cache_memory, "kv_cache_memory") // block_bytes - 1) * BLOCK_SIZE + 1
        limit = min(x for x in (max_position_embeddings, cfg.sliding_window, held) if x is not None)
        return max(capped, limit)
    if settings.max_model_len is None:
        return capped
    if max_position_embeddings is not None and settings.max_model_len > max_position_embeddings:
        raise HfModelError(
            f"max_model_len {settings.max_model_len} exceeds the model's max_position_embeddings "
            f"{max_position_embeddings}; lower it"
        )
    return settings.max_model_len


def graph_len(max_model_len: int) -> int:
    """The graphs' max_seq_len: max_model_len rounded up to the block size."""
    return -(-max_model_len // BLOCK_SIZE) * BLOCK_SIZE


def check_tensor_parallel(cfg: LlamaConfig, tp: int) -> None:
    """HfModelError unless the query heads, KV heads and MLP width split evenly over `tp` ranks (as the sharding
    of models/llama/model.py needs)."""
    try:
        check_sharding(cfg, tp, {"num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads"})
    except ValueError as err:
        raise HfModelError(str(err)) from None


def export_model_file(settings: HfModelSettings, cfg: LlamaConfig, max_model_len: int) -> ModelFile:
    """The network of `cfg` holding graph_len(max_model_len) tokens, and the cache's block size."""
    check_tensor_parallel(cfg, settings.tensor_parallel)
    try:
        model = dataclasses.replace(cfg, max_seq_len=graph_len(max_model_len))
        return ModelFile(model, ExportConfig(block_size=BLOCK_SIZE))
    except ValueError as err:
        raise HfModelError(str(err)) from None


def cache_geometry(model_file: ModelFile, tp: int) -> CacheGeometry:
    m = model_file.model
    assert m.head_dim is not None  # LlamaConfig derives it when not given
    return CacheGeometry(m.num_layers, m.num_kv_heads // tp, m.head_dim, model_file.export.block_size)


def check_kv_cache_memory(settings: HfModelSettings, model_file: ModelFile, max_model_len: int) -> int | None:
    """The KV-cache blocks of settings.kv_cache_memory (None without one); HfModelError when it cannot hold one
    sequence of max_model_len."""
    if settings.kv_cache_memory is None:
        return None
    given = settings.kv_cache_memory
    budget = parse_size(given, "kv_cache_memory")
    try:
        return cache_geometry(model_file, settings.tensor_parallel).blocks(
            max_model_len, budget, f"{budget} ({given})" if isinstance(given, str) else None
        )
    except KvBudgetError as err:
        raise HfModelError(f"kv_cache_memory: {err}") from None


def cache_key(file_digests: Mapping[str, str], model_file: ModelFile, tp: int) -> str:
    """Hex key of the graphs: the content of the directory's files (name -> sha256), the network (max_seq_len
    included) and block size, the tensor parallelism and the exporter's manifest format (graphs of another format
    are exported again). The served name, the engine (speculative decoding included) and the agents are not in it:
    they are read from llm.yaml at every start."""
    data = {
        "format": MANIFEST_VERSION,
        "files": dict(sorted(file_digests.items())),
        "model_file": model_file.to_dict(),
        "tensor_parallel": tp,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def cache_dir_name(name: str, key: str) -> str:
    return f"{name}-{key[:16]}"


def rank_dirs(tp: int) -> tuple[str, ...]:
    """The graph directories of the ranks, relative to the cache directory."""
    return tuple(f"{GRAPHS_DIR}/rank_{rank}" for rank in range(tp))


def default_num_blocks(max_model_len: int) -> int:
    """KV-cache blocks of DEFAULT_SEQUENCES_IN_CACHE sequences of max_model_len, plus the scratch block."""
    return DEFAULT_SEQUENCES_IN_CACHE * (min_blocks(max_model_len, BLOCK_SIZE) - 1) + 1


def llm_config(
    settings: HfModelSettings, model_file: ModelFile, max_model_len: int, tokenizer: str, generation_config: str | None
) -> dict[str, Any]:
    """The LLM configuration (the YAML's content, docs/llm/configuration.md) of the exported graphs; paths of
    the cache directory relative to it, `tokenizer` and `generation_config` as given. The chat template is the
    model's own (next to the tokenizer). The engine runs as the bundled model's does: continuous batching, prefix
    caching, chunked prefill, rounds of 4 greedy steps, async scheduling; speculative decoding as
    settings.speculative says."""
    max_num_seqs = settings.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    model = {
        "config": MODEL_CONFIG_FILE,
        "graphs": list(rank_dirs(settings.tensor_parallel)),
        "tensor_parallel": settings.tensor_parallel,
        "tokenizer": tokenizer,
    }
    if generation_config is not None:
        model["generation_config"] = generation_config
    # prompt tokens beside a full decode batch, each row with its proposed tokens when it speculates
    decode_tokens = max_num_seqs * (1 + (settings.speculative.num_speculative_tokens if settings.speculative else 0))
    engine = {
        "batching": "continuous",
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens
        or max(DEFAULT_MAX_NUM_BATCHED_TOKENS, 2 * decode_tokens),
    }
    if settings.kv_cache_memory is not None:
        engine["kv_cache_memory"] = settings.kv_cache_memory
    else:
        engine["num_blocks"] = default_num_blocks(max_model_len)
    engine.update(
        {
            "enable_prefix_caching": True,
            "enable_chunked_prefill": True,
            "num_scheduler_steps": 4,
            "async_scheduling": True,
            "max_queue_size": 256,
            "request_timeout": 0,
        }
    )
    if settings.speculative is not None:
        engine["speculative"] = dataclasses.asdict(settings.speculative)
    agents = {
        "device_type": settings.device_type,
        "device_ids": list(settings.device_ids or range(settings.tensor_parallel)),
        "host": "127.0.0.1",
        "start_port": 0,
        "cpu_affinity": "auto",
    }
    return {"model": model, "engine": engine, "agents": agents}


def llm_config_header(settings: HfModelSettings) -> str:
    """The comment that opens the written llm.yaml."""
    return (
        f"# The LLM configuration serving {settings.served_model_name} (docs/llm/configuration.md), written\n"
        f"# from the Hugging Face directory {settings.model_dir!r}\n"
        f"# at every start of serving_server.py --model (or register.declare_llm(model_dir=...)): to keep your\n"
        f"# edits, copy this directory's llm.yaml and serve it with register.declare_llm(config_file=...).\n"
        f"# The weights are in each graphs/rank_*/weights.safetensors; model.checkpoint is not used.\n"
    )


def servable_config_source(settings: HfModelSettings) -> str:
    """servable_config.py of the written servable `<cache>/servables/<name>/`: declares the LLM of llm.yaml."""
    return (
        f'"""Servable `{settings.served_model_name}`: a Hugging Face model served from the LLM configuration '
        f'../../{LLM_CONFIG_FILE}\n(written with this file by serving_server.py --model)."""\n'
        f"# model directory: {settings.model_dir!r}\n"
        "from mindspore_serving.server import register\n\n"
        f'register.declare_llm(config_file="../../{LLM_CONFIG_FILE}")\n'
    )
