"""Exports the bundled tiny LLaMA split over two tensor-parallel ranks (config/llama_tiny_tp2.yaml) into 1/rank_0/
and 1/rank_1/.

The weights come from the committed checkpoint, as for llama_tiny; the two ranks run as a MindSpore cluster while
they export (models/llama/export.py, export_tensor_parallel).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "config", "llama_tiny_tp2.yaml")
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = [os.path.join("rank_0", "manifest.json"), os.path.join("rank_1", "manifest.json")]


def stale():
    """Why the exported graphs no longer match the model config (buckets or network changed), or None."""
    sys.path.insert(0, ROOT)
    from mindspore_serving.spec.llm_config import load_serving_config
    return load_serving_config(CONFIG).stale_graphs()


def main():
    sys.path.insert(0, ROOT)
    from mindspore_serving.spec.llm_config import load_serving_config
    from mindspore_serving.models.llama.config import load_config
    from mindspore_serving.models.llama.export import export_tensor_parallel
    config = load_serving_config(CONFIG)
    return export_tensor_parallel(load_config(config.model.config), list(config.model.graphs),
                                  checkpoint=config.model.checkpoint)


if __name__ == "__main__":
    main()
