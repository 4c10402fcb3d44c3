"""Exports the prefill and decode graphs of the bundled tiny LLaMA (config/llama_tiny.yaml) into 1/rank_0/.

The weights come from the committed checkpoint (mindspore_serving/models/llama/tiny/llama_tiny.ckpt, made by
`python -m mindspore_serving.models.llama.train`) and are written once, weights.safetensors; one MindIR per
(phase, batch bucket, length bucket), taking them as inputs.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "config", "llama_tiny.yaml")
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = [os.path.join("rank_0", "manifest.json")]


def stale(config_path=CONFIG):
    """Why the exported graphs no longer match the model config (buckets or network changed) or are of an older
    export format, or None."""
    sys.path.insert(0, ROOT)
    from mindspore_serving.models.llama.manifest import outdated_format
    from mindspore_serving.spec.llm_config import load_serving_config
    config = load_serving_config(config_path)
    for graphs_dir in config.model.graphs:
        reason = outdated_format(graphs_dir)
        if reason:
            return reason
    return config.stale_graphs()


def main(config_path=CONFIG):
    """Exports the graphs of every rank of the LLM configuration `config_path` (a cluster of ranks when the model
    is tensor-parallel); returns their manifests."""
    sys.path.insert(0, ROOT)
    from mindspore_serving.spec.llm_config import load_serving_config
    from mindspore_serving.models.llama.config import load_config
    from mindspore_serving.models.llama.export import export_graphs, export_tensor_parallel
    config = load_serving_config(config_path)
    model_file = load_config(config.model.config)
    if config.model.tensor_parallel > 1:
        return export_tensor_parallel(model_file, list(config.model.graphs), checkpoint=config.model.checkpoint)
    return [export_graphs(model_file, graphs_dir, checkpoint=config.model.checkpoint, jobs=min(2, os.cpu_count() or 1))
            for graphs_dir in config.model.graphs]


if __name__ == "__main__":
    main()
