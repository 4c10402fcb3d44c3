"""A servable_config.py that fails to import."""

raise ImportError("this servable is broken on purpose")
