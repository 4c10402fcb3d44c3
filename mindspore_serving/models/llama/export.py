"""Exports the paged LLaMA step to one MindIR graph per (phase, batch bucket, length bucket).

    python -m mindspore_serving.models.llama.export --config <model.yaml> --out <dir> [--checkpoint <ckpt>]

Writes the weights once, `weights.safetensors`, then `prefill_b{B}_l{L}.mindir` for every prefill batch x length
bucket, `decode_b{B}.mindir` (L = 1) for every decode batch bucket, `mixed_b{B}_l{L}.mindir` (or
`mixed_b{B}_r{R}_l{L}.mindir`) for every mixed bucket: B decode rows and R prefill rows of L tokens in one call
(`LlamaModel.construct_mixed`), `score_b1_l{L}.mindir` for every score length (`export.score_len_buckets`, by default
the prefill lengths): one row, the prefill graph's inputs, the logits of every position [1, L, vocab] (`ScoreStep`,
prompt logprobs), with `export.spec_tokens: k` > 0 `verify_b{B}_l{k+1}.mindir` for every verify batch bucket
(`export.spec_batch_buckets`, by default the decode batches): the score graphs' cell on B rows of k + 1 tokens, which
verifies a row's last token and up to k proposed ones in one call (speculative decoding), and last `manifest.json`
(graphs, buckets, graph inputs, weights, cache layout, model config, spec_tokens), so that a directory with a manifest
is a complete export.
Without --checkpoint the weights are a seeded random init (--seed). --jobs N compiles the buckets in N processes
(default min(2, cores): a bucket costs seconds of graph compilation). --reuse DIR takes the weights and the graphs it
also wants from the export in DIR (it may be --out itself) when that export is of the same network, weights and cache
layout (`reusable_graphs`), and compiles only the others: adding buckets to an export, or exporting a model's graphs
again with verify graphs, costs only the new graphs.

Weights: no graph holds any. Every graph takes the weights as inputs after the caches (`PagedStep`, `MixedStep`
in model.py), in the order the manifest lists under "weights" "names"; the runner loads weights.safetensors once
and passes the same tensors to every graph, so files and memory hold each weight once whatever the number of
buckets. Manifest format 2; format 1 graphs embedded their own copy of the weights.

Tensor parallelism: `--tensor_parallel N --out DIR` writes `DIR/rank_0 ... DIR/rank_{N-1}`, each rank's weights file
holding its shard and its graphs ending its row-parallel layers in an AllReduce (model.py). This process shards
and writes the weights; the N ranks then compile their graphs as a MindSpore cluster (common/ms_cluster.py) of N
processes started here; each manifest names its rank ("tensor_parallel") and its cache holds num_kv_heads / N
heads. With --reuse (no DIR: each rank's own directory) ranks whose earlier export is reusable keep its weights and
graphs and compile only the new ones.

The graph inputs are those of `LlamaModel.construct` (see model.py), then the weights. MAXB = max_seq_len //
block_size in every graph. With `export.num_blocks` unset (the default) the caches' first dimension is dynamic and
the runner picks num_blocks when it loads the graphs; a number fixes it in the graphs.
"""

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Tensor
from safetensors import safe_open
from safetensors.numpy import save_file

from mindspore_serving.common import cluster_registration, ms_cluster
from mindspore_serving.common.ms_device import select_device

from .config import ModelFile, check_tensor_parallel, load_config, save_config
from .manifest import MANIFEST, MANIFEST_VERSION, WEIGHTS_FILE, read_manifest
from .model import LlamaModel, MixedStep, PagedStep, ScoreStep, build_model, shard_weights, weight_names

_SOURCE_KEY = "source"  # the weights file's metadata entry saying where the weights came from
GRAPH_INPUTS = ["input_ids", "positions", "block_tables", "slot_mapping", "query_lens"]
MIXED_INPUTS = [
    "decode_ids",
    "decode_positions",
    "decode_tables",
    "prefill_ids",
    "prefill_positions",
    "prefill_tables",
    "slot_mapping",
    "prefill_lens",
]


@dataclass(frozen=True)
class GraphSpec:
    phase: str  # "prefill", "decode", "score", "verify" (length = spec_tokens + 1) or "mixed" (batch = decode
    #              rows, length = the prefill rows' length)
    batch: int
    length: int
    rows: int = 1  # mixed: prefill rows

    @property
    def file(self) -> str:
        if self.phase == "decode":
            return f"decode_b{self.batch}.mindir"
        if self.phase == "mixed" and self.rows > 1:
            return f"mixed_b{self.batch}_r{self.rows}_l{self.length}.mindir"
        return f"{self.phase}_b{self.batch}_l{self.length}.mindir"


def graph_specs(cfg: ModelFile) -> list[GraphSpec]:
    ex = cfg.export
    specs = [GraphSpec("prefill", b, length) for b in ex.prefill_batch_buckets for length in ex.prefill_len_buckets]
    specs += [
        GraphSpec("mixed", b, length, r)
        for b in ex.mixed_decode_buckets
        for r in ex.mixed_prefill_rows
        for length in ex.mixed_len_buckets
    ]
    specs += [GraphSpec("decode", b, 1) for b in ex.decode_batch_buckets]
    specs += [GraphSpec("verify", b, ex.spec_tokens + 1) for b in ex.spec_batches]
    return specs + [GraphSpec("score", 1, length) for length in ex.score_lengths]


def cache_input_names(num_layers: int) -> list[str]:
    names = []
    for i in range(num_layers):
        names += [f"key_cache_{i}", f"value_cache_{i}"]
    return names


def example_inputs(cfg: ModelFile, spec: GraphSpec, tp: int = 1):
    """Inputs of one bucket, shaped for export: every pad token writes into scratch slot 0."""
    m, ex = cfg.model, cfg.export
    maxb = ex.max_blocks_per_seq(m)
    b, length = spec.batch, spec.length
    cache_shape = [ex.num_blocks, ex.block_size, m.num_kv_heads // tp, m.head_dim]
    if ex.num_blocks is None:
        cache = Tensor(shape=[None] + cache_shape[1:], dtype=ms.float32)
    else:
        cache = Tensor(np.zeros(cache_shape, np.float32))
    if spec.phase == "mixed":
        r = spec.rows
        return [
            Tensor(np.zeros((b, 1), np.int32)),
            Tensor(np.zeros((b, 1), np.int32)),
            Tensor(np.zeros((b, maxb), np.int32)),
            Tensor(np.zeros((r, length), np.int32)),
            Tensor(np.zeros((r, length), np.int32)),
            Tensor(np.zeros((r, maxb), np.int32)),
            Tensor(np.zeros((b + r * length,), np.int32)),
            Tensor(np.ones((r,), np.int32)),
        ] + [cache] * (2 * m.num_layers)
    return [
        Tensor(np.zeros((b, length), np.int32)),
        Tensor(np.zeros((b, length), np.int32)),
        Tensor(np.zeros((b, maxb), np.int32)),
        Tensor(np.zeros((b * length,), np.int32)),
        Tensor(np.ones((b,), np.int32)),
    ] + [cache] * (2 * m.num_layers)


# --- weights --------------------------------------------------------------------------------------------------


def model_weights(model: LlamaModel) -> dict[str, np.ndarray]:
    """The model's weights by name, in `weight_names` order."""
    return {name: w.asnumpy() for name, w in zip(model.weight_names(), model.weights())}


def source_weights(cfg: ModelFile, model: LlamaModel | None = None, checkpoint: str = None, seed: int = 0):
    """(the whole model's weights by name, what they are): `model`'s, else `checkpoint`'s, else a seeded init."""
    if model is None:
        model = build_model(cfg.model, seed=seed, checkpoint=checkpoint)
        return model_weights(model), checkpoint or f"random(seed={seed})"
    return model_weights(model), "in-memory model"


def write_weights(
    cfg: ModelFile, out_dir: str, weights: Mapping[str, np.ndarray], source: str, tensor_parallel=(1, 0)
) -> int:
    """Writes rank `tensor_parallel[1]`'s shard of the whole model's `weights` (name -> array, every name of
    `weight_names(cfg.model)`) to out_dir/WEIGHTS_FILE, `source` in its metadata; returns its bytes. The file is
    written under a temporary name and renamed, so it is never seen half-written."""
    names = weight_names(cfg.model)
    missing, unexpected = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
    if missing or unexpected:
        raise ValueError(
            f"the weights do not match the model config: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    tp, rank = tensor_parallel
    shard = shard_weights(cfg.model, weights, tp, rank) if tp > 1 else weights
    tensors = {name: np.ascontiguousarray(shard[name], dtype=np.float32) for name in names}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, WEIGHTS_FILE)
    save_file(tensors, path + ".tmp", metadata={_SOURCE_KEY: source})
    os.replace(path + ".tmp", path)
    return os.path.getsize(path)


def weight_placeholders(cfg: ModelFile, out_dir: str):
    """(Tensors shaped as the weights of out_dir/WEIGHTS_FILE, without data, in `weight_names` order: the graphs'
    weight inputs at export; the file's `source` metadata)."""
    placeholders = []
    with safe_open(os.path.join(out_dir, WEIGHTS_FILE), framework="numpy") as f:
        stored = set(f.keys())
        for name in weight_names(cfg.model):
            if name not in stored:
                raise ValueError(f"{WEIGHTS_FILE} in {out_dir} lacks {name}; export again")
            placeholders.append(Tensor(shape=list(f.get_slice(name).get_shape()), dtype=ms.float32))
        source = (f.metadata() or {}).get(_SOURCE_KEY, "")
    return placeholders, source


# --- graphs -----------------------------------------------------------------------------------------------------


def _export_specs(cfg: ModelFile, out_dir: str, specs: list[GraphSpec], tp: int, log) -> None:
    """Compiles `specs` into out_dir; every graph's weight inputs are shaped as out_dir's weights file."""
    weights, _ = weight_placeholders(cfg, out_dir)
    model = LlamaModel(cfg.model, tp, parameters=False)
    model.set_train(False)
    every_position = ScoreStep(model)  # the score and verify graphs: every position's logits
    cells = {"mixed": MixedStep(model), "score": every_position, "verify": every_position}
    paged = PagedStep(model)
    for spec in specs:
        start = time.perf_counter()
        path = os.path.join(out_dir, spec.file)
        cell = cells.get(spec.phase, paged)
        ms.export(
            cell, *example_inputs(cfg, spec, tp), *weights, file_name=path[: -len(".mindir")], file_format="MINDIR"
        )
        log(f"exported {spec.file} in {time.perf_counter() - start:.2f}s")


def _export_worker(cfg_dict: dict, out_dir: str, specs: list[GraphSpec], device: str) -> None:
    """Runs in a spawned process: compiles its share of the buckets (the graphs need only the weights' shapes)."""
    select_device(device)
    _export_specs(ModelFile.from_dict(cfg_dict), out_dir, specs, 1, print)


def export_graphs(
    cfg: ModelFile,
    out_dir: str,
    model: LlamaModel | None = None,
    checkpoint: str = None,
    seed: int = 0,
    jobs: int = 1,
    device: str = "CPU",
    log=print,
    weights: Mapping[str, np.ndarray] | None = None,
    source: str = "weights given",
    reuse_dir: str | None = None,
) -> dict:
    """Writes the weights and compiles every bucket of `cfg` into out_dir; returns the manifest (also written).

    The weights are `weights` (name -> array, the names of `weight_names(cfg.model)`, `source` saying what they
    are), else `model`'s, else `checkpoint`'s, else a seeded random init. `reuse_dir` (out_dir itself, or another
    export's directory): when its export is reusable for `cfg` and the checkpoint or seed (`reusable_graphs`), its
    weights and the graphs `cfg` also wants are taken from there, and only the other graphs compiled.
    """
    reused = None
    if reuse_dir is not None and weights is None and model is None:
        reused = reusable_graphs(cfg, reuse_dir, checkpoint or f"random(seed={seed})")
    remove_manifest(out_dir)
    if reused is None:
        if weights is None:
            weights, source = source_weights(cfg, model, checkpoint, seed)
        write_weights(cfg, out_dir, weights, source)
    else:
        copy_export_files(reuse_dir, out_dir, [WEIGHTS_FILE] + reused)
        log(f"reused the weights and {len(reused)} graphs of {reuse_dir}")
    return compile_graphs(cfg, out_dir, jobs=jobs, device=device, log=log, present=reused or ())


def reusable_graphs(cfg: ModelFile, graphs_dir: str, source: str, tensor_parallel=(1, 0)) -> list[str] | None:
    """The graph files of the export in graphs_dir that an export of `cfg` with the weights `source` (what
    `source_weights` says of them: the checkpoint's path, or the seeded init) as rank `tensor_parallel` would
    compile again, or None when that export cannot be reused: no complete export of the current format, or one of
    another network, weights, tensor parallelism or cache layout (block size, fixed num_blocks). A graph depends on
    nothing else than these and its bucket; a reusable export's weights file is the one `cfg` would write."""
    try:
        manifest = read_manifest(graphs_dir)
    except (OSError, ValueError):
        return None
    tp, rank = tensor_parallel
    m, ex = cfg.model, cfg.export
    same = (
        manifest.get("format_version") == MANIFEST_VERSION
        and manifest.get("model") == m.to_dict()
        and manifest.get("weights", {}).get("source") == source
        and manifest.get("weights", {}).get("names") == weight_names(m)
        and manifest.get("tensor_parallel") == {"size": tp, "rank": rank}
        and manifest.get("block_size") == ex.block_size
        and manifest.get("num_blocks") == ex.num_blocks
    )
    if not same or not os.path.isfile(os.path.join(graphs_dir, WEIGHTS_FILE)):
        return None
    wanted = {s.file: s for s in graph_specs(cfg)}
    reused = []
    for g in manifest.get("graphs", []):
        spec = wanted.get(g.get("file"))
        if (
            spec is not None
            and (g.get("phase"), g.get("batch"), g.get("length"), g.get("rows", 1))
            == (spec.phase, spec.batch, spec.length, spec.rows)
            and os.path.isfile(os.path.join(graphs_dir, spec.file))
        ):
            reused.append(spec.file)
    return reused


def copy_export_files(src_dir: str, out_dir: str, files: list[str]) -> None:
    """Copies `files` of src_dir into out_dir (nothing when they are the same directory), each under a temporary
    name then renamed. Copies, not hard links: MindSpore's export rewrites a graph file in place, so a link would let
    a later export of one directory change the other's graphs."""
    os.makedirs(out_dir, exist_ok=True)
    if os.path.realpath(src_dir) == os.path.realpath(out_dir):
        return
    for name in files:
        target = os.path.join(out_dir, name)
        shutil.copyfile(os.path.join(src_dir, name), target + ".tmp")
        os.replace(target + ".tmp", target)


def remove_manifest(out_dir: str) -> None:
    """Drops out_dir's manifest before an export rewrites the directory: until the new one is written, the
    directory is not a complete export."""
    try:
        os.remove(os.path.join(out_dir, MANIFEST))
    except FileNotFoundError:
        pass


def compile_graphs(
    cfg: ModelFile,
    out_dir: str,
    jobs: int = 1,
    device: str = "CPU",
    log=print,
    tensor_parallel=(1, 0),
    present: Collection[str] = (),
) -> dict:
    """Exports every bucket of `cfg` into out_dir, which holds the weights file (`write_weights`), and writes the
    manifest last; returns it.

    Compiling a graph costs seconds of one core per bucket, so `jobs` > 1 spreads the buckets over that many
    spawned processes (the graphs need only the weights' shapes, which they read from the weights file).
    `tensor_parallel` = (size, rank) > (1, 0) compiles that rank's graphs; the process must be that rank of a
    cluster (see `export_tensor_parallel`, which runs all ranks). `present`: graph files out_dir holds already
    (`reusable_graphs`), listed in the manifest but not compiled again.
    """
    specs = graph_specs(cfg)
    present = set(present)
    todo = [s for s in specs if s.file not in present]
    tp, tp_rank = tensor_parallel
    jobs = 1 if tp > 1 else max(1, min(jobs, len(todo)))
    if jobs == 1:
        _export_specs(cfg, out_dir, todo, tp, log)
    else:
        shares = [todo[i::jobs] for i in range(jobs)]
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(jobs) as pool:
            pool.starmap(_export_worker, [(cfg.to_dict(), out_dir, share, device) for share in shares])
    _, source = weight_placeholders(cfg, out_dir)
    m, ex = cfg.model, cfg.export
    manifest = {
        "format_version": MANIFEST_VERSION,
        "model": m.to_dict(),
        "export": ex.to_dict(),
        "weights": {
            "file": WEIGHTS_FILE,
            "names": weight_names(m),
            "source": source,
            "bytes": os.path.getsize(os.path.join(out_dir, WEIGHTS_FILE)),
        },
        "block_size": ex.block_size,
        "max_blocks_per_seq": ex.max_blocks_per_seq(m),
        "max_seq_len": m.max_seq_len,
        "vocab_size": m.vocab_size,
        "num_blocks": ex.num_blocks,  # None: chosen by the runner at load time
        "tensor_parallel": {"size": tp, "rank": tp_rank},
        "cache": {
            "num_layers": m.num_layers,
            "num_kv_heads": m.num_kv_heads // tp,
            "head_dim": m.head_dim,
            "dtype": "float32",
            "shape": [ex.num_blocks if ex.num_blocks else -1, ex.block_size, m.num_kv_heads // tp, m.head_dim],
        },
        # every graph's inputs: these (mixed graphs: mixed_inputs), then the tensors of weights.names in order
        "inputs": GRAPH_INPUTS + cache_input_names(m.num_layers),
        "output": "logits float32 [batch, vocab] of token query_lens[b]-1 of each row",
        "mixed_inputs": MIXED_INPUTS + cache_input_names(m.num_layers),
        "mixed_output": "logits float32 [batch + rows, vocab]: each decode row's, then each prefill row's token "
        "prefill_lens[r]-1",
        "score_output": "logits float32 [batch, length, vocab] of every position (score and verify graphs: the "
        "inputs of the prefill graphs)",
        "spec_tokens": ex.spec_tokens,  # verify graphs: rows of spec_tokens + 1 tokens (0: none)
        "graphs": [
            {"file": s.file, "phase": s.phase, "batch": s.batch, "length": s.length, "rows": s.rows} for s in specs
        ],
    }
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def rank_dirs(out_dir: str, tp: int) -> list[str]:
    """The graph directories of a tensor-parallel export into out_dir."""
    return [os.path.join(out_dir, f"rank_{r}") for r in range(tp)]


def export_tensor_parallel(
    cfg: ModelFile,
    out_dirs: list[str],
    checkpoint: str = None,
    seed: int = 0,
    device: str = "CPU",
    timeout: float = 3600.0,
    model: LlamaModel | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    source: str = "weights given",
    reuse: bool = False,
) -> list[dict]:
    """Exports a `len(out_dirs)`-way tensor-parallel model, rank r into out_dirs[r], and returns the manifests:
    writes each rank's shard of the weights (chosen as by `export_graphs`) here, then starts a MindSpore cluster of
    one process per rank (and its scheduler), each compiling its rank's graphs (this module's main). With `reuse`, a
    rank whose directory holds a reusable export (`reusable_graphs`, of the checkpoint or seed) keeps its weights and
    graphs and compiles only the others. Raises RuntimeError naming the rank that failed."""
    tp = len(out_dirs)
    check_tensor_parallel(cfg.model, tp)
    kept: list[list[str] | None] = [None] * tp
    if reuse and weights is None and model is None:
        kept = [
            reusable_graphs(cfg, out_dir, checkpoint or f"random(seed={seed})", (tp, rank))
            for rank, out_dir in enumerate(out_dirs)
        ]
    if weights is None and None in kept:
        weights, source = source_weights(cfg, model, checkpoint, seed)
    for rank, out_dir in enumerate(out_dirs):
        remove_manifest(out_dir)
        if kept[rank] is None:
            write_weights(cfg, out_dir, weights, source, (tp, rank))
    del weights
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "model.yaml")
        save_config(cfg, config)
        address = ms_cluster.ClusterAddress("127.0.0.1", ms_cluster.free_port("127.0.0.1"), tp)
        scheduler = ms_cluster.start_scheduler(address, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ranks = []
        registrations = cluster_registration.watching(address)

        def spawn(rank: int) -> subprocess.Popen:
            argv = [
                sys.executable,
                "-m",
                __spec__.name,
                f"--config={config}",
                f"--out={out_dirs[rank]}",
                f"--tensor_parallel={tp}",
                f"--device={device}",
                "--cluster_rank",
                f"--present={','.join(kept[rank] or [])}",
            ]
            return subprocess.Popen(argv, env=ms_cluster.rank_env(address, rank), stdin=subprocess.DEVNULL)

        def restart(rank: int) -> int:
            ranks[rank].kill()
            ranks[rank].wait()
            ranks[rank] = spawn(rank)
            return ranks[rank].pid

        try:
            for rank in range(tp):
                ranks.append(spawn(rank))
                registrations.started(rank, ranks[rank].pid)
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in ranks):
                registrations.restart_stuck(restart)
                failed = [r for r, p in enumerate(ranks) if p.poll() not in (None, 0)]
                if failed:
                    raise RuntimeError(
                        f"tensor-parallel export: rank {failed[0]} exited with code {ranks[failed[0]].returncode}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tensor-parallel export did not finish within {timeout:.0f} s")
                time.sleep(0.2)
            failed = [r for r, p in enumerate(ranks) if p.returncode != 0]
            if failed:
                raise RuntimeError(
                    f"tensor-parallel export: rank {failed[0]} exited with code {ranks[failed[0]].returncode}"
                )
        finally:
            for process in ranks + [scheduler]:
                if process.poll() is None:
                    process.kill()
                process.wait()
    manifests = []
    for out_dir in out_dirs:
        with open(os.path.join(out_dir, MANIFEST), encoding="utf-8") as f:
            manifests.append(json.load(f))
    return manifests


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="model YAML (sections model: and export:)")
    parser.add_argument("--out", required=True, help="output directory for the MindIR files and manifest.json")
    parser.add_argument("--checkpoint", default=None, help="weights (.ckpt from train.py); default: random init")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random init without --checkpoint")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes compiling graphs in parallel (default: min(2, cores))",
    )
    parser.add_argument("--device", default="CPU", help="MindSpore device target (CPU, GPU, Ascend)")
    parser.add_argument(
        "--tensor_parallel",
        type=int,
        default=1,
        help="ranks to shard the model over (writes OUT/rank_0 ... OUT/rank_{N-1})",
    )
    parser.add_argument(
        "--reuse",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="take the weights and graphs wanted from the export in DIR (default: --out; with "
        "--tensor_parallel, each rank's own) when it is of the same network, weights and cache "
        "layout, and compile only the others",
    )
    # one rank of the above: compiles the graphs of --out, where its weights were written, but those of --present
    parser.add_argument("--cluster_rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--present", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    start = time.perf_counter()
    if args.cluster_rank:
        select_device(args.device)
        rank = ms_cluster.join_cluster()
        compile_graphs(
            cfg,
            args.out,
            device=args.device,
            tensor_parallel=(args.tensor_parallel, rank),
            log=lambda msg: print(f"rank {rank}: {msg}"),
            present=[f for f in args.present.split(",") if f],
        )
        return
    if args.tensor_parallel > 1:
        manifests = export_tensor_parallel(
            cfg,
            rank_dirs(args.out, args.tensor_parallel),
            args.checkpoint,
            args.seed,
            args.device,
            reuse=args.reuse is not None,
        )
        print(
            f"exported {len(manifests)} x {len(manifests[0]['graphs'])} graphs to {args.out}/rank_* in "
            f"{time.perf_counter() - start:.1f}s"
        )
        return
    select_device(args.device)
    manifest = export_graphs(
        cfg,
        args.out,
        checkpoint=args.checkpoint,
        seed=args.seed,
        jobs=args.jobs,
        device=args.device,
        reuse_dir=None if args.reuse is None else args.reuse or args.out,
    )
    print(f"exported {len(manifest['graphs'])} graphs to {args.out} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
