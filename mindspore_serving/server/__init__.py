"""The server API used by serving_server.py: start servables, open the front ends, stop.

Example::

    from mindspore_serving import server

    config = server.ServableStartConfig(servable_directory="servables", servable_name="add", device_ids=(0,))
    server.start_servables(config)
    server.start_grpc_server("127.0.0.1:5500")
    server.start_restful_server("127.0.0.1:1500")
"""

from mindspore_serving.server import distributed, register
from mindspore_serving.server._server import (
    load_servable,
    start_grpc_server,
    start_metrics_server,
    start_model_control_poll,
    start_restful_server,
    start_servables,
    stop,
    unload_servable,
)
from mindspore_serving.server.ssl_config import SSLConfig
from mindspore_serving.server.start_config import ServableStartConfig

__all__ = [
    "start_servables",
    "ServableStartConfig",
    "start_grpc_server",
    "start_restful_server",
    "start_metrics_server",
    "stop",
    "SSLConfig",
    "load_servable",
    "unload_servable",
    "start_model_control_poll",
    "register",
    "distributed",
]
