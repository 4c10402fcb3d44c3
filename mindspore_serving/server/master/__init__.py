"""`server.master.context`: settings of the master process."""

from mindspore_serving.server.master import context

__all__ = ["context"]
