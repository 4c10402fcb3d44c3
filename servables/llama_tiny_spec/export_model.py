"""Exports the graphs of the bundled tiny LLaMA with speculative decoding (config/llama_tiny_spec.yaml) into
1/rank_0/: llama_tiny's graphs and the verify graphs (`model.export: {spec_tokens: 4}`).

The model file and the checkpoint are llama_tiny's, so its exported weights and graphs (servables/llama_tiny/1/, when
exported) are copied and only the verify graphs compiled (export.py, `reusable_graphs`); otherwise every graph is.
"""
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "config", "llama_tiny_spec.yaml")
BASE_GRAPHS = os.path.join(ROOT, "servables", "llama_tiny", "1", "rank_0")
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = [os.path.join("rank_0", "manifest.json")]
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
    return _single_rank_exporter().main(CONFIG, reuse=reuse, reuse_dir=BASE_GRAPHS)


if __name__ == "__main__":
    main()
