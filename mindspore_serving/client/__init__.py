"""MindSpore Serving client: `Client(address, servable_name, method_name).infer(instances)`."""

from mindspore_serving.client.client import Client, ClientGrpcAsyncError, ClientGrpcAsyncResult, SSLConfig

__all__ = ["Client", "ClientGrpcAsyncError", "ClientGrpcAsyncResult", "SSLConfig"]
