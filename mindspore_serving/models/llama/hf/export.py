"""Exports the graphs of a Hugging Face model directory: its weights (`weights.load_hf_weights`) written and compiled
by `models/llama/export.py`, one directory per tensor-parallel rank.

    python -m mindspore_serving.models.llama.hf.export --model_dir DIR --config model.yaml --out OUT \
           [--tensor_parallel N] [--device CPU] [--source TEXT]

`--config` is the model YAML of the graphs (the network as `config.read_hf_config` maps config.json, with the
served max_seq_len, and the block size); OUT/rank_0 ... OUT/rank_{N-1} get the weights file, the step graphs (a
line per phase on stdout) and the manifest. On failure the last line on stderr is "export failed: <why>" and
the exit code is 1. serving_server.py --model runs this in a child process (worker/llm/hf_model.py), so that
MindSpore loads only where graphs are compiled.
"""

import argparse
import os
import sys
import time

from ..config import ModelFile, load_config
from .weights import load_hf_weights


def export_hf(
    model_dir: str, cfg: ModelFile, out: str, tp: int = 1, device: str = "CPU", source: str = ""
) -> list[dict]:
    """Exports `model_dir`'s weights with the network of `cfg` into out/rank_*; returns the manifests.
    Raises ValueError (UnsupportedModelError) when the checkpoint does not match the network."""
    from mindspore_serving.common.ms_device import select_device  # MindSpore: only in the export's own process
    from mindspore_serving.models.llama import export  # MindSpore, as above

    start = time.perf_counter()
    print("weights: reading the checkpoint", flush=True)
    weights = load_hf_weights(model_dir, cfg.model)
    print(f"weights: read {len(weights)} tensors in {time.perf_counter() - start:.1f}s", flush=True)
    source = source or f"hf:{os.path.basename(os.path.normpath(model_dir))}"
    dirs = export.rank_dirs(out, tp)
    if tp > 1:
        return export.export_tensor_parallel(cfg, dirs, device=device, weights=weights, source=source)
    select_device(device)
    return [export.export_graphs(cfg, dirs[0], device=device, weights=weights, source=source, log=_log)]


def _log(line: str) -> None:
    print(line, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", required=True, help="the Hugging Face model directory")
    parser.add_argument("--config", required=True, help="model YAML of the graphs (sections model: and export:)")
    parser.add_argument("--out", required=True, help="directory of the rank directories")
    parser.add_argument("--tensor_parallel", type=int, default=1)
    parser.add_argument("--device", default="CPU", help="MindSpore device target of the export")
    parser.add_argument("--source", default="", help="what the weights are, recorded in the weights files")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        manifests = export_hf(
            args.model_dir,
            load_config(args.config),
            args.out,
            args.tensor_parallel,
            args.device,
            args.source,
        )
    except (ValueError, RuntimeError, OSError) as err:
        print(f"export failed: {err}", file=sys.stderr, flush=True)
        return 1
    print(f"exported {len(manifests)} rank(s) in {time.perf_counter() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
