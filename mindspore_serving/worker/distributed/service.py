"""DistributedWorker: what the distributed worker serves to `startup_agents` and to the rank agents."""

import grpc

from mindspore_serving import log
from mindspore_serving.ipc import distributed as protocol
from mindspore_serving.proto import distributed_pb2 as dpb
from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc
from mindspore_serving.proto import ms_service_pb2 as pb
from mindspore_serving.spec.servable import ModelSpec
from mindspore_serving.worker.distributed.agent_group import AgentGroup, RegistrationRefused


def _error(message: str) -> pb.ErrorMsg:
    return pb.ErrorMsg(error_code=1, error_msg=message.encode())


class DistributedWorkerServicer(dpb_grpc.DistributedWorkerServicer):
    def __init__(self, group: AgentGroup, model_spec: ModelSpec, rank_table_content: str):
        self.group = group
        self.model_spec = model_spec
        self.rank_table_content = rank_table_content

    def AcquireConfig(self, request, context):
        if request.protocol_version != protocol.DISTRIBUTED_PROTOCOL_VERSION:
            return dpb.AgentConfig(
                error=_error(
                    f"agent protocol version {request.protocol_version} does not match the worker's "
                    f"{protocol.DISTRIBUTED_PROTOCOL_VERSION}"
                )
            )
        group = self.group
        return dpb.AgentConfig(
            rank_table_content=self.rank_table_content,
            rank_list=[dpb.RankInfo(ip=rank.ip, device_id=rank.device_id) for rank in group.rank_list],
            servable_name=self.model_spec.model_key,
            with_batch_dim=self.model_spec.with_batch_dim,
            without_batch_dim_inputs=list(self.model_spec.without_batch_dim_inputs),
            rank_size=group.rank_size,
            stage_size=group.stage_size,
            scheduler_address=group.scheduler_address,
        )

    def PublishScheduler(self, request, context):
        log.info(f"the agents' cluster scheduler listens on {request.scheduler_address}")
        self.group.scheduler_address = request.scheduler_address
        return dpb.Reply()

    def RegisterAgent(self, request, context):
        try:
            return dpb.RegisterAgentReply(notice_token=self.group.register(request, context.peer()))
        except RegistrationRefused as err:
            return dpb.RegisterAgentReply(error=_error(str(err)))

    def AgentFailed(self, request, context):
        self._agent_notice(request, context, "failed to start", ends_start=True)
        return dpb.Reply()

    def AgentExit(self, request, context):
        self._agent_notice(request, context, "exited", ends_start=False)
        return dpb.Reply()

    def _agent_notice(self, request, context, what: str, ends_start: bool):
        """A notice stops the group when it carries the notice token of a registered rank. Without one, only a
        failure to start is heard, and only while ranks still register (its ranks may have failed before they
        registered), from a host of the rank table; the rest is refused and changes nothing."""
        rank_id = self.group.notice_sender(request.notice_token)
        if rank_id is None:
            refusal = self._tokenless_refusal(request, ends_start)
            if refusal:
                log.warning(
                    f"a notice that agents on {request.agent_ip!r} {what}, from {context.peer()}, is refused: {refusal}"
                )
                context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        sender = f"rank {rank_id}'s starter" if rank_id is not None else "a starter none of whose ranks registered"
        log.error(f"agents on {request.agent_ip} {what} (notice of {sender}, from {context.peer()}): {request.reason}")
        self.group.fail(f"agents on {request.agent_ip} {what}: {request.reason}")

    def _tokenless_refusal(self, request, ends_start: bool):
        """Why a notice without a registered rank's notice token is refused; None: it is heard."""
        if request.notice_token:
            return "the notice token is no registered rank's"
        if not ends_start or not self.group.forming():
            return "the notice carries no notice token of a registered rank"
        if request.agent_ip not in {rank.ip for rank in self.group.rank_list}:
            return f"'{request.agent_ip}' is no host of the rank table"
        return None
