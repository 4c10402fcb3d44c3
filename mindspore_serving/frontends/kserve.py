"""The KServe v2 inference protocol on the master's ports: REST routes under `/v2` (served by RestfulApp before
FastAPI) and gRPC `inference.GRPCInferenceService` (added beside MSService). Converts (frontends/kserve_codec.py)
and delegates to the dispatcher; errors map in frontends/errors.py (Protocol.KSERVE).

    GET  /v2                                             server metadata
    GET  /v2/models/<model>[/versions/<v>]               model metadata
    POST /v2/models/<model>[/versions/<v>]/infer         inference (JSON, and the binary-data extension)
    POST /v2/repository/index                            the models served
    POST /v2/repository/models/<servable>/load | unload  model control (master/model_control.py), in a thread

The health routes (`/v2/health/...`, `/v2/models/<model>/ready`) are not handled here.
"""

import asyncio
import json
import re
import threading
from collections.abc import Sequence

from mindspore_serving import __version__, log
from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import proto_to_instance, value_to_tensor
from mindspore_serving.frontends import kserve_codec as codec
from mindspore_serving.frontends import request_ids
from mindspore_serving.frontends.errors import Protocol, classic_error, http_error, kserve_grpc_status
from mindspore_serving.master.model_control import NO_CONTROL_TEXT, check_servable_name
from mindspore_serving.proto import grpc_predict_v2_pb2 as v2
from mindspore_serving.proto import grpc_predict_v2_pb2_grpc as v2_grpc
from mindspore_serving.proto import ms_service_pb2

SERVER_NAME = "mindspore_serving"
EXTENSIONS = ["binary_tensor_data", "model_repository"]


class KServe:
    """The protocol's operations on the master's dispatcher (and its worker registry)."""

    def __init__(self, dispatcher, model_control=None):
        self.dispatcher = dispatcher
        self.model_control = model_control

    def _workers(self):
        return self.dispatcher.registry.all()

    @staticmethod
    def server_metadata() -> dict:
        return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}

    def server_ready(self) -> bool:
        return bool(self._workers())

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            codec.resolve(self._workers(), name, version)
        except errors.ServingError:
            return False
        return True

    def model_metadata(self, name: str, version: str = "") -> dict:
        model, _ = codec.resolve(self._workers(), name, version)
        return codec.model_metadata(model)

    def repository_index(self) -> list[dict]:
        return [
            {"name": model.name, "version": model.version, "state": "READY", "reason": ""}
            for _, model in sorted(codec.catalog(self._workers()).items())
        ]

    async def load(self, name: str, parameters: dict):
        """Loads servable `name` (parameter `version`: one version, else the newest) off the event loop."""
        check_servable_name(name)
        version = version_parameter(parameters)
        await _in_thread(self._control().load_by_name, name, version)

    async def unload(self, name: str, parameters: dict):
        """Unloads servable `name` (parameter `version`: that version only) once its requests drained."""
        check_servable_name(name)
        version = version_parameter(parameters)
        await _in_thread(self._control().unload, name, version)

    def _control(self):
        if self.model_control is None:
            raise errors.Forbidden(NO_CONTROL_TEXT)
        return self.model_control

    def resolve(self, name: str, version: str = ""):
        return codec.resolve(self._workers(), name, version)

    async def infer(
        self,
        model: codec.V2Model,
        number: int,
        tensors: Sequence[codec.V2Tensor],
        requested: Sequence[str] = (),
        timeout: float | None = None,
    ) -> list[codec.V2Tensor]:
        """The output tensors; raises ServingError when the request or any of its instances failed."""
        instances = codec.tensors_to_instances(model, tensors)
        request = ms_service_pb2.PredictRequest()
        spec = ms_service_pb2.ServableSpec(name=model.servable, method_name=model.method, version_number=number)
        for instance in instances:
            item = request.instances.add()
            for key, value in instance.items():
                value_to_tensor(value, item.items[key])
        results = await self.dispatcher.predict(spec, request.instances, timeout=timeout)
        for result in results:
            if isinstance(result, BaseException):
                raise errors.as_serving_error(result)
        return codec.instances_to_tensors(model, [proto_to_instance(r, copy=False) for r in results], requested)


def version_parameter(parameters: dict) -> int:
    """The `version` parameter of a load or unload request (a number, or its text), 0 when absent."""
    value = (parameters or {}).get("version", 0)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise errors.InvalidInputs(f"parameter 'version' must be a version number >= 0, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------------ REST

_MODEL = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
_ROUTES = [
    ("GET", re.compile(r"/v2/?"), "server"),
    ("GET", re.compile(_MODEL + "/?"), "metadata"),
    ("POST", re.compile(_MODEL + "/infer"), "infer"),
    ("POST", re.compile(r"/v2/repository/index"), "index"),
    ("POST", re.compile(r"/v2/repository/models/(?P<name>[^/]+)/(?P<action>load|unload)"), "control"),
]


def route_of(method: str, path: str) -> tuple[str, dict] | None:
    """(route, path parameters) of a v2 request this module serves, or None (the health routes among them)."""
    if not path.startswith("/v2"):
        return None
    for http_method, pattern, route in _ROUTES:
        match = pattern.fullmatch(path)
        if match is not None:
            if method != http_method:
                return None
            return route, {k: v or "" for k, v in match.groupdict().items()}
    return None


def _json(status: int, payload, extra=()) -> tuple[int, list, bytes]:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return status, [(b"content-type", b"application/json")] + list(extra), body


def handle_error(error: BaseException) -> tuple[int, list, bytes]:
    status, payload = http_error(Protocol.KSERVE, error)
    return _json(status, payload)


async def handle_rest(kserve: KServe, route: str, params: dict, headers: dict, body: bytes) -> tuple[int, list, bytes]:
    """(HTTP status, headers, body) of a v2 REST request; `headers` maps lower-case names to values."""
    try:
        if route == "server":
            return _json(200, kserve.server_metadata())
        if route == "metadata":
            return _json(200, kserve.model_metadata(params["name"], params["version"]))
        if route == "index":
            return _json(200, kserve.repository_index())
        if route == "control":
            parameters = _control_parameters(body)
            if params["action"] == "load":
                await kserve.load(params["name"], parameters)
            else:
                await kserve.unload(params["name"], parameters)
            return _json(200, {})
        return await _infer_rest(kserve, params, headers, body)
    except errors.ServingError as err:
        return handle_error(err)
    except Exception as err:  # pylint: disable=broad-except
        log.exception("KServe v2 request failed")
        return handle_error(classic_error(err))


def _control_parameters(body: bytes) -> dict:
    """The `parameters` object of a repository load/unload body (which may be empty)."""
    if not body.strip():
        return {}
    try:
        request = json.loads(body)
    except ValueError as err:
        raise errors.InvalidInputs(f"the request body is not JSON: {err}") from None
    parameters = request.get("parameters", {}) if isinstance(request, dict) else None
    if not isinstance(parameters, dict):
        raise errors.InvalidInputs("the request body must be a JSON object with an object 'parameters'")
    return parameters


async def _infer_rest(kserve: KServe, params: dict, headers: dict, body: bytes):
    model, number = kserve.resolve(params["name"], params["version"])
    length = headers.get(codec.HEADER_LENGTH)
    if length is not None:
        try:
            length = int(length)
        except ValueError:
            raise errors.InvalidInputs(f"Inference-Header-Content-Length '{length}' is not a number") from None
    tensors, outputs, request = codec.parse_rest_request(model.name, body, length)
    binary_default = bool(codec.parameter(request.get("parameters"), "binary_data_output", False))
    out = await kserve.infer(model, number, tensors, [name for name, _ in outputs])
    wanted = dict(outputs)
    binary = {t.name: (wanted.get(t.name) if wanted.get(t.name) is not None else binary_default) for t in out}
    reply, header_length = codec.encode_rest_reply(model, str(number or model.version), request, out, binary)
    if header_length is None:
        return 200, [(b"content-type", b"application/json")], reply
    return (
        200,
        [(b"content-type", b"application/octet-stream"), (codec.HEADER_LENGTH.encode(), str(header_length).encode())],
        reply,
    )


# ------------------------------------------------------------------------------------------------ gRPC


class GRPCInferenceServicer(v2_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService: converts and delegates to KServe; every error ends the call with the
    status frontends/errors.py gives its kind."""

    def __init__(self, kserve: KServe):
        self.kserve = kserve

    async def ServerLive(self, request, context):
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return v2.ServerReadyResponse(ready=self.kserve.server_ready())

    async def ModelReady(self, request, context):
        return v2.ModelReadyResponse(ready=self.kserve.model_ready(request.name, request.version))

    async def ServerMetadata(self, request, context):
        return v2.ServerMetadataResponse(**self.kserve.server_metadata())

    async def ModelMetadata(self, request, context):
        try:
            return codec.metadata_to_grpc(self.kserve.model_metadata(request.name, request.version))
        except errors.ServingError as err:
            await context.abort(kserve_grpc_status(err), errors.message_of(err))

    async def ModelInfer(self, request, context):
        request_ids.bind_grpc(context)
        try:
            model, number = self.kserve.resolve(request.model_name, request.model_version)
            tensors = codec.grpc_request_tensors(model.name, request)
            out = await self.kserve.infer(
                model, number, tensors, [o.name for o in request.outputs], timeout=context.time_remaining()
            )
            return codec.grpc_reply(model, str(number or model.version), request, out)
        except errors.ServingError as err:
            error = err
        except Exception as err:  # pylint: disable=broad-except
            log.exception("KServe v2 ModelInfer failed")
            error = classic_error(err)
        await context.abort(kserve_grpc_status(error), errors.message_of(error))

    async def RepositoryIndex(self, request, context):
        reply = v2.RepositoryIndexResponse()
        for model in self.kserve.repository_index():
            reply.models.add(**model)
        return reply

    async def RepositoryModelLoad(self, request, context):
        await self._control(self.kserve.load, request, context)
        return v2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self._control(self.kserve.unload, request, context)
        return v2.RepositoryModelUnloadResponse()

    @staticmethod
    async def _control(operation, request, context):
        parameters = {
            key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
            for key, value in request.parameters.items()
        }
        try:
            await operation(request.model_name, parameters)
            return
        except errors.ServingError as err:
            error = err
        except Exception as err:  # pylint: disable=broad-except
            log.exception("KServe v2 repository control failed")
            error = classic_error(err)
        await context.abort(kserve_grpc_status(error), errors.message_of(error))


def add_kserve_servicer(dispatcher, server, model_control=None):
    v2_grpc.add_GRPCInferenceServiceServicer_to_server(GRPCInferenceServicer(KServe(dispatcher, model_control)), server)


async def _in_thread(function, *args):
    """`function(*args)` in a thread of its own, awaited from the event loop. Not an executor: serving_server.py's
    main thread returns once the server runs, and from then on Python refuses new executor work ("cannot schedule
    new futures after interpreter shutdown")."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def run():
        try:
            result = function(*args)
        except BaseException as err:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(lambda error=err: future.done() or future.set_exception(error))
        else:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

    threading.Thread(target=run, name=f"model-control-{function.__name__}", daemon=True).start()
    return await future
