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
REUSES_GRAPHS = True  # main(reuse=False) compiles every graph (export_models.py --force)

sys.path.insert(0, os.path.dirname(HERE))  # servables/: export_models.py loads the servables' exporters
from export_models import exporter  # noqa: E402


def stale():
    """Why the exported graphs no longer match the model config, or None."""
    return exporter("llama_tiny").stale(CONFIG)


def main(reuse=True):
    """llama_tiny's exporter (it exports any LLM configuration's ranks) on this configuration."""
    return exporter("llama_tiny").main(CONFIG, reuse=reuse)


if __name__ == "__main__":
    main()
