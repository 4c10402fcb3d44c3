"""The hook through which `Model.call` (in servable_config.py stages) reaches the worker that loaded the model.

The worker runtime installs the function that really runs a model with `set_model_call_handler`; the
register DSL reads it. Neither imports the other.
"""

from collections.abc import Callable

import numpy as np

# fn(model_key, subgraph, instances) -> one tuple of outputs per instance
ModelCallHandler = Callable[[str, int, list[tuple[np.ndarray, ...]]], list[tuple[np.ndarray, ...]]]
_model_call_handler: ModelCallHandler | None = None


def set_model_call_handler(handler: ModelCallHandler | None) -> None:
    """Installs (or, with None, removes) the function that runs `Model.call` requests.

    `handler(model_key, subgraph, instances)` gets a list with one tuple of numpy arrays per instance and
    returns a list with one tuple of outputs per instance. It raises RuntimeError, with the full
    "Model(<key>).call() failed: ..." text, when the call fails; Model.call lets that propagate.
    """
    global _model_call_handler  # pylint: disable=global-statement
    _model_call_handler = handler


def get_model_call_handler() -> ModelCallHandler | None:
    return _model_call_handler


def call_prefix(model_key: str, subgraph: int) -> str:
    """The head of every Model.call error text."""
    if subgraph == 0:
        return f"Model({model_key}).call() failed: "
    return f"Model({model_key}, subgraph={subgraph}).call() failed: "
