"""The worker process: imports servable_config.py, loads the models, serves WorkerService, registers with the master.

Started by the master as
`python -m mindspore_serving.worker.start_worker --servable_directory ... --master_address ...`.
It exits on SIGINT/SIGTERM, when the master asks, or when its parent process goes away.
"""

from mindspore_serving.common.native_protobuf import prefer_native_protobuf

prefer_native_protobuf()  # before protobuf is imported (see the module)

# pylint: disable=wrong-import-position
import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from concurrent import futures  # noqa: E402

import grpc  # noqa: E402

from mindspore_serving import log  # noqa: E402
from mindspore_serving.common import gc_tuning  # noqa: E402
from mindspore_serving.common.env_durations import duration_seconds  # noqa: E402
from mindspore_serving.ipc import master_worker as ipc  # noqa: E402
from mindspore_serving.ipc.predict_socket import DEFAULT_SPIN_S, PredictSocketServer  # noqa: E402
from mindspore_serving.proto import internal_pb2, internal_pb2_grpc  # noqa: E402
from mindspore_serving.worker.remote_model import model_infos  # noqa: E402
from mindspore_serving.worker.servable_loader import load_servable  # noqa: E402
from mindspore_serving.worker.service import WorkerServicer  # noqa: E402
from mindspore_serving.worker.settling import settle_graphs  # noqa: E402
from mindspore_serving.worker.signatures import method_signature  # noqa: E402
from mindspore_serving.worker.warmup import warm_up  # noqa: E402

PARENT_CHECK_SECONDS = 0.1
GIL_SWITCH_SECONDS = 0.0001
"""How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). A Python stage holds it
for its whole run; the threads that move requests along (gRPC, model batches, the model calls of extra workers)
each need it for a moment, and would wait that long for every one of those moments."""


SPIN_VARIABLE = "MS_SERVING_WORKER_SPIN_US"


def predict_spin_seconds() -> float:
    """How long an idle connection of the Predict socket polls for its next call before it blocks
    (MS_SERVING_WORKER_SPIN_US, microseconds; 0: never; see ipc/predict_socket.py)."""
    return duration_seconds(SPIN_VARIABLE, DEFAULT_SPIN_S, "microseconds")


def servable_arguments(description: str) -> argparse.ArgumentParser:
    """The arguments every worker kind takes: the servable, its device type, the master and the model key."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--servable_directory", required=True)
    parser.add_argument("--servable_name", required=True)
    parser.add_argument("--version_number", type=int, default=0)
    parser.add_argument("--device_type", default="none")
    parser.add_argument("--master_address", required=True)
    parser.add_argument("--worker_key", required=True)
    parser.add_argument("--dec_mode", default="AES-GCM")
    parser.add_argument("--read_dec_key", action="store_true", help="read a hex decryption key from stdin")
    return parser


def parse_args(argv=None):
    parser = servable_arguments("MindSpore Serving worker")
    parser.add_argument("--device_id", type=int, default=0)
    return parser.parse_args(argv)


class Worker:
    def __init__(self, args):
        self.args = args
        self.parent_pid = os.getppid()
        self.stopping = threading.Event()
        # the secret the master gave this worker (main reads it): every call to the master carries it
        self.master = internal_pb2_grpc.MasterControlStub(
            ipc.master_channel(args.master_address, args.worker_key, getattr(args, "secret", ""))
        )
        self.server = None
        self.predict_server = None
        self.runtime = None
        self.address = ""
        self.socket_directory = ""  # the master's runtime directory, where this worker's sockets go (start)
        self.failed = False

    def notify_failed(self, message: str):
        try:
            self.master.NotifyFailed(
                internal_pb2.NotifyFailedRequest(
                    worker_pid=os.getpid(), worker_key=self.args.worker_key, error_msg=message
                ),
                timeout=5,
            )
        except grpc.RpcError as err:
            log.error(f"cannot tell the master that the worker failed: {err}")

    def load(self):
        """The servable's runtime and its resolved version."""
        args = self.args
        dec_key = bytes.fromhex(sys.stdin.readline().strip()) if args.read_dec_key else None
        return load_servable(
            args.servable_directory,
            args.servable_name,
            args.version_number,
            args.device_type,
            args.device_id,
            dec_key,
            args.dec_mode,
            on_fatal=self.fail,
            socket_directory=self.socket_directory,
        )

    def start(self):
        args = self.args
        self.socket_directory = ipc.runtime_directory_of(args.master_address)
        self.runtime, version = self.load()
        # before registering: the master counts a registered worker as ready
        warm_up(self.runtime, os.path.join(args.servable_directory, args.servable_name))
        settle_graphs(getattr(self.runtime, "models", {}))
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=128, thread_name_prefix="worker-rpc"),
            options=ipc.INTERNAL_CHANNEL_OPTIONS,
        )
        servicer = WorkerServicer(self.runtime, self.request_exit)
        internal_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, self.server)
        self.runtime.add_servicers(self.server)
        self.address = ipc.worker_address(self.socket_directory, args.servable_name, self.device_label)
        self.server.add_insecure_port(self.address)
        self.server.start()
        ipc.restrict_socket(self.address)
        print(f"Serving: Worker gRPC server start success, listening on {self.address}", flush=True)
        self.predict_server = PredictSocketServer(
            ipc.predict_address(self.address),
            lambda request: servicer.Predict(request, None),
            spin_s=predict_spin_seconds(),
        )
        spec = self.runtime.spec
        methods = []
        for m in spec.methods.values():
            inputs, outputs, batched = method_signature(m, getattr(self.runtime, "models", {}))
            methods.append(
                internal_pb2.MethodSignature(
                    name=m.name,
                    input_names=m.input_names,
                    output_names=m.output_names,
                    only_model_stage=m.only_model_stage,
                    inputs=inputs,
                    outputs=outputs,
                    batched=batched,
                )
            )
        gc_tuning.settle()  # what it loaded stays for its lifetime: out of the collector's way before requests come
        reply = self.master.Register(
            internal_pb2.RegisterRequest(
                protocol_version=ipc.PROTOCOL_VERSION,
                worker_pid=os.getpid(),
                address=self.address,
                servable_name=spec.name,
                version_number=version,
                batch_size=self.runtime.batch_size,
                methods=methods,
                device_type=self.runtime.device_type,
                device_id=args.device_id,
                worker_key=args.worker_key,
                extensions=self.runtime.extensions(),
                predict_address=self.predict_server.address,
                **self.registration(),
            ),
            timeout=30,
        )
        if reply.error.error_code:
            raise RuntimeError(reply.error.error_msg.decode())
        started = (
            f"Serving: Start servable success, servable directory: '{args.servable_directory}', "
            f"servable name: '{spec.name}', version number: {version}"
        )
        log.info(started)  # MindSpore Serving logs it, then prints it whatever GLOG_v says
        print(started, flush=True)

    @property
    def device_label(self) -> str:
        return f"device{self.args.device_id}"

    def registration(self) -> dict:
        """RegisterRequest fields that say how this worker runs its models: itself (extra workers may call them)."""
        return {"owns_device": True, "model_infos": model_infos(getattr(self.runtime, "models", {}))}

    def request_exit(self, reason: str):
        log.info(f"worker exits: {reason}")
        self.stopping.set()

    def fail(self, reason: str):
        """An unrecoverable failure: exit without saying goodbye, so that the master restarts this worker."""
        log.error(f"worker fails: {reason}")
        self.failed = True
        self.stopping.set()

    def watch_parent(self):
        while not self.stopping.wait(PARENT_CHECK_SECONDS):
            if os.getppid() != self.parent_pid:
                self.request_exit("the master process has exited")

    def shutdown(self, tell_master: bool):
        if tell_master:
            try:
                self.master.Exit(
                    internal_pb2.ExitRequest(
                        worker_pid=os.getpid(), worker_key=self.args.worker_key, reason="worker stopping"
                    ),
                    timeout=2,
                )
            except grpc.RpcError:
                pass
        if self.predict_server is not None:
            self.predict_server.stop(grace=3)
        if self.server is not None:
            if self.runtime is not None:
                self.runtime.end_streams(timeout=3)
            self.server.stop(grace=3).wait(5)
            ipc.remove_socket(self.address)
        if self.runtime is not None:
            self.runtime.close()


def main(argv=None, worker_class=Worker, parse=parse_args):
    args = parse(argv)
    args.secret = ipc.read_secret()  # stdin's first line, from the master (a decryption key may follow)
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    worker = worker_class(args)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda num, _frame: worker.request_exit(f"signal {signal.Signals(num).name}"))
    os.environ["SERVING_DEVICE_ID"] = str(args.device_id)
    try:
        worker.start()
    except Exception as err:
        log.exception("worker failed to start")
        worker.notify_failed(str(err))
        worker.shutdown(tell_master=False)
        return 1
    threading.Thread(target=worker.watch_parent, name="parent-watch", daemon=True).start()
    while not worker.stopping.wait(1.0):
        pass
    worker.shutdown(tell_master=not worker.failed and os.getppid() == worker.parent_pid)
    return 1 if worker.failed else 0
