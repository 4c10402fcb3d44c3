"""A servable_config.py that fails to import."""
from mindspore_serving.server import register

raise ImportError("this servable is broken on purpose")
