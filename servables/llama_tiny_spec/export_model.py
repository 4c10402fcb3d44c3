"""Exports the graphs of the bundled tiny LLaMA with speculative decoding (config/llama_tiny_spec.yaml) into
1/rank_0/: llama_tiny's step graphs, which verify proposed tokens as they compute any step.

The model file and the checkpoint are llama_tiny's, so its export (servables/llama_tiny/1/, when exported) is copied
(export.py, `reusable_export`); otherwise it is exported here.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "config", "llama_tiny_spec.yaml")
BASE_GRAPHS = os.path.join(ROOT, "servables", "llama_tiny", "1", "rank_0")
VERSION_DIR = os.path.join(HERE, "1")
MODEL_FILES = [os.path.join("rank_0", "manifest.json")]
REUSES_GRAPHS = True  # main(reuse=False) compiles every graph (export_models.py --force)

sys.path.insert(0, os.path.dirname(HERE))  # servables/: export_models.py loads the servables' exporters
from export_models import exporter  # noqa: E402


def stale():
    """Why the exported graphs no longer match the model config, or None."""
    return exporter("llama_tiny").stale(CONFIG)


def main(reuse=True):
    """llama_tiny's exporter (it exports any LLM configuration's ranks) on this configuration."""
    return exporter("llama_tiny").main(CONFIG, reuse=reuse, reuse_dir=BASE_GRAPHS)


if __name__ == "__main__":
    main()
