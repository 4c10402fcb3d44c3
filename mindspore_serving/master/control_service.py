"""MasterControl: workers register, report start-up failures and say goodbye here; extra workers learn their
servable's model shapes and have their model calls forwarded to a worker that owns the models.

Only workers this master started are heard: each call carries the caller's worker key and the secret the master
gave that worker (ipc.peer_metadata); a call without them, or a Register, NotifyFailed or Exit about another
worker's key, ends with PERMISSION_DENIED and changes nothing."""

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.ipc.predict_socket import PredictChannel
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.proto import internal_pb2, internal_pb2_grpc


def worker_record(request: internal_pb2.RegisterRequest) -> WorkerRecord:
    """The record of a registering worker, with channels of this process to it (gRPC and its Predict socket)."""
    channel = grpc.aio.insecure_channel(request.address, options=ipc.INTERNAL_CHANNEL_OPTIONS)
    return WorkerRecord(
        key=request.worker_key,
        pid=request.worker_pid,
        address=request.address,
        servable_name=request.servable_name,
        version_number=request.version_number,
        batch_size=max(1, request.batch_size),
        methods={m.name: m for m in request.methods},
        extensions=dict(request.extensions),
        device_id=request.device_id,
        extra_index=request.extra_index if request.extra else None,
        owns_device=request.owns_device,
        model_infos=dict(request.model_infos),
        stub=internal_pb2_grpc.WorkerServiceStub(channel),
        channel=channel,
        predict=PredictChannel(request.predict_address) if request.predict_address else None,
        registration=request,
    )


class MasterControlServicer(internal_pb2_grpc.MasterControlServicer):
    def __init__(self, registry: WorkerRegistry, processes):
        self.registry = registry
        self.processes = processes

    async def _check_caller(self, context, key=None) -> str:
        """The key of the worker making this call; the call is refused unless it is one this master started (and,
        given `key`, that one)."""
        caller = ipc.peer_of(context.invocation_metadata(), self.processes.secret_of)
        if caller is None or (key is not None and caller != key):
            log.warning(
                f"refused a {'call' if key is None else 'notice about worker ' + repr(key)} on the master's "
                f"control socket: the caller is not a worker this master started"
                + (f" (it says {caller!r})" if caller else "")
            )
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not a worker this master started")
        return caller

    async def Register(self, request, context):
        await self._check_caller(context, request.worker_key)
        reply = internal_pb2.RegisterReply()
        if request.protocol_version != ipc.PROTOCOL_VERSION:
            reply.error.error_code = errors.SYSTEM_ERROR
            reply.error.error_msg = (
                f"worker protocol version {request.protocol_version} does not match master "
                f"protocol version {ipc.PROTOCOL_VERSION}"
            ).encode()
            return reply
        record = worker_record(request)
        old = self.registry.add(record)
        if old is not None:
            await old.close_channels()
        python_stages = not request.extensions and not all(m.only_model_stage for m in request.methods)
        self.processes.mark_registered(request.worker_key, python_stages)
        log.info(
            f"Register success: worker address: {request.address}, servable name: {request.servable_name}, "
            f"version number: {request.version_number}, pid: {request.worker_pid}"
        )
        return reply

    async def NotifyFailed(self, request, context):
        await self._check_caller(context, request.worker_key)
        self.processes.mark_failed(request.worker_key, request.worker_pid, request.error_msg)
        return internal_pb2.Empty()

    async def Exit(self, request, context):
        await self._check_caller(context, request.worker_key)
        log.info(f"worker {request.worker_key} (pid {request.worker_pid}) is exiting: {request.reason}")
        self.processes.mark_exiting(request.worker_key)
        record = self.registry.remove(request.worker_key, request.worker_pid)
        if record is not None:
            await record.close_channels()
        return internal_pb2.Empty()

    async def GetModelInfo(self, request, context):
        """The shapes of a servable version's models, as a worker that loaded them registered them."""
        await self._check_caller(context)
        reply = internal_pb2.GetModelInfoReply()
        owners = self.registry.model_owners(request.servable_name, request.version_number)
        if not owners:
            reply.error.error_code = errors.FAILED
            reply.error.error_msg = (
                f"Servable '{request.servable_name}' has models declared by declare_model, but "
                f"parameter 'device_ids' of ServableStartConfig is not set in Serving startup "
                f"script when the device target is not CPU"
            ).encode()
            return reply
        for key, info in owners[0].model_infos.items():
            reply.model_infos[key].CopyFrom(info)
        return reply

    async def CallModel(self, request, context):
        """An extra worker's model call, run by the least busy worker that owns the servable version's models.
        Its tensors are in shared memory: only their places pass through here."""
        await self._check_caller(context)
        owners = self.registry.model_owners(request.servable_name, request.version_number)
        if not owners:
            return _call_failed(
                errors.WORKER_UNAVAILABLE,
                f"no worker of servable {request.servable_name} version {request.version_number} "
                f"runs model {request.model_key} now",
            )
        owner = self.registry.pick(owners)
        try:
            return await owner.stub.CallModel(request, timeout=context.time_remaining())
        except ipc.CONNECTION_ERRORS as err:
            details = f"{err.code().name} {err.details()}" if isinstance(err, grpc.aio.AioRpcError) else str(err)
            return _call_failed(
                errors.WORKER_UNAVAILABLE,
                f"the worker (pid {owner.pid}) running model {request.model_key} did not answer: {details}",
            )


def _call_failed(code: int, message: str) -> internal_pb2.CallModelReply:
    reply = internal_pb2.CallModelReply()
    reply.error_msg.add(error_code=code, error_msg=message.encode())
    return reply
