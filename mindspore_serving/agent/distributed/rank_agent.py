"""One rank agent of a distributed servable: a rank of the MindSpore cluster that loads its shard's MindIR graph
and serves RankAgent.Predict to the distributed worker.

Started by `startup_agents` as `python -m mindspore_serving.agent.distributed.start_rank_agent ...` with the
cluster's environment (ms_cluster.rank_env). It writes its ready line with the notice token the worker gave it (or
FAILED_PREFIX + reason) on the pipe its starter passed; it takes Predict and Exit only with the call token it
registered with. It leaves with os._exit (MindSpore's exit handlers can block) when the worker says Exit, on
SIGINT/SIGTERM, or when its starter is gone.
"""

import argparse
import os
import signal
import sys
import threading
from concurrent import futures

import grpc
import numpy as np

from mindspore_serving import log
from mindspore_serving.common.mindir_info import read_mindir_input_infos
from mindspore_serving.common.ms_cluster import join_cluster
from mindspore_serving.common.ms_device import resolve_device, select_device
from mindspore_serving.ipc import distributed as protocol
from mindspore_serving.proto import distributed_pb2 as dpb
from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc
from mindspore_serving.proto import ms_service_pb2 as pb

PARENT_CHECK_SECONDS = 0.2


class RankGraph:
    """The rank's graph: mindspore.load + nn.GraphCell."""

    def __init__(self, path: str, dec_key=None, dec_mode="AES-GCM"):
        import mindspore as ms  # lazy: MindSpore loads only in rank processes
        from mindspore import nn  # lazy: as above

        kwargs = {"dec_key": dec_key, "dec_mode": dec_mode} if dec_key else {}
        self.cell = nn.GraphCell(ms.load(path, **kwargs))
        self.inputs = read_mindir_input_infos(path, dec_key, dec_mode)
        if self.inputs is None:
            raise RuntimeError(f"cannot read the inputs of model file '{path}'")
        # every rank runs this once at start-up, so collectives inside the graph find their peers
        self.outputs = [(out.shape, out.dtype) for out in self.run([np.zeros(s, d) for s, d in self.inputs])]

    def run(self, inputs):
        from mindspore import Tensor  # lazy: as above

        result = self.cell(*[Tensor(np.asarray(value, order="C")) for value in inputs])
        if not isinstance(result, (tuple, list)):
            result = (result,)
        return [out.asnumpy() for out in result]


class RankAgentServicer(dpb_grpc.RankAgentServicer):
    """Serves the worker this rank registered with: calls without the rank's call token are refused."""

    def __init__(self, graph: RankGraph, rank_id: int, on_exit, call_token: str):
        self.graph = graph
        self.rank_id = rank_id
        self.on_exit = on_exit
        self.call_token = call_token
        self._lock = threading.Lock()  # one graph call at a time: the worker sends batches in order

    def _check_caller(self, request, context, call: str):
        if not protocol.same_token(request.call_token, self.call_token):
            log.warning(
                f"rank {self.rank_id}: a {call} call from {context.peer()} is refused: it does not carry "
                f"the call token this rank registered with"
            )
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"rank {self.rank_id} takes calls only from the worker it registered with",
            )

    def Predict(self, request, context):
        self._check_caller(request, context, "Predict")
        try:
            inputs = protocol.tensors_to_arrays(request.inputs)
            with self._lock:
                outputs = self.graph.run(inputs)
        except Exception as err:  # the worker turns it into the request's error
            log.exception(f"rank {self.rank_id} predict failed")
            return dpb.RankPredictReply(
                request_id=request.request_id, error=pb.ErrorMsg(error_code=1, error_msg=str(err).encode())
            )
        reply = dpb.RankPredictReply(request_id=request.request_id)
        if request.return_result:
            protocol.arrays_to_tensors(outputs, reply.outputs)
        return reply

    def Exit(self, request, context):
        self._check_caller(request, context, "Exit")
        log.info(f"rank {self.rank_id} exits: {request.reason}")
        self.on_exit()
        return dpb.Reply()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MindSpore Serving distributed rank agent")
    parser.add_argument("--rank_id", type=int, required=True)
    parser.add_argument("--device_id", type=int, default=0)
    parser.add_argument("--model_file", required=True)
    parser.add_argument("--agent_address", required=True)
    parser.add_argument("--distributed_address", required=True)
    parser.add_argument("--ready_fd", type=int, required=True)
    parser.add_argument("--dec_mode", default="AES-GCM")
    parser.add_argument("--read_dec_key", action="store_true", help="read a hex decryption key from stdin")
    return parser.parse_args(argv)


def _start(args, stop: threading.Event):
    """Loads the graph, serves RankAgent and registers; returns the server and the worker's notice token."""
    dec_key = bytes.fromhex(sys.stdin.readline().strip()) if args.read_dec_key else None
    device = resolve_device(None)
    select_device(device, args.device_id)
    rank = join_cluster()
    if rank != args.rank_id:
        raise RuntimeError(f"the cluster gave rank {rank} to the agent of rank {args.rank_id}")
    graph = RankGraph(args.model_file, dec_key, args.dec_mode)
    call_token = protocol.new_token()
    server = protocol.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="rank-rpc"))
    dpb_grpc.add_RankAgentServicer_to_server(RankAgentServicer(graph, args.rank_id, stop.set, call_token), server)
    if not protocol.listen(server, args.agent_address):
        raise RuntimeError(f"cannot listen on agent address {args.agent_address}")
    server.start()
    with protocol.channel(args.distributed_address) as channel:
        reply = dpb_grpc.DistributedWorkerStub(channel).RegisterAgent(
            dpb.RegisterAgentRequest(
                protocol_version=protocol.DISTRIBUTED_PROTOCOL_VERSION,
                rank_id=args.rank_id,
                address=args.agent_address,
                inputs=protocol.tensor_infos_to_proto(graph.inputs),
                outputs=protocol.tensor_infos_to_proto(graph.outputs),
                pid=os.getpid(),
                call_token=call_token,
            ),
            timeout=30,
        )
    if reply.error.error_code:
        raise RuntimeError(f"register rank {args.rank_id} failed: {reply.error.error_msg.decode(errors='replace')}")
    return server, reply.notice_token


def main(argv=None):
    args = parse_args(argv)
    stop = threading.Event()
    parent = os.getppid()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        server, notice_token = _start(args, stop)
    except Exception as err:  # reported to the starter, which stops the whole group
        log.exception(f"rank {args.rank_id} failed to start")
        os.write(args.ready_fd, protocol.FAILED_PREFIX + str(err).replace("\n", " ").encode() + b"\n")
        os._exit(1)
    os.write(args.ready_fd, protocol.ready_line(notice_token))
    os.close(args.ready_fd)
    while not stop.wait(PARENT_CHECK_SECONDS):
        if os.getppid() != parent:
            log.warning(f"rank {args.rank_id}: the process that started the agents is gone, exiting")
            break
    os._exit(0)
