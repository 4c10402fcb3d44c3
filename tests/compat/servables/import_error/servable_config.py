"""A servable_config.py that fails to import: refused at start with the import's error."""

import a_module_that_does_not_exist  # noqa: F401

from mindspore_serving.server import register  # noqa: F401
