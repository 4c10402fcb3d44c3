"""The rank agents of a distributed servable, seen from its worker: their registrations, the checks of their
tensor infos, and the pipeline that runs the model through them (`DistributedModel`, a LoadedModel whose one
subgraph is remote, so batching and stages work as for a local model)."""

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from mindspore_serving import log
from mindspore_serving.ipc import distributed as protocol
from mindspore_serving.proto import distributed_pb2 as dpb
from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc
from mindspore_serving.spec.servable import ModelSpec
from mindspore_serving.worker.distributed.rank_table import RankConfig, stage_ranks
from mindspore_serving.worker.model_backend import LoadedModel, TensorInfo


@dataclass
class RankAgent:
    rank_id: int
    address: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    channel: grpc.Channel
    stub: dpb_grpc.RankAgentStub
    call_token: str = ""  # the rank's: this worker's calls to it carry it
    notice_token: str = ""  # this worker's, for the rank: its starter's notices carry it
    peer: str = ""  # where the registration came from


class RegistrationRefused(RuntimeError):
    """A RegisterAgent the group does not take; the text goes back to the agent."""


def _describe(info: TensorInfo) -> str:
    return f"size: {info.nbytes}, data type: {np.dtype(info.dtype).name}, shape: {list(info.shape)}"


def compare_infos(lefts: Sequence[TensorInfo], rights: Sequence[TensorInfo]) -> str | None:
    """Why two lists of tensor infos differ, in MindSpore Serving's words, or None."""
    if len(lefts) != len(rights):
        return f"Size not match, left: {len(lefts)}, right: {len(rights)}"
    for index, (left, right) in enumerate(zip(lefts, rights)):
        if tuple(left.shape) != tuple(right.shape) or np.dtype(left.dtype) != np.dtype(right.dtype):
            return f"Index {index} tensor not match, left- {_describe(left)}; right- {_describe(right)}"
    return None


def check_agent_infos(agents: dict[int, RankAgent], rank_size: int, stage_size: int):
    """Ranks of a stage take the same inputs and give the same outputs; stage 0 takes the model's inputs and each
    later stage takes the outputs of the stage before it. RuntimeError names the first mismatch."""
    if len(agents) != rank_size:
        raise RuntimeError(f"Registered agents size {len(agents)} not match rank size {rank_size}")
    if not agents[0].inputs:
        raise RuntimeError("Rank 0 input count cannot be 0")
    if not agents[rank_size - 1].outputs:
        raise RuntimeError(f"Rank {rank_size - 1} output count cannot be 0")
    previous_outputs, previous_rank = None, None
    for ranks in stage_ranks(rank_size, stage_size):
        first = agents[ranks[0]]
        for rank_id in ranks:
            agent = agents[rank_id]
            if previous_outputs is None:
                reason = compare_infos(agent.inputs, agents[0].inputs)
                if reason:
                    raise RuntimeError(f"Rank {rank_id} input infos not match rank 0, subgraph: 0, details: {reason}")
            else:
                reason = compare_infos(agent.inputs, previous_outputs)
                if reason:
                    raise RuntimeError(
                        f"Rank {rank_id} input infos not match the outputs of rank {previous_rank}, "
                        f"the last rank of the previous stage, subgraph: 0, details: {reason}"
                    )
            reason = compare_infos(agent.outputs, first.outputs)
            if reason:
                raise RuntimeError(
                    f"Rank {rank_id} output infos not match rank {ranks[0]}, subgraph: 0, details: {reason}"
                )
        previous_outputs, previous_rank = agents[ranks[-1]].outputs, ranks[-1]


class AgentGroup:
    """The ranks that registered with this worker; `predict` runs one batch through all stages."""

    def __init__(
        self,
        rank_list: list[RankConfig],
        rank_size: int,
        stage_size: int,
        timeout: float = protocol.RANK_PREDICT_TIMEOUT,
    ):
        self.rank_list = rank_list
        self.rank_size = rank_size
        self.stage_size = stage_size
        self.timeout = timeout
        self.agents: dict[int, RankAgent] = {}
        self.scheduler_address = ""
        self._lock = threading.Lock()
        self._predict_lock = threading.Lock()  # collectives need every rank to run the same batch at once
        self.all_registered = threading.Event()
        self.failure: str | None = None
        self.failed = threading.Event()
        self.on_failure: Callable[[str], None] = lambda reason: None

    # ---- registration ----
    def register(self, request: dpb.RegisterAgentRequest, peer: str = "") -> str:
        """Records one rank and returns its notice token; RegistrationRefused says why not. A rank registers
        once: a second registration of it is refused, since one of the two is not this servable's agent."""
        if request.protocol_version != protocol.DISTRIBUTED_PROTOCOL_VERSION:
            raise RegistrationRefused(
                f"agent protocol version {request.protocol_version} does not match the "
                f"worker's {protocol.DISTRIBUTED_PROTOCOL_VERSION}"
            )
        if not request.call_token:
            raise RegistrationRefused(f"the registration of rank {request.rank_id} carries no call token")
        with self._lock:
            if self.all_registered.is_set() or self.failed.is_set():
                raise RegistrationRefused("Distributed servable has ended up registration")
            if request.rank_id >= self.rank_size:
                raise RegistrationRefused(f"Invalid rank id {request.rank_id}, rank size {self.rank_size}")
            first = self.agents.get(request.rank_id)
            if first is not None:
                log.error(
                    f"rank {request.rank_id} registered again, address {request.address}, from {peer}: "
                    f"refused; it registered first with address {first.address}, from {first.peer}. One of "
                    f"them is not an agent of this servable"
                )
                raise RegistrationRefused(
                    f"rank {request.rank_id} is already registered, with address "
                    f"{first.address}; a second registration of it is refused"
                )
            channel = protocol.channel(request.address)
            infos = [
                [TensorInfo(shape, dtype) for shape, dtype in protocol.tensor_infos_from_proto(field)]
                for field in (request.inputs, request.outputs)
            ]
            agent = RankAgent(
                request.rank_id,
                request.address,
                infos[0],
                infos[1],
                channel,
                dpb_grpc.RankAgentStub(channel),
                request.call_token,
                protocol.new_token(),
                peer,
            )
            self.agents[request.rank_id] = agent
            log.info(f"Rank {request.rank_id} been registered, address {request.address}, from {peer}")
            if len(self.agents) >= self.rank_size:
                self.all_registered.set()
        return agent.notice_token

    def notice_sender(self, notice_token: str) -> int | None:
        """The registered rank whose notice token this is; None when it is none's."""
        with self._lock:
            agents = list(self.agents.values())
        for agent in agents:
            if protocol.same_token(notice_token, agent.notice_token):
                return agent.rank_id
        return None

    def forming(self) -> bool:
        """Whether ranks may still register (neither all of them did nor did the start fail)."""
        return not self.all_registered.is_set() and not self.failed.is_set()

    def fail(self, reason: str):
        """The agents cannot serve (a group failed to start, or lost a rank): the worker stops."""
        if self.failure is None:
            self.failure = reason
        self.failed.set()
        self.on_failure(reason)

    def wait_ready(self, seconds: int, stopping: threading.Event):
        """Blocks until every rank registered (seconds=0: no limit); RuntimeError otherwise."""
        limit = float(seconds) if seconds else float("inf")
        waited = 0.0
        while not self.all_registered.wait(0.1):
            waited += 0.1
            if self.failed.is_set():
                raise RuntimeError(f"Failed to starting all agents, maybe some error reported: {self.failure}")
            if stopping.is_set():
                raise RuntimeError("Worker or Agents has stopped")
            if waited >= limit:
                raise RuntimeError(
                    f"Failed to wait for ready of all agents, current agents count: {len(self.agents)}, "
                    f"rank size: {self.rank_size}"
                )
        check_agent_infos(self.agents, self.rank_size, self.stage_size)

    # ---- inference ----
    def predict(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Runs the stages in order: stage 0's ranks get `inputs`, each later stage's ranks get the outputs of the
        last rank of the stage before; the last rank's outputs are returned."""
        with self._predict_lock:
            if self.failed.is_set():
                raise RuntimeError(f"Distributed servable is unavailable: {self.failure}")
            try:
                values = list(inputs)
                for ranks in stage_ranks(self.rank_size, self.stage_size):
                    values = self._run_stage(ranks, values)
                return values
            except RuntimeError as err:
                log.error(f"Predict error happened, now exit distributed servable: {err}")
                self.fail(str(err))
                raise

    def _run_stage(self, ranks: list[int], values: Sequence[np.ndarray]) -> list[np.ndarray]:
        request_id = uuid.uuid4().hex
        futures = []
        for rank_id in ranks:
            agent = self.agents[rank_id]
            request = dpb.RankPredictRequest(
                request_id=request_id, return_result=rank_id == ranks[-1], call_token=agent.call_token
            )
            protocol.arrays_to_tensors(values, request.inputs)
            futures.append(agent.stub.Predict.future(request, timeout=self.timeout))
        reply = None
        for rank_id, future in zip(ranks, futures):
            try:
                reply = future.result()
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise RuntimeError(f"Failed to wait for result of rank {rank_id}") from None
                raise RuntimeError(f"Error happened on get result of rank {rank_id}: {err.details()}") from None
            if reply.error.error_code:
                raise RuntimeError(
                    f"Error happened on get result of rank {rank_id}: {reply.error.error_msg.decode(errors='replace')}"
                )
        return protocol.tensors_to_arrays(reply.outputs)

    def close(self, reason: str):
        """Asks every rank to exit (the agents then stop their whole group)."""
        with self._lock:
            agents = list(self.agents.values())
        for agent in agents:
            try:
                agent.stub.Exit(dpb.ExitRequest(reason=reason, call_token=agent.call_token), timeout=2)
            except grpc.RpcError:
                pass
            agent.channel.close()


class _RemoteSubgraph:
    def __init__(self, group: AgentGroup):
        self.group = group
        self.path = "(rank agents)"
        self.inputs = group.agents[0].inputs
        self.outputs = group.agents[group.rank_size - 1].outputs

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.group.predict(inputs)


class DistributedModel(LoadedModel):
    """The distributed servable's model: one subgraph run by the rank agents."""

    def __init__(self, spec: ModelSpec, group: AgentGroup):  # pylint: disable=super-init-not-called
        self.spec = spec
        self.subgraphs = [_RemoteSubgraph(group)]
        self.batch_size = self._check_batch_size()
        self.device_target = "CPU"
