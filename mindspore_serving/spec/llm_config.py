"""The YAML configuration of an LLM servable (e.g. config/llama_tiny.yaml), validated when loaded.

Sections (relative paths are relative to the YAML file's own directory):

    model:
      config: <model YAML with `model:` and `export:` sections>      (required)
      checkpoint: <.ckpt>            weights the graphs are exported from (null: seeded random init)
      graphs: [<dir of rank 0>, ...] exported MindIR graphs + manifest.json, one directory per rank
      tensor_parallel: <int>         ranks the model is sharded over (default: the number of graph directories);
                                     > 1 runs the agents as a MindSpore cluster, one rank per agent
      tokenizer: <tokenizer.json>    any Hugging Face tokenizer.json (or its directory)
      chat_template: <file.jinja>    the chat template (Jinja, Hugging Face's conventions), a file or the template
                                     itself; default: the model's own, chat_template.jinja or tokenizer_config.json's
                                     `chat_template` next to the tokenizer. Still read: the old Python format string
                                     with {messages}, each message rendered by `chat_message` ({role}, {content})
      generation_config: <file>      generation_config.json: eos_token_id (one or a list) and the default
                                     temperature, top_p, top_k, repetition_penalty (a request's own values win);
                                     default: generation_config.json next to the tokenizer, when there is one
      tool_call_parser: <name>       the format the model writes tool calls in (llm/tool_call_formats.py):
                                     hermes | llama3_json; default: the one its chat template prompts for, if any
      export: {<field>: <value>}     ExportConfig fields that replace the model YAML's `export:` ones for this
                                     configuration's graphs (e.g. {block_size: 32}), so that several servables share
                                     one model file
    engine:                          the scheduler (mindspore_serving.llm.config.SchedulerConfig fields)
      max_num_seqs, max_num_batched_tokens, max_model_len, num_blocks, batching, enable_prefix_caching,
      enable_chunked_prefill, max_prefill_tokens_per_step, max_prefills_per_decode_step, num_scheduler_steps,
      async_scheduling, max_prompt_chars
      speculative: {method: ngram, num_speculative_tokens: k, prompt_lookup_min, prompt_lookup_max,
                    disable_by_batch_size}
                                     speculative decoding (llm/config.py SpeculativeConfig); any export verifies
                                     proposals in the step that computes them
      kv_cache_memory: <bytes>       size the KV cache from a budget per rank instead of num_blocks: an int or
                                     "2GiB", "512MiB", "1.5GB" (needs the graphs' manifest; too little for one
                                     sequence of max_model_len is refused)
      kv_cache_memory_fraction: <f>  or from this share (0-1] of the memory available to a rank, less its weights,
                                     measured when the agents start (CPU: MemAvailable, shared by the host's
                                     ranks). At most one of num_blocks, kv_cache_memory, kv_cache_memory_fraction
      max_queue_size: <int>          requests waiting beyond the running ones before new ones are refused
      request_timeout: <seconds>     per-request deadline (0 = none)
      stats_interval: <seconds>      an INFO line of engine statistics this often while busy and when it goes
                                     idle (0 = never; default 10)
    agents:
      device_type: CPU | GPU | Ascend | null (best available)
      device_ids: [0]                one agent per rank, rank r on device_ids[r]
      host: 127.0.0.1
      start_port: 7100               rank r listens on host:start_port+r; 0 (default) = unix sockets in the
                                     server's runtime directory, agents started by the worker
      rank_hosts: [h0, h1, ...]      optional, one host per rank: rank r listens on rank_hosts[r]:start_port+r. The
                                     worker starts the ranks on its own host (`host`); the others are started on
                                     their host with `start_agent.py --rank_start K` (needs start_port and
                                     scheduler_address)
      scheduler_address: host:port   the cluster scheduler of a tensor-parallel group (default: a free port on
                                     `host`); it runs beside rank 0
      heartbeat_interval: 1.0        seconds between the worker's pings of each rank
      heartbeat_misses: 3            unanswered pings after which a rank counts as lost (the group is restarted)
      warmup: true                   compile the step graphs before the agent reports ready (true, the default),
                                     or false: on the first step, which then takes the compile (about a second)
      cpu_affinity: null | auto | [[cores of rank 0], ...]
                                     CPU cores each agent process is bound to. auto: on a CPU device, rank r gets an
                                     equal share of the cores but one (left to the master and the worker), the
                                     highest-numbered first; on GPU/Ascend, no binding. null: no binding.

Every error names the field and how to fix it.
"""

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

from mindspore_serving.common.cpu_affinity import allowed_cpus
from mindspore_serving.llm.chat_template import ChatTemplate
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.generation_defaults import GenerationDefaults
from mindspore_serving.llm.kv_budget import (
    FRACTION,
    MEMORY,
    CacheGeometry,
    KvBudgetError,
    KvCacheBudget,
    choose_budget,
    min_blocks,
)
from mindspore_serving.llm.tool_call_formats import TOOL_CALL_PARSERS
from mindspore_serving.models.llama.config import ModelFile, load_config

LEGACY_CHAT_MESSAGE = "<|{role}|>\n{content}\n"
"""The per-message format of an old-style chat_template given without `chat_message`."""
GENERATION_CONFIG_FILE = "generation_config.json"


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field and the fix."""


def _section(data: Mapping, name: str, required: bool = True) -> Mapping:
    value = data.get(name)
    if value is None:
        if required:
            raise ConfigError(f"'{name}' section is missing; add '{name}:' to the configuration")
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"'{name}' must be a mapping of fields, got {type(value).__name__}")
    return value


def _reject_unknown(section: str, data: Mapping, known: Iterable[str]) -> None:
    known = set(known)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"'{section}' has unknown field(s) {unknown}; valid fields are {sorted(known)}")


def _path(base: str, section: str, name: str, value: object, must_exist: bool = True) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"'{section}.{name}' must be a path string, got {value!r}")
    path = value if os.path.isabs(value) else os.path.normpath(os.path.join(base, value))
    if must_exist and not os.path.exists(path):
        raise ConfigError(
            f"'{section}.{name}': '{path}' does not exist; fix the path (relative paths are relative "
            f"to the configuration file's directory)"
        )
    return path


@dataclass(frozen=True)
class ModelSection:
    config: str
    checkpoint: str | None
    graphs: tuple[str, ...]
    tokenizer: str
    chat_template: str | None = None
    """The template text `model.chat_template` gives (Jinja; or the old format string when chat_message is set);
    None: the model's own, next to the tokenizer."""
    chat_message: str | None = None
    """Set only for an old-style chat_template (a Python format string): how each message is rendered."""
    tensor_parallel: int = 1
    generation_config: str | None = None
    """The generation_config.json the defaults come from, or None."""
    generation_defaults: GenerationDefaults = field(default_factory=GenerationDefaults, compare=False)
    tool_call_parser: str | None = None
    """The format of the model's tool calls (a TOOL_CALL_PARSERS name); None: the chat template's, if any."""
    export: tuple[tuple[str, Any], ...] = ()
    """(ExportConfig field, value) of `model.export`: replace the model file's export fields for these graphs."""


@dataclass(frozen=True)
class AgentSection:
    device_type: str | None = None
    device_ids: tuple[int, ...] = (0,)
    host: str = "127.0.0.1"
    start_port: int = 0
    cpu_affinity: None | str | tuple[tuple[int, ...], ...] = None
    rank_hosts: tuple[str, ...] | None = None
    scheduler_address: str | None = None
    heartbeat_interval: float = 1.0
    heartbeat_misses: int = 3
    warmup: bool = True

    def host_of(self, rank: int) -> str:
        return self.rank_hosts[rank] if self.rank_hosts else self.host

    def address(self, rank: int) -> str:
        return f"{self.host_of(rank)}:{self.start_port + rank}"

    @property
    def num_ranks(self) -> int:
        return len(self.device_ids)

    def ranks_on(self, host: str) -> list[int]:
        """The ranks that run on `host`."""
        return [rank for rank in range(self.num_ranks) if self.host_of(rank) == host]

    @property
    def local_ranks(self) -> list[int]:
        """The ranks the worker starts itself: those on its own host."""
        return self.ranks_on(self.host)

    def cpus_of(self, rank: int, device: str, cpu_count: int | None = None) -> list[int] | None:
        """The cores rank `rank`'s agent binds to on `device`, or None (no binding).

        auto, on CPU: MindSpore's CPU runtime keeps two threads busy per graph call (one spinning while the other
        computes), so an unbound agent takes every core of a small host from the worker and the master; bound to
        its share it runs its steps as fast (small graphs) and leaves them a core.
        """
        if self.cpu_affinity is None:
            return None
        if not isinstance(self.cpu_affinity, str):  # not auto: the cores of each rank
            return list(self.cpu_affinity[rank])
        if device.upper() != "CPU":
            return None
        cores = allowed_cpus() if cpu_count is None else list(range(cpu_count))
        if len(cores) <= self.num_ranks:
            return [cores[rank % len(cores)]]
        share = (len(cores) - 1) // self.num_ranks
        end = len(cores) - rank * share
        return cores[end - share : end]


@dataclass(frozen=True)
class LlmServingConfig:
    path: str
    model: ModelSection
    engine: SchedulerConfig
    agents: AgentSection
    max_queue_size: int = 256
    request_timeout: float = 0.0
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    stats_interval: float = 10.0
    kv_cache: KvCacheBudget = field(default_factory=KvCacheBudget)
    """How the KV cache is sized. kv_cache_memory: engine.num_blocks is what the budget holds (computed at load from
    rank 0's manifest; before the graphs are exported, the least that holds one sequence). kv_cache_memory_fraction:
    engine.num_blocks is that least until the agents' starter measures the memory (worker/llm/kv_cache.py)."""

    def model_file(self) -> ModelFile:
        """The model file, its export section merged with `model.export`: what the graphs are exported from."""
        return _model_file(self.model)

    def stale_graphs(self) -> str | None:
        """Why the exported graphs no longer match the model config (network, block size or tensor parallelism
        changed), or None."""
        wanted = self.model_file().to_dict()
        for rank, graphs_dir in enumerate(self.model.graphs):
            with open(os.path.join(graphs_dir, "manifest.json"), encoding="utf-8") as stream:
                manifest = json.load(stream)
            if manifest.get("model") != wanted["model"] or manifest.get("export") != wanted["export"]:
                return f"{graphs_dir} was exported with another model config"
            if manifest.get("tensor_parallel", {"size": 1, "rank": 0}) != {
                "size": self.model.tensor_parallel,
                "rank": rank,
            }:
                return f"{graphs_dir} is not rank {rank} of a {self.model.tensor_parallel}-way export"
        return None

    def with_agent_port(self, start_port: int) -> "LlmServingConfig":
        agents = dataclasses.replace(self.agents, start_port=start_port)
        return dataclasses.replace(self, agents=agents)


_ENGINE_EXTRA = ("max_queue_size", "request_timeout", "stats_interval", MEMORY, FRACTION)


def read_manifest(graphs_dir: str) -> dict[str, Any] | None:
    """The manifest.json of an exported graph directory, or None when there is none yet."""
    path = os.path.join(graphs_dir, "manifest.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as stream:
        manifest: dict[str, Any] = json.load(stream)
    return manifest


def _kv_cache(data: Mapping, kwargs: dict, graphs_dir: str) -> KvCacheBudget:
    """The engine section's KV-cache budget; with a memory form, sets kwargs' num_blocks from it."""
    try:
        budget = choose_budget(data)
    except KvBudgetError as err:
        raise ConfigError(f"'engine': {err}") from None
    if not budget.from_memory:
        return budget
    max_model_len = kwargs["max_model_len"]
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
        return budget  # SchedulerConfig says what is wrong with it
    # the least that holds one sequence: what SchedulerConfig checks until the budget is resolved
    kwargs["num_blocks"] = min_blocks(max_model_len, kwargs["block_size"])
    if budget.kind == FRACTION:  # measured when the agents start
        return budget
    try:
        manifest = read_manifest(graphs_dir)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"'model.graphs': cannot read the manifest of {os.path.basename(graphs_dir)}: {err}"
        ) from None
    if manifest is not None:  # else not exported yet: the export reads this configuration too
        try:
            given = data[MEMORY]
            kwargs["num_blocks"] = CacheGeometry.from_manifest(manifest).blocks(
                max_model_len, int(budget.value), f"{budget.value} ({given})" if isinstance(given, str) else None
            )
        except KvBudgetError as err:
            raise ConfigError(f"'engine.{MEMORY}': {err}") from None
    return budget


def _model_file(model: ModelSection) -> ModelFile:
    """The model YAML of `model.config` with `model.export` merged over its export section."""
    try:
        model_file = load_config(model.config)
    except ValueError as err:
        raise ConfigError(f"'model.config' ({model.config}): {err}") from None
    if not model.export:
        return model_file
    try:
        return ModelFile(model_file.model, model_file.export.merged(dict(model.export)))
    except ValueError as err:
        raise ConfigError(f"'model.export': {err}") from None


def _export_overrides(value: object) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(f"'model.export' must be a mapping of export fields (e.g. {{block_size: 32}}), got {value!r}")
    return tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in value.items())


def _model_section(base: str, data: Mapping, num_ranks: int) -> ModelSection:
    known = (
        "config",
        "checkpoint",
        "graphs",
        "tokenizer",
        "chat_template",
        "chat_message",
        "tensor_parallel",
        "generation_config",
        "tool_call_parser",
        "export",
    )
    _reject_unknown("model", data, known)
    if "config" not in data:
        raise ConfigError("'model.config' is missing; point it at the model YAML (sections model: and export:)")
    graphs = data.get("graphs")
    if isinstance(graphs, str):
        graphs = [graphs]
    if not isinstance(graphs, list) or not graphs:
        raise ConfigError(f"'model.graphs' must list one exported-graph directory per rank, got {graphs!r}")
    if len(graphs) not in (1, num_ranks):
        raise ConfigError(
            f"'model.graphs' lists {len(graphs)} directories but 'agents.device_ids' has {num_ranks} "
            f"ranks; give one directory, or one per rank"
        )
    tp = data.get("tensor_parallel", len(graphs))
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"'model.tensor_parallel' must be an int >= 1, got {tp!r}")
    if tp > 1 and not len(graphs) == tp == num_ranks:
        raise ConfigError(
            f"'model.tensor_parallel' is {tp}: list one graph directory per rank in 'model.graphs' "
            f"(has {len(graphs)}) and one device per rank in 'agents.device_ids' (has {num_ranks})"
        )
    checkpoint = data.get("checkpoint")
    tokenizer = _path(base, "model", "tokenizer", data.get("tokenizer"))
    template, message = _chat_template(base, data.get("chat_template"), data.get("chat_message"))
    generation_config, defaults = _generation_config(base, data.get("generation_config"), tokenizer)
    parser = data.get("tool_call_parser")
    if parser is not None and parser not in TOOL_CALL_PARSERS:
        raise ConfigError(
            f"'model.tool_call_parser' must be one of {list(TOOL_CALL_PARSERS)} or null (the chat "
            f"template's), got {parser!r}"
        )
    return ModelSection(
        config=_path(base, "model", "config", data["config"]),
        checkpoint=_path(base, "model", "checkpoint", checkpoint) if checkpoint is not None else None,
        graphs=tuple(_path(base, "model", "graphs", g, must_exist=False) for g in graphs),
        tokenizer=tokenizer,
        chat_template=template,
        chat_message=message,
        tensor_parallel=tp,
        generation_config=generation_config,
        generation_defaults=defaults,
        tool_call_parser=parser,
        export=_export_overrides(data.get("export")),
    )


def _chat_template(base: str, value: object, message: object) -> tuple[str | None, str | None]:
    """(template text, chat_message) of `model.chat_template`: a Jinja file or inline Jinja, or the old Python
    format string with {messages} (then with chat_message, by default LEGACY_CHAT_MESSAGE)."""
    if message is not None and not isinstance(message, str):
        raise ConfigError(f"'model.chat_message' must be a string, got {message!r}")
    if value is None:
        if message is not None:
            raise ConfigError(
                "'model.chat_message' goes with an old-style 'model.chat_template' (a format string "
                "with {messages}); remove it, or give that template"
            )
        return None, None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"'model.chat_template' must be a template file or a template, got {value!r}")
    is_jinja = "{{" in value or "{%" in value
    if not is_jinja and "{messages}" in value:
        return value, message if message is not None else LEGACY_CHAT_MESSAGE
    if message is not None:
        raise ConfigError(
            "'model.chat_message' goes only with an old-style 'model.chat_template' (a format string "
            "with {messages}); a Jinja template renders the messages itself: remove chat_message"
        )
    where = "model.chat_template"
    if not is_jinja:
        path = _path(base, "model", "chat_template", value)
        where = os.path.basename(path)
        try:
            with open(path, encoding="utf-8") as stream:
                value = stream.read()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"'model.chat_template': cannot read {where}: {err}") from None
    try:
        ChatTemplate(value)
    except ValueError as err:
        raise ConfigError(f"'model.chat_template' ({where}): {err}") from None
    return value, None


def _generation_config(base: str, value: object, tokenizer: str) -> tuple[str | None, GenerationDefaults]:
    """The generation_config.json of the model (named, or next to the tokenizer) and its defaults."""
    if value is None:
        directory = tokenizer if os.path.isdir(tokenizer) else os.path.dirname(tokenizer)
        path = os.path.join(directory, GENERATION_CONFIG_FILE)
        if not os.path.isfile(path):
            return None, GenerationDefaults()
    else:
        path = _path(base, "model", "generation_config", value)
    name = os.path.basename(path)
    try:
        with open(path, encoding="utf-8") as stream:
            data = json.load(stream)
    except (OSError, ValueError) as err:
        raise ConfigError(f"'model.generation_config' ({name}) is not readable JSON: {err}") from None
    try:
        return path, GenerationDefaults.from_config(data)
    except ValueError as err:
        raise ConfigError(f"'model.generation_config' ({name}): {err}") from None


def _agent_section(data: Mapping) -> AgentSection:
    _reject_unknown("agents", data, [f.name for f in fields(AgentSection)])
    device_type = data.get("device_type")
    if device_type is not None and (
        not isinstance(device_type, str) or device_type.lower() not in ("cpu", "gpu", "ascend", "none")
    ):
        raise ConfigError(f"'agents.device_type' must be CPU, GPU, Ascend or null, got {device_type!r}")
    ids = data.get("device_ids", [0])
    if isinstance(ids, int) and not isinstance(ids, bool):
        ids = [ids]
    if not isinstance(ids, list) or not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ConfigError(f"'agents.device_ids' must be a non-empty list of ints >= 0, got {ids!r}")
    host = data.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"'agents.host' must be an address string, got {host!r}")
    port = data.get("start_port", 0)
    if isinstance(port, bool) or not isinstance(port, int) or not (port == 0 or 1 <= port <= 65535 - len(ids)):
        raise ConfigError(
            f"'agents.start_port' must be 0 (free ports) or a port in [1, {65535 - len(ids)}], got {port!r}"
        )
    rank_hosts = data.get("rank_hosts")
    if rank_hosts is not None:
        if (
            not isinstance(rank_hosts, list)
            or len(rank_hosts) != len(ids)
            or any(not isinstance(h, str) or not h for h in rank_hosts)
        ):
            raise ConfigError(f"'agents.rank_hosts' must list one host per rank ({len(ids)}), got {rank_hosts!r}")
        if set(rank_hosts) != {host} and not port:
            raise ConfigError(
                "'agents.rank_hosts' puts ranks on other hosts: set 'agents.start_port' (the worker "
                "must know where they listen) and 'agents.scheduler_address'"
            )
        rank_hosts = tuple(rank_hosts)
    scheduler = data.get("scheduler_address")
    if scheduler is not None:
        name, sep, sched_port = str(scheduler).rpartition(":")
        if (
            not isinstance(scheduler, str)
            or not sep
            or not name
            or not sched_port.isdigit()
            or not 1 <= int(sched_port) <= 65535
        ):
            raise ConfigError(f"'agents.scheduler_address' must be host:port, got {scheduler!r}")
    elif rank_hosts is not None and set(rank_hosts) != {host}:
        raise ConfigError(
            "'agents.rank_hosts' puts ranks on other hosts: set 'agents.scheduler_address' "
            "(host:port of the cluster scheduler, on the host of rank 0) for them to join"
        )
    interval = data.get("heartbeat_interval", 1.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise ConfigError(f"'agents.heartbeat_interval' must be a number of seconds > 0, got {interval!r}")
    misses = data.get("heartbeat_misses", 3)
    if isinstance(misses, bool) or not isinstance(misses, int) or misses < 1:
        raise ConfigError(f"'agents.heartbeat_misses' must be an int >= 1, got {misses!r}")
    warmup = data.get("warmup", True)
    if not isinstance(warmup, bool):
        raise ConfigError(f"'agents.warmup' must be true or false, got {warmup!r}")
    return AgentSection(
        device_type,
        tuple(ids),
        host,
        port,
        _cpu_affinity(data.get("cpu_affinity"), len(ids)),
        rank_hosts,
        scheduler,
        float(interval),
        misses,
        warmup,
    )


def _cpu_affinity(value: object, num_ranks: int) -> None | str | tuple[tuple[int, ...], ...]:
    if value is None or value == "auto":
        return value
    if (
        not isinstance(value, list)
        or len(value) != num_ranks
        or any(not isinstance(cores, list) or not cores for cores in value)
        or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for cores in value for c in cores)
    ):
        raise ConfigError(
            f"'agents.cpu_affinity' must be null, auto, or one non-empty list of core ids >= 0 per "
            f"rank ({num_ranks} rank(s)), got {value!r}"
        )
    return tuple(tuple(cores) for cores in value)


def _engine_section(
    data: Mapping, max_seq_len: int, block_size: int, graphs_dir: str
) -> tuple[SchedulerConfig, int, dict[str, float], KvCacheBudget]:
    known = [f.name for f in fields(SchedulerConfig)] + list(_ENGINE_EXTRA)
    _reject_unknown("engine", data, known)
    kwargs = {k: v for k, v in data.items() if k not in _ENGINE_EXTRA}
    kwargs.setdefault("max_model_len", max_seq_len)
    if kwargs.get("block_size", block_size) != block_size:
        raise ConfigError(
            f"'engine.block_size' is {kwargs['block_size']} but the graphs were exported with "
            f"block_size {block_size}; remove engine.block_size or re-export"
        )
    kwargs["block_size"] = block_size
    if kwargs["max_model_len"] > max_seq_len:
        raise ConfigError(
            f"'engine.max_model_len' {kwargs['max_model_len']} exceeds the model's max_seq_len {max_seq_len}; lower it"
        )
    kv_cache = _kv_cache(data, kwargs, graphs_dir)
    try:
        scheduler = SchedulerConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"'engine': {err}") from None
    queue = data.get("max_queue_size", 256)
    if isinstance(queue, bool) or not isinstance(queue, int) or queue < 1:
        raise ConfigError(f"'engine.max_queue_size' must be an int >= 1, got {queue!r}")
    seconds = {}
    for name, default, zero in (("request_timeout", 0, "none"), ("stats_interval", 10, "never")):
        value = data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"'engine.{name}' must be a number of seconds >= 0 (0 = {zero}), got {value!r}")
        seconds[name] = float(value)
    return scheduler, queue, seconds, kv_cache


def load_serving_config(path: str, check_graphs: bool = True) -> LlmServingConfig:
    """The validated LLM configuration of the YAML file `path`. `check_graphs` (kept for callers) changes nothing:
    the graphs' manifest is read only to size the KV cache from engine.kv_cache_memory, when it exists."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"LLM configuration file '{path}' does not exist")
    with open(path, encoding="utf-8") as stream:
        try:
            data = yaml.safe_load(stream) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"'{path}' is not valid YAML: {err}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"'{path}' must hold a mapping with sections model, engine and agents")
    _reject_unknown("<top level>", data, ("model", "engine", "agents"))
    base = os.path.dirname(path)
    agents = _agent_section(_section(data, "agents", required=False))
    model = _model_section(base, _section(data, "model"), agents.num_ranks)
    model_file = _model_file(model)
    engine, queue, seconds, kv_cache = _engine_section(
        _section(data, "engine", required=False),
        model_file.model.max_seq_len,
        model_file.export.block_size,
        model.graphs[0],
    )
    return LlmServingConfig(
        path, model, engine, agents, queue, seconds["request_timeout"], dict(data), seconds["stats_interval"], kv_cache
    )
