"""One agent process per device rank: loads that rank's graphs (GraphRunner), owns its KV cache, serves Step.

Started as `python -m mindspore_serving.agent.start_agent --config ... --rank r ...` by the LLM worker or by
start_agent.py. It reports readiness ("models loaded, warmed up, listening") as an AgentStartupEvent on the pipe
its starter gave it, and exits when its parent process dies or when the worker that attached to it goes away.

One worker at a time: Attach carries the group's secret (stdin's first line, from the starter; none when it gave
none), as does every Step; a caller without it gets PERMISSION_DENIED, and a second Attach while one is held
ALREADY_EXISTS, neither touching the attached worker's session.
"""

from mindspore_serving.common.native_protobuf import prefer_native_protobuf

# the worker spawns agents after it imported MindSpore, which asked for the pure-Python protobuf (see the module)
prefer_native_protobuf()

# pylint: disable=wrong-import-position
import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent import futures  # noqa: E402

import grpc  # noqa: E402
import psutil  # noqa: E402

from mindspore_serving import log  # noqa: E402
from mindspore_serving.agent.steps import run_submitted  # noqa: E402
from mindspore_serving.common import ms_cluster  # noqa: E402
from mindspore_serving.common.cpu_affinity import bind_process  # noqa: E402
from mindspore_serving.common.ms_device import resolve_device, select_device  # noqa: E402
from mindspore_serving.ipc import agent as protocol  # noqa: E402
from mindspore_serving.ipc import internal_tls  # noqa: E402
from mindspore_serving.ipc.master_worker import read_secret, remove_socket, restrict_socket  # noqa: E402
from mindspore_serving.llm.model_io import is_mixed_step  # noqa: E402
from mindspore_serving.llm.prompt_scores import score_refusal  # noqa: E402
from mindspore_serving.proto import agent_pb2, agent_pb2_grpc  # noqa: E402
from mindspore_serving.spec.llm_config import load_serving_config  # noqa: E402

PARENT_CHECK_SECONDS = 0.2
ORDER_TIMEOUT = 60.0  # seconds a step waits for the step the worker sent before it


class AgentServicer(agent_pb2_grpc.LlmAgentServicer):
    """Runs Step requests one at a time, each after the step it names in `after_step_id` (the worker sends the
    next step while this one computes, async scheduling), filling placeholder tokens from the last greedy step."""

    def __init__(self, runner, rank: int, device: str, on_detach, secret: str = ""):
        self.runner = runner
        self.secret = secret
        self._attached = None  # the pid of the worker attached, once one is
        self.rank = rank
        self.device = device
        self.on_detach = on_detach
        self._turn = threading.Condition()  # one step at a time: the KV cache is shared state
        self._done_step = 0  # the attached worker's last step run
        self._last_tokens = None  # (step id, last token per row) of the last greedy step
        self._decoder = protocol.StepDecoder()  # the block tables the worker sent, kept in step order

    def Info(self, request, context):
        return agent_pb2.AgentInfo(
            protocol_version=protocol.AGENT_PROTOCOL_VERSION,
            rank=self.rank,
            block_size=self.runner.block_size,
            num_blocks=self.runner.num_blocks,
            max_seq_len=self.runner.max_seq_len,
            vocab_size=self.runner.vocab_size,
            device=self.device,
            pid=os.getpid(),
            score_refusal=score_refusal(self.runner) or "",
            spec_tokens=getattr(self.runner, "spec_tokens", 0),
        )

    def _check_secret(self, given: str, context, what: str):
        if not protocol.secret_matches(self.secret, given):
            log.warning(f"agent rank {self.rank}: refused a {what} without the agent group's secret")
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not the worker of this agent group")

    def Step(self, request, context):
        if self.secret:
            given = next((v for k, v in context.invocation_metadata() if k == protocol.SECRET_METADATA), "")
            self._check_secret(given, context, "Step")
        with self._turn:
            try:
                if not self._turn.wait_for(lambda: self._done_step >= request.after_step_id, ORDER_TIMEOUT):
                    raise RuntimeError(
                        f"step {request.after_step_id}, which step {request.step_id} follows, did not "
                        f"come within {ORDER_TIMEOUT:.0f} s (the agent ran up to step {self._done_step})"
                    )
                result = self._run(request, self._decoder.decode(request))
            except Exception as err:  # reported to the worker, which fails that step's requests
                log.exception(f"agent rank {self.rank} step {request.step_id} failed")
                return agent_pb2.StepReply(step_id=request.step_id, error=str(err))
            finally:
                self._done_step = max(self._done_step, request.step_id)
                self._turn.notify_all()
        if self.rank != 0:
            return agent_pb2.StepReply(step_id=request.step_id)
        if is_mixed_step(request.greedy_steps, request.logits_rows, bool(request.all_logits_rows)):
            return protocol.encode_mixed(request.step_id, result)
        if request.greedy_steps:
            return protocol.encode_greedy(request.step_id, *result)
        return protocol.encode_logits(request.step_id, result)

    def _run(self, request, seqs):
        last, self._last_tokens = self._last_tokens, None  # a failing step leaves nothing to continue from
        tokens = last[1] if last is not None and last[0] == request.after_step_id else None
        result, chosen = run_submitted(
            self.runner, seqs, request.greedy_steps, request.prev_rows, tokens, request.logits_rows
        )
        if chosen is not None:
            self._last_tokens = (request.step_id, chosen)
        return result

    def Attach(self, request, context):
        self._check_secret(request.secret, context, f"Attach (pid {request.worker_pid})")
        with self._turn:
            if self._attached is not None:
                log.warning(
                    f"agent rank {self.rank}: refused an Attach from pid {request.worker_pid}: worker pid "
                    f"{self._attached} is attached"
                )
                context.abort(grpc.StatusCode.ALREADY_EXISTS, "another worker is attached to this agent")
            self._attached = request.worker_pid
        log.info(f"agent rank {self.rank}: worker pid {request.worker_pid} attached")
        with self._turn:  # its steps count from 1
            self._done_step = 0
            self._last_tokens = None
            self._decoder = protocol.StepDecoder()
        done = threading.Event()
        context.add_callback(done.set)
        yield agent_pb2.AgentEvent(message="attached")
        done.wait()
        self.on_detach(f"worker pid {request.worker_pid} detached")


def _build_runner(
    graphs_dir: str,
    num_blocks: int,
    block_size: int,
    device_type: str,
    device_id: int,
    rank: int,
    tensor_parallel: int,
    warmup: bool = True,
    max_num_tokens: int = 2048,
):
    # lazy: MindSpore loads only once the process is bound to its cores (agents.cpu_affinity), so that every
    # thread its runtime starts inherits the binding
    from mindspore_serving.agent.graph_runner import GraphRunner  # pylint: disable=import-outside-toplevel

    select_device(device_type, device_id)
    if tensor_parallel > 1:
        if not ms_cluster.is_cluster_rank():
            raise RuntimeError(
                f"model.tensor_parallel is {tensor_parallel}: the agent must run as a cluster rank "
                "(start it with start_agent.py)"
            )
        started = time.perf_counter()
        cluster_rank = ms_cluster.join_cluster()
        if cluster_rank != rank:
            raise RuntimeError(f"agent rank {rank} joined the cluster as rank {cluster_rank}")
        log.info(
            f"agent rank {rank}: joined the cluster of {tensor_parallel} ranks in {time.perf_counter() - started:.1f} s"
        )
    return GraphRunner(
        graphs_dir,
        num_blocks=num_blocks,
        block_size=block_size,
        tensor_parallel=(tensor_parallel, rank),
        warmup=warmup,
        max_num_tokens=max_num_tokens,
    )


def memory_parts(runner) -> str:
    """The process's resident memory as its three parts: the weights, the KV cache, and the rest (the step graphs'
    working memory and MindSpore's runtime)."""
    rss = psutil.Process().memory_info().rss
    weights, cache = runner.weight_bytes, runner.kv_cache_bytes
    gib = 1 << 30
    return (
        f"resident {rss / gib:.2f} GiB = weights {weights / gib:.2f} + KV cache {cache / gib:.2f} + working "
        f"memory and runtime {(rss - weights - cache) / gib:.2f}"
    )


def run_agent(
    config_path: str,
    rank: int,
    address: str,
    startup_fd: int,
    parent_pid: int,
    secret: str = "",
    num_blocks: int | None = None,
):
    """Body of an agent process: loads rank `rank`'s graphs, serves LlmAgent on `address`, reports ready or failed
    on the pipe `startup_fd`, and runs until signalled, detached, or orphaned. `num_blocks`: its KV-cache blocks,
    when its starter measured them (engine.kv_cache_memory_fraction); default engine.num_blocks."""
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    server = None
    try:
        config = load_serving_config(config_path)
        graphs = config.model.graphs[rank] if len(config.model.graphs) > 1 else config.model.graphs[0]
        device = resolve_device(config.agents.device_type, os.path.basename(config_path))
        cpus = bind_process(config.agents.cpus_of(rank, device))
        if cpus is not None:
            log.info(f"agent rank {rank}: bound to CPU core(s) {cpus} (agents.cpu_affinity)")
        started = time.perf_counter()
        runner = _build_runner(
            graphs,
            num_blocks or config.engine.num_blocks,
            config.engine.block_size,
            device,
            config.agents.device_ids[rank],
            rank,
            config.model.tensor_parallel,
            warmup=config.agents.warmup,
            # a step of the engine's whole budget in one call: the working memory the KV budget accounts for
            max_num_tokens=config.engine.max_num_batched_tokens,
        )
        done = "loaded and warmed up" if config.agents.warmup else "loaded (compiled on first use: agents.warmup false)"
        log.info(f"agent rank {rank}: graphs of {graphs} {done} in {time.perf_counter() - started:.1f} s")
        log.info(f"agent rank {rank}: {memory_parts(runner)}")

        def detach(reason):
            log.warning(f"agent rank {rank} exits: {reason}")
            stopping.set()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=protocol.AGENT_CHANNEL_OPTIONS)
        agent_pb2_grpc.add_LlmAgentServicer_to_server(AgentServicer(runner, rank, device, detach, secret), server)
        # TCP (start_agent.py): mutual TLS when MS_SERVING_AGENT_TLS_* are set; a unix socket is private already
        if internal_tls.add_port(server, address, internal_tls.from_env(internal_tls.AGENT_PREFIX)) == 0:
            raise RuntimeError(f"agent rank {rank} cannot listen on {address}")
        server.start()
        restrict_socket(address)
    except Exception as err:
        log.exception(f"agent rank {rank} failed to start")
        protocol.write_startup_event(startup_fd, rank, failed_reason=f"{type(err).__name__}: {err}")
        return 1
    protocol.write_startup_event(startup_fd, rank, ready_pid=os.getpid())
    while not stopping.wait(PARENT_CHECK_SECONDS):
        if os.getppid() != parent_pid:
            log.warning(f"agent rank {rank} exits: its parent process {parent_pid} is gone")
            break
    server.stop(grace=1).wait(3)
    remove_socket(address)
    return 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MindSpore Serving LLM agent (one device rank)")
    parser.add_argument("--config", required=True, help="LLM configuration YAML")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--address", required=True, help="host:port or unix:<path> to serve LlmAgent on")
    parser.add_argument("--startup_fd", type=int, required=True, help="pipe for the AgentStartupEvent")
    parser.add_argument("--parent_pid", type=int, required=True, help="exit when this process is gone")
    parser.add_argument("--num_blocks", type=int, default=None, help="KV-cache blocks (default: engine.num_blocks)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        secret = read_secret()  # stdin's first line, from the starter ("" for none)
        code = run_agent(
            args.config, args.rank, args.address, args.startup_fd, args.parent_pid, secret, args.num_blocks
        )
    finally:
        os.close(args.startup_fd)
    if ms_cluster.is_cluster_rank():
        # a step of a broken cluster may still block a thread in a collective, and MindSpore's exit handlers
        # wait for the other ranks: leave without them
        log.flush()
        os._exit(code)
    return code
