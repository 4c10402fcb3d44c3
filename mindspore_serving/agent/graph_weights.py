"""The weights of an export directory, loaded once per process for the step graphs to share.

The exporter (models/llama/export.py) writes a rank's weights once, in the safetensors file the manifest's
"weights" section names; the step graphs take them as inputs. `load_graph_weights` reads that file one tensor at a
time into MindSpore Tensors that own the read arrays (`Tensor.from_numpy`: no second copy), so a rank holds each
weight once.
"""

import os
from collections.abc import Mapping

from mindspore import Tensor
from safetensors import SafetensorError, safe_open


def weight_names(manifest: Mapping) -> list[str]:
    """The weights the graphs take, in the exporter's order. Raises ValueError for a malformed "weights" section."""
    section = manifest.get("weights")
    names = section.get("names") if isinstance(section, Mapping) else None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError("the manifest's 'weights' section lists no weight names; re-export the model")
    return names


def weights_file(manifest_dir: str, manifest: Mapping) -> str:
    """Path of the weights file the manifest names: a plain file name inside manifest_dir."""
    name = manifest["weights"].get("file")
    if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", ".."):
        raise ValueError(f"the manifest's weights file {name!r} is not a file name in the export directory")
    return os.path.join(manifest_dir, name)


def load_graph_weights(manifest_dir: str, manifest: Mapping) -> dict[str, Tensor]:
    """The weights by name. Raises FileNotFoundError when the weights file is missing, ValueError when it is
    unreadable or lacks a weight."""
    names = weight_names(manifest)
    path = weights_file(manifest_dir, manifest)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: the export in {manifest_dir} is incomplete; export the model again")
    try:
        with safe_open(path, framework="numpy") as stored:
            missing = sorted(set(names) - set(stored.keys()))
            if missing:
                raise ValueError(
                    f"{path} lacks the weight(s) {missing[:5]} that the graphs take; export the model again"
                )
            return {name: Tensor.from_numpy(stored.get_tensor(name)) for name in names}
    except SafetensorError as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}); export the model again") from None
