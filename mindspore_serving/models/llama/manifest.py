"""The manifest of an export directory (manifest.json, written last by export.py): its name, its format version and
the name of the weights file. Pure (no MindSpore), so that tools can tell an outdated export without loading it.

Format versions: 1, one static graph per shape bucket, each embedding its own copy of the weights; 2, the same
graphs taking the weights, stored once in WEIGHTS_FILE, as inputs; 3, the weights file and three dynamic-shape
graphs that compute any step (models/llama/step_graphs.py). Only format 3 is served: an older export is exported
again (`outdated_format`).
"""

import json
import os

MANIFEST = "manifest.json"
MANIFEST_VERSION = 3
WEIGHTS_FILE = "weights.safetensors"


def read_manifest(graphs_dir: str) -> dict:
    with open(os.path.join(graphs_dir, MANIFEST), encoding="utf-8") as stream:
        return json.load(stream)


def outdated_format(graphs_dir: str) -> str | None:
    """Why the export in graphs_dir is not of the current format (so should be exported again), or None. A missing
    or unreadable manifest is outdated too."""
    try:
        version = read_manifest(graphs_dir).get("format_version")
    except (OSError, ValueError, AttributeError) as err:
        return f"{graphs_dir} has no readable {MANIFEST} ({type(err).__name__})"
    if version != MANIFEST_VERSION:
        return f"{graphs_dir} holds manifest format {version!r}, the exporter writes format {MANIFEST_VERSION}"
    return None
