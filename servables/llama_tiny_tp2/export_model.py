"""Exports the bundled tiny LLaMA split over two tensor-parallel ranks (config/llama_tiny_tp2.yaml) into 1/rank_0/
and 1/rank_1/.

The weights come from the committed checkpoint, as for llama_tiny; the two ranks run as a MindSpore cluster while
they export (models/llama/export.py, export_tensor_parallel).
"""
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "config", "llama_tiny_tp2.yaml")
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = [os.path.join("rank_0", "manifest.json"), os.path.join("rank_1", "manifest.json")]
REUSES_GRAPHS = True  # main(reuse=False) compiles every graph (export_models.py --force)


def _single_rank_exporter():
    """servables/llama_tiny/export_model.py, which exports any LLM configuration's ranks."""
    spec = importlib.util.spec_from_file_location("_llama_tiny_export_model",
                                                  os.path.join(ROOT, "servables", "llama_tiny", "export_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stale():
    """Why the exported graphs no longer match the model config, or None."""
    return _single_rank_exporter().stale(CONFIG)


def main(reuse=True):
    return _single_rank_exporter().main(CONFIG, reuse=reuse)


if __name__ == "__main__":
    main()
