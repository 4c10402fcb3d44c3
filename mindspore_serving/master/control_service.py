"""MasterControl: workers register, report start-up failures and say goodbye here."""
import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.proto import internal_pb2, internal_pb2_grpc


class MasterControlServicer(internal_pb2_grpc.MasterControlServicer):
    def __init__(self, registry: WorkerRegistry, processes):
        self.registry = registry
        self.processes = processes

    async def Register(self, request, context):
        reply = internal_pb2.RegisterReply()
        if request.protocol_version != ipc.PROTOCOL_VERSION:
            reply.error.error_code = errors.SYSTEM_ERROR
            reply.error.error_msg = (f"worker protocol version {request.protocol_version} does not match master "
                                     f"protocol version {ipc.PROTOCOL_VERSION}").encode()
            return reply
        channel = grpc.aio.insecure_channel(request.address, options=ipc.INTERNAL_CHANNEL_OPTIONS)
        record = WorkerRecord(key=request.worker_key, pid=request.worker_pid, address=request.address,
                              servable_name=request.servable_name, version_number=request.version_number,
                              batch_size=max(1, request.batch_size),
                              methods={m.name: m for m in request.methods}, extensions=dict(request.extensions),
                              device_id=request.device_id,
                              stub=internal_pb2_grpc.WorkerServiceStub(channel), channel=channel)
        old = self.registry.add(record)
        if old is not None and old.channel is not None:
            await old.channel.close()
        self.processes.mark_registered(request.worker_key)
        log.info(f"Register success: worker address: {request.address}, servable name: {request.servable_name}, "
                 f"version number: {request.version_number}, pid: {request.worker_pid}")
        return reply

    async def NotifyFailed(self, request, context):
        log.error(f"worker {request.worker_key} (pid {request.worker_pid}) failed to start: {request.error_msg}")
        self.processes.mark_failed(request.worker_key, request.error_msg)
        return internal_pb2.Empty()

    async def Exit(self, request, context):
        log.info(f"worker {request.worker_key} (pid {request.worker_pid}) is exiting: {request.reason}")
        self.processes.mark_exiting(request.worker_key)
        record = self.registry.remove(request.worker_key, request.worker_pid)
        if record is not None and record.channel is not None:
            await record.channel.close()
        return internal_pb2.Empty()
