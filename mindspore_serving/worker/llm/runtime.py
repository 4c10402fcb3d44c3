"""An LLM servable inside a worker: the engine loop over agents, behind the same interface as ServableRuntime."""

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common import metrics as m
from mindspore_serving.common.net import accepts_connections
from mindspore_serving.common.restart_budget import RestartBudget
from mindspore_serving.ipc.agent import SECRET_ENV as AGENT_SECRET_ENV
from mindspore_serving.ipc.llm_session import registration_facts
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.engine import LLMEngine
from mindspore_serving.llm.engine_loop import EngineLoop
from mindspore_serving.llm.instance_params import prompt_of, sampling_params_of
from mindspore_serving.llm.kv_budget import KvCacheCapacity
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.llm.step_report import StepCounters
from mindspore_serving.llm.tool_call_formats import detect_tool_call_parser
from mindspore_serving.models.llama.tokenizer import TextTokenizer
from mindspore_serving.proto import llm_worker_pb2_grpc
from mindspore_serving.spec.llm import GENERATE_METHOD, LLM_EXTENSION
from mindspore_serving.spec.llm_config import LlmServingConfig, load_serving_config
from mindspore_serving.worker.llm.agent_client import CONNECT_TIMEOUT, AgentRunner
from mindspore_serving.worker.llm.agents import START_TIMEOUT, agent_addresses, startup_agents
from mindspore_serving.worker.llm.kv_cache import capacity
from mindspore_serving.worker.llm.prompts import Prompter
from mindspore_serving.worker.llm.session_service import LlmWorkerServicer
from mindspore_serving.worker.method_runner import InstanceError

ATTACH_PROBE_TIMEOUT = 1.0  # seconds to find agents already running on fixed ports
MAX_AGENT_RESTARTS = 3  # agent groups restarted in this worker within AGENT_RESTART_WINDOW before it gives up
AGENT_RESTART_WINDOW = 60.0


class LlmRuntime:
    def __init__(
        self,
        spec,
        config_file: str,
        device_type: str,
        device_id: int,
        on_fatal: Callable[[str], None] | None = None,
        socket_directory: str = "",
    ):
        self.spec = spec
        self.socket_directory = socket_directory  # where the agents it starts listen (unless on fixed ports)
        self.device_type = device_type
        self.config: LlmServingConfig = load_serving_config(config_file)
        self.on_fatal = on_fatal
        self.agents = None
        self.servicer = None
        self.loop = None
        self._closing = threading.Event()
        self._restarts = RestartBudget(MAX_AGENT_RESTARTS, AGENT_RESTART_WINDOW)
        self._restarting: str = ""  # why the agents are restarting, while they are
        self._retired = {"queries": 0, "hits": 0}  # counts of engine loops replaced
        self._retired_steps = StepCounters()
        self.kv_cache: KvCacheCapacity | None = None  # what the agents' KV cache holds, once attached
        self.tokenizer = TextTokenizer.from_file(self.config.model.tokenizer)
        self.generation_defaults = self.config.model.generation_defaults
        engine = self.config.engine
        self.prompter = Prompter(
            self.tokenizer, self.config.model, engine.max_prompt_chars or 32 * engine.max_model_len
        )
        # the format the chat API reads the model's tool calls in: the configuration's, else its template's
        self.tool_call_parser = self.config.model.tool_call_parser or detect_tool_call_parser(
            self.prompter.tools_template_text
        )
        self.runner = self._attach_or_start()
        self.loop = self._new_loop()

    def _new_loop(self) -> EngineLoop:
        if self.loop is not None:  # counters go on across agent restarts
            core = self.loop.engine.core
            self._retired_steps.absorb(self.loop.report.totals)
            self._retired["queries"] += core.scheduler.block_manager.prefix_cache_queries
            self._retired["hits"] += core.scheduler.block_manager.prefix_cache_hits
        scheduler = self._scheduler_config()
        self.kv_cache = capacity(self.config, scheduler.num_blocks)
        # printed as the worker's start-up line is: what fits is worth seeing at every log level
        print(f"Serving: {self.spec.name}: {self.kv_cache.describe()}", flush=True)
        speculative = scheduler.speculative
        if speculative is not None:
            log.info(
                f"{self.spec.name}: speculative decoding: {speculative.method}, up to "
                f"{speculative.num_speculative_tokens} proposed tokens per row (n-grams of "
                f"{speculative.prompt_lookup_max} down to {speculative.prompt_lookup_min} tokens), "
                + (
                    "always"
                    if speculative.disable_by_batch_size is None
                    else f"below {speculative.disable_by_batch_size} running requests"
                )
            )
        engine = LLMEngine(
            self.runner,
            self.tokenizer,
            scheduler,
            eos_token_id=self.generation_defaults.stop_ids(self.tokenizer.eos_id),
        )
        return EngineLoop(
            engine,
            self.config.max_queue_size,
            self.config.request_timeout,
            name=f"{self.spec.name}-engine",
            stats_interval=self.config.stats_interval,
        )

    def _scheduler_config(self) -> SchedulerConfig:
        """The engine's config; with a memory budget (engine.kv_cache_memory[_fraction]), the KV-cache blocks are
        those the agents hold: a fraction is measured by whoever started them."""
        engine = self.config.engine
        if self.config.kv_cache.from_memory and self.runner.num_blocks != engine.num_blocks:
            engine = dataclasses.replace(engine, num_blocks=self.runner.num_blocks)
        return engine

    def _attach_or_start(self) -> AgentRunner:
        """Attaches to the agents of the configuration: to running ones when they listen on fixed ports (started
        by start_agent.py), else to those it starts, the ranks on this host (ranks on other hosts are started
        there with start_agent.py --rank_start and join the cluster)."""
        agents = self.config.agents
        options = dict(
            heartbeat_interval=agents.heartbeat_interval,
            heartbeat_misses=agents.heartbeat_misses,
            model_name=self.spec.name,
        )
        if agents.start_port and accepts_connections(agents.host_of(0), agents.start_port, ATTACH_PROBE_TIMEOUT):
            addresses = agent_addresses(self.config)
            try:
                runner = AgentRunner(
                    addresses,
                    self._agent_lost,
                    connect_timeout=ATTACH_PROBE_TIMEOUT,
                    secret=os.environ.get(AGENT_SECRET_ENV, ""),
                    **options,
                )
                log.info(f"attached to the running agents at {addresses}")
                return runner
            except RuntimeError as err:
                log.info(f"no running agents ({err}); starting them")
        self.agents = startup_agents(self.config, ranks=agents.local_ranks, directory=self.socket_directory)
        remote = len(agents.local_ranks) < agents.num_ranks
        # ranks on other hosts finish loading with the local ones (they all warm up in lockstep), give or take
        return AgentRunner(
            self.agents.addresses,
            self._agent_lost,
            connect_timeout=START_TIMEOUT if remote else CONNECT_TIMEOUT,
            secret=self.agents.secret,
            expected_pids=self.agents.pids(),
            **options,
        )

    def _agent_lost(self, rank: int, reason: str):
        """A rank is gone or hung: the requests in flight fail (unavailable: they may be retried) and a new agent
        group is started in this worker, which stays registered (its requests meanwhile are answered
        unavailable); only what died is reloaded. Too many restarts in a row end the worker instead."""
        if self.loop is None:  # lost while it started: the start-up fails anyway
            return
        self._restarting = f"{reason}; the agents of {self.spec.name} are restarting"
        self.loop.close(self._restarting)
        if not self._restarts.spend():
            self._fatal(
                f"{reason}; the agents were restarted {MAX_AGENT_RESTARTS} times within {AGENT_RESTART_WINDOW:.0f} s"
            )
            return
        threading.Thread(target=self._restart_agents, args=(reason,), name="agent-restart", daemon=True).start()

    def _restart_agents(self, reason: str):
        started = time.monotonic()
        self.runner.close()
        if self.agents is not None:
            self.agents.stop(timeout=0.0)  # a rank of a lost group may be dead, hung or blocked in a collective
            self.agents = None
        if self._closing.is_set():
            return
        log.warning(f"restarting the agents of {self.spec.name} ({reason})")
        try:
            self.runner = self._attach_or_start()
        except Exception as err:  # the worker exits; the master restarts it
            self._fatal(f"restarting the agents of {self.spec.name} failed: {err}")
            return
        if self._closing.is_set():  # the worker stopped meanwhile: what started here stops too
            self.runner.close()
            if self.agents is not None:
                self.agents.stop()
            return
        self.loop = self._new_loop()
        self._restarting = ""
        log.warning(f"the agents of {self.spec.name} are back after {time.monotonic() - started:.1f} s")

    def _fatal(self, reason: str):
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def add_servicers(self, server):
        """The generation streams (LlmWorker) beside WorkerService."""
        self.servicer = LlmWorkerServicer(self)
        llm_worker_pb2_grpc.add_LlmWorkerServicer_to_server(self.servicer, server)

    def not_ready(self) -> str:
        """Why the servable cannot serve now though the worker is registered: its agents are restarting."""
        return self._restarting

    def end_streams(self, timeout: float):
        """Lets the master's sessions end once their requests are done (at most `timeout` s), so that the
        server's stop does not wait out its grace period on a session with nothing left in it."""
        if self.servicer is not None:
            self.servicer.end_sessions(timeout)

    @property
    def batch_size(self) -> int:
        return self.config.engine.max_num_seqs

    def extensions(self) -> dict[str, str]:
        return {
            LLM_EXTENSION: registration_facts(
                model_id=self.spec.name,
                max_model_len=self.config.engine.max_model_len,
                max_num_seqs=self.config.engine.max_num_seqs,
                max_queue_size=self.config.max_queue_size,
                vocab_size=self.runner.vocab_size,
                device=self.runner.device,
                config=self.config.path,
                tool_call_parser=self.tool_call_parser,
            )
        }

    def metric_samples(self) -> list:
        """The engine's state and counters for a scrape (read from the engine thread's objects as they are)."""
        loop = self.loop
        if loop is None:
            return []
        scheduler = loop.engine.core.scheduler
        blocks = scheduler.block_manager
        total = blocks.num_usable_blocks
        steps = StepCounters()
        steps.absorb(self._retired_steps)
        steps.absorb(loop.report.totals)
        values = {
            "num_requests_running": scheduler.num_running,
            "num_requests_waiting": scheduler.num_waiting,
            "kv_cache_usage_perc": blocks.usage,
            "kv_cache_blocks_used": total - blocks.num_free_blocks,
            "kv_cache_blocks_total": total,
            "kv_cache_tokens_total": total * blocks.block_size,
            "num_preemptions": steps.preempted,
            "prefix_cache_queries": self._retired["queries"] + blocks.prefix_cache_queries,
            "prefix_cache_hits": self._retired["hits"] + blocks.prefix_cache_hits,
        }
        if self.kv_cache is not None and self.kv_cache.block_bytes:
            values["kv_cache_memory_bytes"] = self.kv_cache.memory_bytes
        if self.config.engine.speculative is not None:
            values.update(
                spec_decode_num_drafts=steps.drafts,
                spec_decode_num_draft_tokens=steps.draft_tokens,
                spec_decode_num_accepted_tokens=steps.accepted_tokens,
            )
        samples = [m.sample(m.L + name, {}, value) for name, value in values.items()]
        if self.config.engine.speculative is not None:
            per_position = steps.accepted_per_position
            per_position = per_position + [0] * (
                self.config.engine.speculative.num_speculative_tokens - len(per_position)
            )
            samples += [
                m.sample(m.L + "spec_decode_num_accepted_tokens_per_pos", {"position": str(j)}, count)
                for j, count in enumerate(per_position)
            ]
        return samples

    def submit(self, prompt, params: SamplingParams, request_id: str | None = None, sink=None, tag=None):
        return self.loop.submit(prompt, params, request_id, sink, tag)

    def engine_steps(self) -> int:
        """Steps the engine loop has completed: it progresses while this changes (read from any thread)."""
        return self.loop.steps_done

    def predict(self, method_name: str, instances: Sequence[dict]) -> list:
        if method_name != GENERATE_METHOD:
            raise KeyError(method_name)
        streams = []
        for instance in instances:
            try:
                prompt = prompt_of(instance)
                streams.append(self.loop.submit(prompt, self.generation_defaults.apply(sampling_params_of(instance))))
            except KeyError:
                streams.append(
                    errors.InvalidInputs(
                        f"Cannot find input prompt (or inputs) in instance input , "
                        f"servable {self.spec.name}, method {method_name}"
                    )
                )
            except errors.ServingError as err:
                streams.append(err)
        results = []
        for stream in streams:
            if isinstance(stream, BaseException):
                results.append(
                    stream if isinstance(stream, errors.WorkerUnavailable) else InstanceError(stream.message)
                )
                continue
            try:
                out = stream.result()
            except errors.WorkerUnavailable as err:  # keeps its code: the classic reply says "retry later"
                results.append(err)
                continue
            except errors.ServingError as err:
                results.append(InstanceError(err.message))
                continue
            if out.error:
                error_kind = out.error_kind
                results.append(
                    InstanceError(out.error)
                    if error_kind is errors.Kind.GENERATION
                    else errors.error_of_kind(error_kind, out.error)
                )
                continue
            results.append(
                {
                    "text": out.text,
                    "token_ids": np.asarray(out.token_ids, np.int32),
                    "finish_reason": out.finish_reason.value,
                    "prompt_tokens": np.int32(len(out.prompt_token_ids)),
                    "completion_tokens": np.int32(len(out.token_ids)),
                }
            )
        return results

    def close(self):
        self._closing.set()
        self.loop.close()
        self.runner.close()
        if self.agents is not None:
            # a lost group has a dead, hung or blocked rank: no use waiting for it to stop by itself
            self.agents.stop(timeout=0.0 if self.runner.lost else 10.0)
