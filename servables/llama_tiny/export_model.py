"""Exports the step graphs of the bundled tiny LLaMA (config/llama_tiny.yaml) into 1/rank_0/.

The weights come from the committed checkpoint (mindspore_serving/models/llama/tiny/llama_tiny.ckpt, made by
`python -m mindspore_serving.models.llama.train`) and are written once, weights.safetensors, beside the three
dynamic-shape graphs that take them as inputs (models/llama/step_graphs.py). The export config is the model file's,
with the LLM configuration's `model.export` fields over it.

An earlier export of the same network and weights (in the graphs' own directory, or `reuse_dir`) is kept as it is
(export.py, `reusable_export`).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "config", "llama_tiny.yaml")
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = [os.path.join("rank_0", "manifest.json")]
REUSES_GRAPHS = True  # main(reuse=False) compiles every graph (export_models.py --force)


def stale(config_path=CONFIG):
    """Why the exported graphs no longer match the model config (network or block size changed) or are of an older
    export format, or None."""
    sys.path.insert(0, ROOT)
    from mindspore_serving.models.llama.manifest import outdated_format
    from mindspore_serving.spec.llm_config import load_serving_config

    config = load_serving_config(config_path, check_graphs=False)
    for graphs_dir in config.model.graphs:
        reason = outdated_format(graphs_dir)
        if reason:
            return reason
    return config.stale_graphs()


def main(config_path=CONFIG, reuse=True, reuse_dir=None):
    """Exports the graphs of every rank of the LLM configuration `config_path` (a cluster of ranks when the model
    is tensor-parallel); returns their manifests. `reuse`: keep what an earlier export in the graphs' directory (or
    in `reuse_dir`, one rank's graphs) when it is the same export; False exports again."""
    sys.path.insert(0, ROOT)
    from mindspore_serving.models.llama.export import export_graphs, export_tensor_parallel
    from mindspore_serving.spec.llm_config import load_serving_config

    config = load_serving_config(config_path, check_graphs=False)
    model_file = config.model_file()
    if config.model.tensor_parallel > 1:
        return export_tensor_parallel(
            model_file, list(config.model.graphs), checkpoint=config.model.checkpoint, reuse=reuse
        )
    return [
        export_graphs(
            model_file,
            graphs_dir,
            checkpoint=config.model.checkpoint,
            reuse_dir=(reuse_dir or graphs_dir) if reuse else None,
        )
        for graphs_dir in config.model.graphs
    ]


if __name__ == "__main__":
    main()
