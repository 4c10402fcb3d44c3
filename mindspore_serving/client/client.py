"""MindSpore Serving's Python gRPC client."""

import grpc

from mindspore_serving.client import convert
from mindspore_serving.common.check_type import check_int, check_str
from mindspore_serving.proto import ms_service_pb2_grpc

MAX_MSG_BYTES = 512 * 1024 * 1024


def _read_file(path):
    if path is None:
        return None
    with open(path, "rb") as file:
        return file.read()


class SSLConfig:
    """TLS settings of a Client.

    Args:
        certificate (str, optional): PEM file of the client's certificate chain (mutual TLS). Default: None.
        private_key (str, optional): PEM file of the client's private key, given together with certificate.
            Default: None.
        custom_ca (str, optional): PEM file of the root certificates that verify the server; None uses gRPC's
            default roots. Default: None.
    """

    def __init__(self, certificate=None, private_key=None, custom_ca=None):
        if certificate is not None:
            check_str("certificate", certificate)
        if private_key is not None:
            check_str("private_key", private_key)
        if custom_ca is not None:
            check_str("custom_ca", custom_ca)
        self.certificate = certificate
        self.private_key = private_key
        self.custom_ca = custom_ca


class ClientGrpcAsyncResult:
    """What `Client.infer_async` returns; `result()` waits for the reply and parses it like `infer`."""

    def __init__(self, result_future):
        self.result_future = result_future

    def result(self):
        try:
            reply = self.result_future.result()
        except grpc.RpcError as err:
            return convert.rpc_error_result(err)
        return convert.parse_reply(reply)


class ClientGrpcAsyncError:
    """An async result that failed before the call was sent."""

    def __init__(self, result_error):
        self.result_error = result_error

    def result(self):
        return self.result_error


class Client:
    """Calls one method of a servable through the MSService gRPC API.

    Args:
        address (str): "host:port" or "unix:<path>".
        servable_name (str): the servable.
        method_name (str): the method of the servable.
        version_number (int, optional): the servable version; 0 means the newest running one. Default: 0.
        ssl_config (SSLConfig, optional): TLS settings; None for a plain connection. Default: None.
        api_key (str, optional): the key of a server started with `--api_key`, sent on every call as the
            metadata `authorization: Bearer <key>`. Default: None.

    Messages up to 512 MiB are sent and received (the server accepts 100 MiB by default).

    Examples:
        >>> import numpy as np
        >>> from mindspore_serving.client import Client
        >>> client = Client("127.0.0.1:5500", "add", "add_common")
        >>> x = np.ones((2, 2), np.float32)
        >>> client.infer([{"x1": x, "x2": x}])   # [{'y': array([[2., 2.], [2., 2.]], dtype=float32)}]
    """

    def __init__(self, address, servable_name, method_name, version_number=0, ssl_config=None, api_key=None):
        check_str("address", address)
        check_str("servable_name", servable_name)
        check_str("method_name", method_name)
        if isinstance(version_number, bool):  # MindSpore Serving's client takes a bool as the int it is
            version_number = int(version_number)
        check_int("version_number", version_number, 0)
        self.address = address
        self.servable_name = servable_name
        self.method_name = method_name
        self.version_number = version_number
        # a server started with an API key wants it on every call (metadata `authorization: Bearer <key>`)
        self.metadata = (("authorization", f"Bearer {check_str('api_key', api_key)}"),) if api_key is not None else None

        options = [("grpc.max_send_message_length", MAX_MSG_BYTES), ("grpc.max_receive_message_length", MAX_MSG_BYTES)]
        if ssl_config is not None:
            if not isinstance(ssl_config, SSLConfig):
                raise RuntimeError("The type of ssl_config should be type of SSLConfig")
            certificate = _read_file(ssl_config.certificate)
            private_key = _read_file(ssl_config.private_key)
            custom_ca = _read_file(ssl_config.custom_ca)
            if (certificate is None) != (private_key is None):
                raise RuntimeError("The certificate and private_key should be passed at the same time")
            credentials = grpc.ssl_channel_credentials(
                root_certificates=custom_ca, private_key=private_key, certificate_chain=certificate
            )
            self.channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.stub = ms_service_pb2_grpc.MSServiceStub(self.channel)

    def infer(self, instances):
        """Runs the method on one instance (a dict) or a list/tuple of them.

        Values may be numpy arrays or numbers, Python bool/int/float, str or bytes. Returns a list with one
        dict of outputs per instance (`{"error": msg}` for a failed one), or `{"error": msg}` when the whole
        request failed. Raises RuntimeError for inputs that cannot be sent."""
        request = self._create_request(instances)
        try:
            reply = self.stub.Predict(request, metadata=self.metadata)
        except grpc.RpcError as err:
            return convert.rpc_error_result(err)
        return convert.parse_reply(reply)

    def infer_async(self, instances):
        """Like `infer`, but returns at once; call `.result()` on the returned object to wait for the outputs."""
        request = self._create_request(instances)
        try:
            return ClientGrpcAsyncResult(self.stub.Predict.future(request, metadata=self.metadata))
        except grpc.RpcError as err:
            return ClientGrpcAsyncError(convert.rpc_error_result(err))

    def infer_stream(self, instance):
        """Streams the outputs of one instance of a streaming method (an LLM servable's `generate`).

        Yields one dict per generated token (`{"token_id", "text", "index"}`), then a final dict with
        `"finished": True` and the whole result (`text`, `token_ids`, `finish_reason`, token counts).
        An error ends the stream with `{"error": msg}`; closing the iterator cancels the request."""
        if isinstance(instance, (list, tuple)):
            if len(instance) != 1:
                raise RuntimeError("infer_stream takes exactly one instance")
            instance = instance[0]
        call = self.stub.PredictStream(self._create_request(instance), metadata=self.metadata)
        try:
            for reply in call:
                result = convert.parse_reply(reply)
                if isinstance(result, dict):  # a global error
                    yield result
                    return
                yield result[0]
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                yield convert.rpc_error_result(err)
        finally:
            call.cancel()

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _create_request(self, instances):
        return convert.create_request(instances, self.servable_name, self.method_name, self.version_number)
