"""The distributed worker process (`server.distributed.start_servable`): imports servable_config.py, parses the
rank table, serves DistributedWorker on distributed_address until every rank agent registered, then serves
WorkerService and registers with the master like any worker. It is never restarted; it exits when its agents
are lost or a prediction fails (as MindSpore Serving's distributed worker does), and tells its agents to exit.
"""

import argparse
import os
from concurrent import futures

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.ipc import distributed as protocol
from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc
from mindspore_serving.worker import process as worker_process
from mindspore_serving.worker.distributed.agent_group import AgentGroup, DistributedModel
from mindspore_serving.worker.distributed.rank_table import check_rank_config, parse_rank_table, read_rank_table
from mindspore_serving.worker.distributed.service import DistributedWorkerServicer
from mindspore_serving.worker.servable_loader import import_servable_config
from mindspore_serving.worker.servable_runtime import ServableRuntime


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MindSpore Serving distributed worker")
    parser.add_argument("--servable_directory", required=True)
    parser.add_argument("--servable_name", required=True)
    parser.add_argument("--version_number", type=int, default=1)
    parser.add_argument("--rank_table_json_file", required=True)
    parser.add_argument("--distributed_address", required=True)
    parser.add_argument("--wait_agents_time_in_seconds", type=int, default=0)
    parser.add_argument("--master_address", required=True)
    parser.add_argument("--worker_key", required=True)
    args = parser.parse_args(argv)
    args.device_id, args.device_type = 0, "none"
    args.read_dec_key, args.dec_mode = False, "AES-GCM"
    return args


def distributed_declaration(spec, servable_name: str):
    """The servable's DistributedSpec and model spec; RuntimeError in MindSpore Serving's words otherwise."""
    if spec is None or not spec.models:
        raise RuntimeError(
            f"Distributed servable '{servable_name}' has not been declared or has been declared more "
            f"than once, declared number: 0"
        )
    if not spec.distributed:
        raise RuntimeError(f"Servable '{servable_name}' is not registered as distributed servable")
    if not spec.methods:
        raise errors.core_failure("There is no method registered for servable")
    return spec.distributed_spec, spec.models[servable_name]


def warn_if_exposed(distributed_address: str):
    """Logs what is open to other hosts when the worker listens beyond this host with neither secret nor TLS."""
    exposed = protocol.exposure_warning(
        distributed_address,
        "the distributed worker",
        "any process that reaches it can read the rank table, register as a rank before the real agent does "
        "(which then fails to start), and end the start with a failure notice while ranks register; the tensors "
        "and tokens it exchanges with the ranks travel in plaintext",
    )
    if exposed:
        log.warning(exposed)


class DistributedWorker(worker_process.Worker):
    def __init__(self, args):
        super().__init__(args)
        self.group = None
        self.distributed_server = None

    @property
    def device_label(self) -> str:
        return "distributed"

    def load(self):
        args = self.args
        spec = import_servable_config(args.servable_directory, args.servable_name)
        declaration, model_spec = distributed_declaration(spec, args.servable_name)
        log.info(f"Begin to parser rank table json file: {args.rank_table_json_file}")
        content = read_rank_table(args.rank_table_json_file)
        ranks = parse_rank_table(content, args.rank_table_json_file)
        check_rank_config(ranks, declaration.rank_size, declaration.stage_size, args.rank_table_json_file)
        self.group = AgentGroup(ranks, declaration.rank_size, declaration.stage_size)
        self.group.on_failure = self._on_agents_failure
        self.distributed_server = protocol.server(
            futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="distributed-rpc")
        )
        dpb_grpc.add_DistributedWorkerServicer_to_server(
            DistributedWorkerServicer(self.group, model_spec, content), self.distributed_server
        )
        try:
            port, reason = protocol.listen(self.distributed_server, args.distributed_address), "cannot listen there"
        except RuntimeError as err:  # grpcio's bind failure, or an unusable MS_SERVING_DISTRIBUTED_TLS_* file
            port, reason = 0, err
        if not port:
            raise RuntimeError(f"Start distributed worker server failed, address {args.distributed_address}: {reason}")
        self.distributed_server.start()
        warn_if_exposed(args.distributed_address)
        print(
            f"Serving: distributed worker listening on {args.distributed_address}, waiting for "
            f"{declaration.rank_size} agents",
            flush=True,
        )
        self.group.wait_ready(args.wait_agents_time_in_seconds, self.stopping)
        log.info("Success waiting ready of all agents")
        model = DistributedModel(model_spec, self.group)
        return ServableRuntime(spec, "", models={model_spec.model_key: model}), args.version_number

    def _on_agents_failure(self, reason: str):
        if self.runtime is not None:  # serving already: the servable is lost
            self.fail(reason)

    def shutdown(self, tell_master: bool):
        super().shutdown(tell_master)
        if self.group is not None:
            self.group.close("the distributed worker exits")
        if self.distributed_server is not None:
            self.distributed_server.stop(grace=1).wait(3)


def main(argv=None):
    os.environ.setdefault("SERVING_DEVICE_ID", "0")
    return worker_process.main(argv, worker_class=DistributedWorker, parse=parse_args)
