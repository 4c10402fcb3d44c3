"""`mindspore-serving serve` (and `python serving_server.py`): serves the bundled servables, or a Hugging Face model
directory: gRPC on 127.0.0.1:5500 and RESTful on 127.0.0.1:1500 by default.

    mindspore-serving serve [--grpc 127.0.0.1:5500] [--rest 127.0.0.1:1500] [--servables add,lenet] [--device_type CPU]
                            [--servable_directory DIR] [--grace 10] [--metrics 127.0.0.1:9090] [--frontend_processes 1]
                            [--api_key KEY | --api_key_file PATH]
                            [--model_control none|explicit|poll [--version_policy latest:1] [--poll_interval 0.5]]
    mindspore-serving serve --model <hf_dir> [--served_model_name NAME] [--tensor_parallel N] [--max_model_len L]
                            [--kv_cache_memory 2GiB] [--model_cache DIR] [--prepare_only]
                            [--speculative_config '{"method": "ngram", "num_speculative_tokens": 4}'] [...]

The servables are read from --servable_directory: by default ./servables for `mindspore-serving serve` (run it from
a checkout of the repository, or name the directory), and the servables/ beside the script for serving_server.py. A
relative --servable_directory is resolved against the current directory for `mindspore-serving serve`, against the
script's directory for serving_server.py (as MindSpore Serving resolves the paths given to its API).

--model (repeatable) serves a LLaMA, Mistral, Qwen2 or Qwen3 directory of Hugging Face's layout under NAME (default:
the directory's name) on every LLM API. Its graphs are exported into --model_cache when missing there (a line per
phase), keyed by the checkpoint's content and the export settings; the LLM configuration served from is written
beside them, and its path printed (docs/llm/own-model.md). --speculative_config turns on n-gram
speculative decoding as vLLM's flag does.

Ctrl-C or SIGTERM stops both front ends at once (new requests are refused), gives requests in flight --grace
seconds to finish, answers those still running with an unavailable error, then ends every worker.
"""

import argparse
import os
import sys
from collections.abc import Sequence

from mindspore_serving import server
from mindspore_serving.server.master import context
from mindspore_serving.spec.hf_serving import HfModelError, HfModelSettings, speculative_per_model
from mindspore_serving.worker.llm import hf_model

REMOVED_FLAGS = ("decode_batch_buckets", "prefill_batch_buckets", "prefill_len_buckets")
"""Flags of the per-shape graphs, gone with them; refused with what replaces them."""

CLASSIC_SERVABLES = ("add", "add_sub", "matmul", "lenet")
DEFAULT_SERVABLES = CLASSIC_SERVABLES + ("llama_tiny",)


def build_parser(servable_directory: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The flags of the command; `servable_directory` is --servable_directory's default."""

    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grpc", default="127.0.0.1:5500", help="gRPC address, ip:port or unix:<path>")
    parser.add_argument("--rest", default="127.0.0.1:1500", help="RESTful address, ip:port ('' to disable)")
    parser.add_argument(
        "--servables",
        default=None,
        help=f"comma-separated servable names (default: {','.join(DEFAULT_SERVABLES)}; with "
        f"--model_control poll, every servable of the directory)",
    )
    parser.add_argument(
        "--servable_directory",
        default=servable_directory,
        help="directory holding the servables (default: %(default)s)",
    )
    parser.add_argument("--device_type", default=None, help="CPU, GPU or Ascend (default: the best available)")
    parser.add_argument("--device_ids", default="0", help="comma-separated device ids")
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds requests in flight get to finish on SIGTERM/Ctrl-C (default 10)",
    )
    parser.add_argument(
        "--metrics",
        default="",
        help="ip:port of a separate Prometheus /metrics port (the RESTful port serves /metrics too)",
    )
    parser.add_argument(
        "--frontend_processes",
        type=int,
        default=1,
        help="processes serving the gRPC and RESTful ports (default 1: the master alone); more "
        "spread the requests' CPU work over cores (SO_REUSEPORT)",
    )
    parser.add_argument(
        "--api_key",
        default=None,
        help="require this key on every request but the health probes (Authorization: Bearer <key>, "
        "or x-api-key); default: the environment's MS_SERVING_API_KEY",
    )
    parser.add_argument("--api_key_file", default=None, help="the same, read from this file's first line")
    parser.add_argument(
        "--restricted_api",
        action="append",
        default=[],
        metavar="GROUPS=KEY",
        help="API groups (comma-separated) that need KEY instead of --api_key, e.g. "
        "model-repository,admin=ADMIN_KEY; repeatable. Groups: health, metadata, metrics, "
        "model-repository, admin (/docs, /openapi.json, /ready's details), inference",
    )
    parser.add_argument(
        "--open_api",
        default="",
        metavar="GROUPS",
        help="API groups (comma-separated) that need no key, e.g. metrics for a Prometheus scraper",
    )
    parser.add_argument(
        "--model_control",
        choices=("none", "explicit", "poll"),
        default="none",
        help="none (default): clients cannot load or unload servables (403 / PERMISSION_DENIED); "
        "explicit: KServe v2 repository load/unload on request; poll: watch the servable "
        "directory, loading and unloading versions as folders come and go and reloading a "
        "changed servable_config.py",
    )
    parser.add_argument(
        "--version_policy",
        default="latest:1",
        help="with --model_control poll: latest:N, all or specific:V1,V2; ';'-separated name=policy "
        "items set one servable's (default latest:1)",
    )
    parser.add_argument("--poll_interval", type=float, default=0.5, help="seconds between two scans (default 0.5)")
    limits = parser.add_argument_group(
        "limits",
        "what one client may hold of the server (413/429 or RESOURCE_EXHAUSTED beyond, with a text naming the flag)",
    )
    limits.add_argument(
        "--llm_payload_limit",
        type=int,
        default=None,
        metavar="BYTES",
        help="body limit of the LLM routes: OpenAI, TGI, MindSpore LLM (default 2000000; the classic "
        "and KServe routes keep 100 MiB)",
    )
    limits.add_argument(
        "--read_timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="close a connection whose request head has not arrived, or whose body stalls, "
        "within this long (default 10)",
    )
    limits.add_argument(
        "--idle_timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="close a keep-alive connection without a request (gRPC: without an open call) "
        "after this long (default 100)",
    )
    limits.add_argument("--max_connections", type=int, default=None, help="open RESTful connections (default 2048)")
    limits.add_argument("--max_concurrent_rpcs", type=int, default=None, help="gRPC calls at once (default 2048)")
    limits.add_argument(
        "--max_watch_streams", type=int, default=None, help="open grpc.health.v1 Watch streams (default 1000)"
    )
    parser.add_argument(
        "--max_enqueued_mb",
        type=int,
        default=None,
        help="MiB of requests the master holds at once, beyond which new ones are refused (default 1024)",
    )
    _add_model_arguments(parser)
    return parser


def parse_args(
    argv: Sequence[str] | None = None, *, prog: str | None = None, base_directory: str | None = None
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the parsed flags, --servable_directory made absolute against `base_directory` (default: the
    current directory), which also holds the default servables/."""
    base = os.path.abspath(base_directory or os.getcwd())
    parser = build_parser(os.path.join(base, "servables"), prog)
    args = parser.parse_args(argv)
    args.servable_directory = os.path.join(base, args.servable_directory)
    return parser, args


def main(argv: Sequence[str] | None = None, *, prog: str | None = None, base_directory: str | None = None) -> None:
    """Starts the servables and the front ends the flags ask for, and returns: the server runs on in its threads
    until Ctrl-C or SIGTERM."""
    parser, args = parse_args(argv, prog=prog, base_directory=base_directory)
    hf_servables = _prepare_models(parser, args)
    if args.prepare_only:
        return
    context.set_request_limits(
        llm_payload_bytes=args.llm_payload_limit,
        read_timeout=args.read_timeout,
        max_connections=args.max_connections,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        max_watch_streams=args.max_watch_streams,
        idle_timeout=args.idle_timeout,
    )
    if args.max_enqueued_mb is not None:
        context.set_max_enqueued_bytes(args.max_enqueued_mb << 20)
    context.set_stop_grace(args.grace)
    context.set_frontend_processes(args.frontend_processes)
    if args.api_key is not None or args.api_key_file is not None:
        context.set_api_key(args.api_key, args.api_key_file)
    restricted = {}
    for item in args.restricted_api:
        groups, sep, key = item.partition("=")
        if not sep:
            parser.error(f"--restricted_api {item!r}: expected GROUPS=KEY")
        restricted[groups] = key
    context.set_api_groups(restricted, [g for g in args.open_api.split(",") if g.strip()])

    device_ids = tuple(int(x) for x in args.device_ids.split(",") if x.strip())
    if args.model_control == "explicit":
        context.set_model_control("explicit")
    if args.model_control == "poll":
        names = [name for name in (args.servables or "").split(",") if name.strip()]
        server.start_model_control_poll(
            args.servable_directory, names, args.version_policy, device_ids, args.device_type, args.poll_interval
        )
    else:
        listed = args.servables if args.servables is not None or hf_servables else ",".join(DEFAULT_SERVABLES)
        configs = [
            server.ServableStartConfig(
                servable_directory=args.servable_directory,
                servable_name=name,
                device_ids=device_ids,
                device_type=args.device_type,
            )
            for name in (listed or "").split(",")
            if name.strip()
        ]
        configs += [
            server.ServableStartConfig(
                servable_directory=directory, servable_name=name, device_ids=(0,), device_type=args.device_type
            )
            for directory, name in hf_servables
        ]
        server.start_servables(configs)
    if args.grpc:
        server.start_grpc_server(args.grpc)
    if args.rest:
        server.start_restful_server(args.rest)
    if args.metrics:
        server.start_metrics_server(args.metrics)


def _add_model_arguments(parser):
    group = parser.add_argument_group(
        "serving a Hugging Face model directory",
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM: config.json, *.safetensors "
        "(float32, float16, bfloat16; sharded or not), tokenizer.json",
    )
    group.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="DIR",
        help="serve this model directory (repeatable); the bundled servables are then served only "
        "when --servables names them",
    )
    group.add_argument(
        "--served_model_name",
        action="append",
        default=[],
        metavar="NAME",
        help="the name of each --model on every API, in their order (default: the directory's name, "
        "characters other than letters, digits, '_' and '-' made '_')",
    )
    group.add_argument(
        "--tensor_parallel",
        type=int,
        default=1,
        metavar="N",
        help="ranks each model is sharded over, one agent process each (default 1); N must divide "
        "the attention heads and KV heads",
    )
    group.add_argument(
        "--max_model_len",
        type=int,
        default=None,
        metavar="L",
        help="most tokens of a sequence, prompt and output (default: the model's max_position_embeddings "
        "capped to 2048, or the longest sequence --kv_cache_memory holds when that is more, up to "
        "max_position_embeddings; it may not exceed max_position_embeddings)",
    )
    group.add_argument(
        "--kv_cache_memory",
        default=None,
        metavar="SIZE",
        help="KV-cache memory per rank, e.g. 2GiB or 512MiB (default: room for 4 sequences of "
        "max_model_len); too little for one sequence is refused",
    )
    group.add_argument(
        "--max_num_seqs",
        type=int,
        default=None,
        metavar="N",
        help="requests decoded at once (engine.max_num_seqs; default 32)",
    )
    group.add_argument(
        "--max_num_batched_tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens computed in one engine step: the running requests' decode tokens, then prompt tokens, long "
        "prompts in chunks (engine.max_num_batched_tokens; default 512)",
    )
    group.add_argument(
        "--model_cache",
        default="model_cache",
        metavar="DIR",
        help="where the exported graphs and the written configurations go, one directory per model "
        "and export settings (default: ./model_cache); the model directory may be read-only",
    )
    for flag in REMOVED_FLAGS:  # refused with what replaces them, rather than argparse's "unrecognized"
        group.add_argument(f"--{flag}", default=None, help=argparse.SUPPRESS)
    group.add_argument(
        "--speculative_config",
        action="append",
        default=[],
        metavar="JSON",
        help="n-gram speculative decoding (vLLM's flag): a JSON object of SpeculativeConfig fields, "
        'e.g. \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": '
        "4}'. Once for "
        "every --model, or once per --model in their order (null: none); default: off",
    )
    group.add_argument(
        "--prepare_only",
        action="store_true",
        help="export the graphs and write the configurations of --model, then exit",
    )


def _prepare_models(parser, args):
    """Exports (when missing) and configures every --model; returns their (servable directory, name) pairs."""
    if not args.model:
        if args.prepare_only or args.served_model_name or args.speculative_config:
            parser.error("--prepare_only, --served_model_name and --speculative_config go with --model")
        return []
    if args.served_model_name and len(args.served_model_name) != len(args.model):
        parser.error(
            f"--served_model_name is given {len(args.served_model_name)} time(s) for {len(args.model)} "
            f"--model: give one name per model, or none"
        )
    if args.model_control == "poll":
        parser.error("--model serves with --model_control none or explicit, not poll")
    for flag in REMOVED_FLAGS:
        if getattr(args, flag) is not None:
            parser.error(
                f"--{flag} was removed: the model's graphs take any batch and prompt length (dynamic shapes); "
                f"--max_num_seqs and --max_num_batched_tokens bound a step"
            )
    ids = tuple(int(x) for x in args.device_ids.split(",") if x.strip())
    agent_ids = ids if len(ids) == args.tensor_parallel else ()
    if not agent_ids and ids != (0,):
        parser.error(
            f"--device_ids {args.device_ids} with --model: give one device id per rank "
            f"(--tensor_parallel {args.tensor_parallel})"
        )
    try:
        speculative = speculative_per_model(args.speculative_config, len(args.model))
    except HfModelError as err:
        parser.error(f"--{err}")
    models = []
    for index, model_dir in enumerate(args.model):
        name = args.served_model_name[index] if args.served_model_name else None
        try:
            models.append(
                HfModelSettings.create(
                    os.path.abspath(model_dir),
                    name,
                    os.path.abspath(args.model_cache),
                    speculative[index],
                    tensor_parallel=args.tensor_parallel,
                    max_model_len=args.max_model_len,
                    max_num_seqs=args.max_num_seqs,
                    max_num_batched_tokens=args.max_num_batched_tokens,
                    kv_cache_memory=args.kv_cache_memory,
                    device_type=args.device_type,
                    device_ids=agent_ids,
                )
            )
        except HfModelError as err:
            sys.exit(f"{parser.prog}: --model {model_dir}: {err}")
    names = [settings.served_model_name for settings in models]
    if len(set(names)) != len(names):
        parser.error(
            f"several --model would be served under one name ({', '.join(names)}); name them with --served_model_name"
        )
    try:  # side by side: each export is a process of its own
        prepared = hf_model.prepare_all(models, log=lambda line: print(line, flush=True))
    except HfModelError as err:
        sys.exit(f"{parser.prog}: --model {err}")
    return [(model.servable_directory, model.name) for model in prepared]
