"""Exports a LLaMA-architecture model for serving: its weights once, and the dynamic-shape step graphs.

    python -m mindspore_serving.models.llama.export --config <model.yaml> --out <dir> [--checkpoint <ckpt>]

Writes `weights.safetensors` (every weight, float32, under the names of `model.weight_names`), then the step graphs
of step_graphs.py, which compute one step of any batch of decode rows, prompts, prompt chunks and verified
proposals: `prepare.mindir`, `layer.mindir` (with `layer_decode.mindir` and `layer_chunk.mindir`, the same layer
for steps of one kind of row; a layer graph is called once per decoder layer with that layer's weights and caches)
and `head.mindir`; and last `manifest.json` (format 3: the model, the weights, the cache layout and each graph's
inputs), so that a directory with a manifest is a complete export. No graph holds any weight: the runner loads the
weights file once and passes the tensors in. Every shape a step varies in is dynamic, so the export does not depend
on batch sizes, prompt lengths or the KV-cache size, and compiles in seconds whatever the model's size. A line per
phase says what the export is doing.

Without --checkpoint the weights are a seeded random init (--seed). --reuse DIR keeps the export in DIR (it may be
--out itself) when it is of the same format, network, weights and tensor parallelism (`reusable_export`), and only
copies it.

Tensor parallelism: `--tensor_parallel N --out DIR` writes `DIR/rank_0 ... DIR/rank_{N-1}`, each rank's weights file
holding its shard and its layer graph ending its row-parallel projections in an AllReduce (step_graphs.py). This
process shards and writes the weights; the N ranks then export their graphs as a MindSpore cluster
(common/ms_cluster.py) of N processes started here (an AllReduce is built only inside a cluster); each manifest
names its rank ("tensor_parallel") and its cache holds num_kv_heads / N heads.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping

import mindspore as ms
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from mindspore_serving.common import cluster_registration, ms_cluster
from mindspore_serving.common.ms_device import select_device

from .config import ModelFile, check_tensor_parallel, load_config, save_config
from .manifest import MANIFEST, MANIFEST_VERSION, WEIGHTS_FILE, read_manifest
from .model import LlamaModel, build_model, shard_weights, weight_names
from .step_graphs import (
    GRAPHS,
    HEAD_INPUTS,
    LAYER_GRAPHS,
    LAYER_INPUTS,
    PREPARE_INPUTS,
    graph_cells,
    graph_input_specs,
    graph_weight_names,
    graph_weights_of,
    weight_placeholders,
)

_SOURCE_KEY = "source"  # the weights file's metadata entry saying where the weights came from
_INPUT_NAMES = {"prepare": PREPARE_INPUTS, **{name: LAYER_INPUTS for name in LAYER_GRAPHS}, "head": HEAD_INPUTS}


def graph_file(name: str) -> str:
    return f"{name}.mindir"


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


def stored_weights(cfg: ModelFile, out_dir: str) -> tuple[dict[str, tuple[int, ...]], str]:
    """(the shape of every weight in out_dir/WEIGHTS_FILE, the file's `source` metadata)."""
    with safe_open(os.path.join(out_dir, WEIGHTS_FILE), framework="numpy") as f:
        stored = set(f.keys())
        shapes = {}
        for name in weight_names(cfg.model):
            if name not in stored:
                raise ValueError(f"{WEIGHTS_FILE} in {out_dir} lacks {name}; export again")
            shapes[name] = tuple(f.get_slice(name).get_shape())
        source = (f.metadata() or {}).get(_SOURCE_KEY, "")
    return shapes, source


# --- graphs -----------------------------------------------------------------------------------------------------


def compile_graphs(cfg: ModelFile, out_dir: str, log=print, tensor_parallel=(1, 0)) -> dict:
    """Exports the step graphs into out_dir, which holds the weights file (`write_weights`), and writes the manifest
    last; returns it. `tensor_parallel` = (size, rank) > (1, 0) exports that rank's graphs; the process must be that
    rank of a cluster (see `export_tensor_parallel`, which runs all ranks)."""
    tp, tp_rank = tensor_parallel
    shapes, source = stored_weights(cfg, out_dir)
    specs = graph_input_specs(cfg.model, tp, weight_placeholders(graph_weights_of(cfg.model, shapes)))
    cells = graph_cells(cfg.model, tp)
    for i, name in enumerate(GRAPHS):
        start = time.perf_counter()
        cells[name].set_train(False)
        path = os.path.join(out_dir, graph_file(name))
        ms.export(cells[name], *specs[name], file_name=path[: -len(".mindir")], file_format="MINDIR")
        log(f"graphs: exported {graph_file(name)} ({i + 1}/{len(GRAPHS)}) in {time.perf_counter() - start:.1f}s")
    m, ex = cfg.model, cfg.export
    weights = graph_weight_names(m)
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
        "max_seq_len": m.max_seq_len,
        "vocab_size": m.vocab_size,
        "tensor_parallel": {"size": tp, "rank": tp_rank},
        "cache": {
            "num_layers": m.num_layers,
            "num_kv_heads": m.num_kv_heads // tp,
            "head_dim": m.head_dim,
            "dtype": "float32",
            # per layer a key and a value tensor; slot = block * block_size + offset; -1: chosen by the runner
            "shape": [-1, m.num_kv_heads // tp, m.head_dim],
        },
        # each graph's inputs: these, then the weights named (a layer's relative to "layers.<i>.")
        "graphs": {
            name: {"file": graph_file(name), "inputs": list(_INPUT_NAMES[name]), "weights": list(weights[name])}
            for name in GRAPHS
        },
    }
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def export_graphs(
    cfg: ModelFile,
    out_dir: str,
    model: LlamaModel | None = None,
    checkpoint: str = None,
    seed: int = 0,
    device: str = "CPU",
    log=print,
    weights: Mapping[str, np.ndarray] | None = None,
    source: str = "weights given",
    reuse_dir: str | None = None,
) -> dict:
    """Writes the weights and exports the step graphs of `cfg` into out_dir; returns the manifest (also written).

    The weights are `weights` (name -> array, the names of `weight_names(cfg.model)`, `source` saying what they
    are), else `model`'s, else `checkpoint`'s, else a seeded random init. `reuse_dir` (out_dir itself, or another
    export's directory): when its export is reusable for `cfg` and the checkpoint or seed (`reusable_export`), it is
    copied (nothing when it is out_dir) instead.
    """
    del device  # the process's device is selected by the caller; kept for the callers' symmetry with TP exports
    if reuse_dir is not None and weights is None and model is None:
        if reusable_export(cfg, reuse_dir, checkpoint or f"random(seed={seed})"):
            copy_export(reuse_dir, out_dir)
            log(f"reused the export of {reuse_dir}")
            return read_manifest(out_dir)
    remove_manifest(out_dir)
    start = time.perf_counter()
    if weights is None:
        log("weights: loading")
        weights, source = source_weights(cfg, model, checkpoint, seed)
    size = write_weights(cfg, out_dir, weights, source)
    log(f"weights: wrote {len(weights)} tensors, {size / 1e9:.2f} GB, in {time.perf_counter() - start:.1f}s")
    return compile_graphs(cfg, out_dir, log=log)


def reusable_export(cfg: ModelFile, graphs_dir: str, source: str, tensor_parallel=(1, 0)) -> bool:
    """Whether graphs_dir holds a complete export of the current format that an export of `cfg` with the weights
    `source` (the checkpoint's path, or the seeded init) as rank `tensor_parallel` would write again: the same
    network, weights, tensor parallelism and block size."""
    try:
        manifest = read_manifest(graphs_dir)
    except (OSError, ValueError):
        return False
    tp, rank = tensor_parallel
    m = cfg.model
    same = (
        manifest.get("format_version") == MANIFEST_VERSION
        and manifest.get("model") == m.to_dict()
        and manifest.get("weights", {}).get("source") == source
        and manifest.get("weights", {}).get("names") == weight_names(m)
        and manifest.get("tensor_parallel") == {"size": tp, "rank": rank}
        and manifest.get("block_size") == cfg.export.block_size
    )
    files = [WEIGHTS_FILE] + [graph_file(name) for name in GRAPHS]
    return same and all(os.path.isfile(os.path.join(graphs_dir, name)) for name in files)


def copy_export(src_dir: str, out_dir: str) -> None:
    """Copies the export of src_dir into out_dir (nothing when they are the same directory), each file under a
    temporary name then renamed, the manifest last. Copies, not hard links: MindSpore's export rewrites a graph file
    in place, so a link would let a later export of one directory change the other's graphs."""
    if os.path.realpath(src_dir) == os.path.realpath(out_dir):
        return
    os.makedirs(out_dir, exist_ok=True)
    remove_manifest(out_dir)
    for name in [WEIGHTS_FILE] + [graph_file(g) for g in GRAPHS] + [MANIFEST]:
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
    log=print,
) -> list[dict]:
    """Exports a `len(out_dirs)`-way tensor-parallel model, rank r into out_dirs[r], and returns the manifests:
    writes each rank's shard of the weights (chosen as by `export_graphs`) here, then starts a MindSpore cluster of
    one process per rank (and its scheduler), each exporting its rank's graphs (this module's main). With `reuse`, a
    rank whose directory holds a reusable export (`reusable_export`, of the checkpoint or seed) is kept as it is.
    Raises RuntimeError naming the rank that failed."""
    tp = len(out_dirs)
    check_tensor_parallel(cfg.model, tp)
    kept = [False] * tp
    if reuse and weights is None and model is None:
        source_of = checkpoint or f"random(seed={seed})"
        kept = [reusable_export(cfg, out_dir, source_of, (tp, rank)) for rank, out_dir in enumerate(out_dirs)]
    if all(kept):
        log(f"reused the exports of {len(out_dirs)} ranks")
        return [read_manifest(out_dir) for out_dir in out_dirs]
    if weights is None:
        log("weights: loading")
        weights, source = source_weights(cfg, model, checkpoint, seed)
    for rank, out_dir in enumerate(out_dirs):
        remove_manifest(out_dir)
        start = time.perf_counter()
        size = write_weights(cfg, out_dir, weights, source, (tp, rank))
        log(f"weights: wrote rank {rank}'s shard, {size / 1e9:.2f} GB, in {time.perf_counter() - start:.1f}s")
    del weights
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "model.yaml")
        save_config(cfg, config)
        _run_rank_exports(config, out_dirs, device, timeout)
    return [read_manifest(out_dir) for out_dir in out_dirs]


def _run_rank_exports(config: str, out_dirs: list[str], device: str, timeout: float) -> None:
    """Runs this module's main as every rank of a cluster (`--cluster_rank`), each exporting into its out_dir."""
    tp = len(out_dirs)
    address = ms_cluster.ClusterAddress("127.0.0.1", ms_cluster.free_port("127.0.0.1"), tp)
    scheduler = ms_cluster.start_scheduler(address, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks: list[subprocess.Popen] = []
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
        ]
        return subprocess.Popen(argv, env=ms_cluster.rank_env(address, rank), stdin=subprocess.DEVNULL)

    def restart(rank: int) -> int:
        ranks[rank].kill()
        ranks[rank].wait()
        ranks[rank] = spawn(rank)
        return ranks[rank].pid

    def failed_rank() -> int | None:
        failed = [r for r, p in enumerate(ranks) if p.poll() not in (None, 0)]
        return failed[0] if failed else None

    try:
        for rank in range(tp):
            ranks.append(spawn(rank))
            registrations.started(rank, ranks[rank].pid)
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in ranks):
            registrations.restart_stuck(restart)
            if failed_rank() is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel export did not finish within {timeout:.0f} s")
            time.sleep(0.2)
        rank = failed_rank()
        if rank is not None:
            raise RuntimeError(f"tensor-parallel export: rank {rank} exited with code {ranks[rank].returncode}")
    finally:
        for process in ranks + [scheduler]:
            if process.poll() is None:
                process.kill()
            process.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="model YAML (sections model: and export:)")
    parser.add_argument("--out", required=True, help="output directory for the MindIR files and manifest.json")
    parser.add_argument("--checkpoint", default=None, help="weights (.ckpt from train.py); default: random init")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random init without --checkpoint")
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
        help="keep the export in DIR (default: --out; with --tensor_parallel, each rank's own) when it is of the "
        "same format, network, weights and tensor parallelism",
    )
    # one rank of the above: exports the graphs of --out, where its weights were written
    parser.add_argument("--cluster_rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    start = time.perf_counter()
    if args.cluster_rank:
        select_device(args.device)
        rank = ms_cluster.join_cluster()
        compile_graphs(
            cfg,
            args.out,
            tensor_parallel=(args.tensor_parallel, rank),
            log=lambda msg: print(f"rank {rank}: {msg}", flush=True),
        )
        return
    if args.tensor_parallel > 1:
        export_tensor_parallel(
            cfg,
            rank_dirs(args.out, args.tensor_parallel),
            args.checkpoint,
            args.seed,
            args.device,
            reuse=args.reuse is not None,
        )
        print(f"exported {args.tensor_parallel} ranks to {args.out}/rank_* in {time.perf_counter() - start:.1f}s")
        return
    select_device(args.device)
    export_graphs(
        cfg,
        args.out,
        checkpoint=args.checkpoint,
        seed=args.seed,
        device=args.device,
        reuse_dir=None if args.reuse is None else args.reuse or args.out,
    )
    print(f"exported {args.out} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
