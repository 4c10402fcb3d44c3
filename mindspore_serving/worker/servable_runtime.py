"""A servable inside a worker: its loaded models, batch executors and method runners."""

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.env_durations import duration_seconds
from mindspore_serving.spec.model_call import call_prefix, set_model_call_handler
from mindspore_serving.spec.servable import STAGE_BUILTIN, STAGE_FUNCTION, STAGE_MODEL, ServableSpec
from mindspore_serving.worker.direct_batch import DirectBatch
from mindspore_serving.worker.executors import FunctionBatcher, ModelExecutor
from mindspore_serving.worker.method_runner import (
    BUILTIN_STAGES,
    BatchFunctionStage,
    FunctionStage,
    MethodRunner,
    ModelStage,
)
from mindspore_serving.worker.model_backend import LoadedModel

DEFAULT_BATCH_WAIT_MS = 2.0


def batch_wait_seconds() -> float:
    """How long a batch waits for instances that are known to be on their way (MS_SERVING_BATCH_WAIT_MS)."""
    return duration_seconds("MS_SERVING_BATCH_WAIT_MS", DEFAULT_BATCH_WAIT_MS / 1000.0, "milliseconds")


def _load_failed_text(servable_name: str, model_spec, version_dir: str, err: Exception) -> str:
    """MindSpore Serving's words for a model that did not load; `err` (e.g. mindspore.load's "Load MindIR
    failed. The file may be encrypted and decrypt failed, ...") is the reason."""
    context = model_spec.context.model_context.as_string() if model_spec.context is not None else "{}"
    return (
        f"Load model failed, servable directory: '{os.path.dirname(os.path.dirname(version_dir))}', "
        f"servable name: '{servable_name}', model file: '[{', '.join(model_spec.model_files)}]', version number "
        f"{os.path.basename(version_dir)},model context: {context}, load error details: {err}"
    )


def _submit_together(executor, instances: Sequence[Sequence]) -> list:
    """Submits instances that arrive together (one batch when they fit); their futures in order."""
    executor.expected.announce(len(instances))
    return [executor.submit(tuple(instance)) for instance in instances]


class ServableRuntime:
    def __init__(
        self,
        spec: ServableSpec,
        version_dir: str,
        dec_key: bytes | None = None,
        dec_mode: str = "AES-GCM",
        batch_wait: float | None = None,
        models: dict[str, LoadedModel] | None = None,
        make_executor: Callable = ModelExecutor,
    ):
        """`models`, when given, are the servable's models already loaded (e.g. run by a distributed servable's
        rank agents, or by another worker for an extra worker); otherwise each declared model is loaded from
        `version_dir`. `make_executor(model, subgraph, batch_wait)` makes the executor of each model subgraph.

        Python stages run one at a time in one thread of the worker (as in MindSpore Serving, where they run in
        the worker's main thread): a servable's Python work spreads over processes, its extra workers."""
        self.spec = spec
        self.batch_wait = batch_wait_seconds() if batch_wait is None else batch_wait
        self.models: dict[str, LoadedModel] = dict(models or {})
        for key, model_spec in spec.models.items():
            if key in self.models:
                continue
            try:
                self.models[key] = LoadedModel(model_spec, version_dir, dec_key, dec_mode)
            except Exception as err:
                raise errors.core_failure(_load_failed_text(spec.name, model_spec, version_dir, err)) from err
        self._check_io_counts()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"{spec.name}-stage")
        self.executors: dict[tuple[str, int], ModelExecutor] = {
            (key, index): make_executor(model, index, self.batch_wait)
            for key, model in self.models.items()
            for index in range(len(model.subgraphs))
        }
        self._batchers: list[FunctionBatcher] = []
        self.methods = {
            name: MethodRunner(spec.name, method, [self._build_stage(method, stage) for stage in method.stages])
            for name, method in spec.methods.items()
        }
        # model-only methods that may skip MethodRunner
        self.direct = {
            name: direct for name, runner in self.methods.items() if (direct := DirectBatch.of(runner)) is not None
        }
        self._install_model_call()

    device_type = "CPU"

    def add_servicers(self, server):
        """gRPC services this runtime adds to its worker's server besides WorkerService (none)."""

    def not_ready(self) -> str:
        """Why this runtime cannot serve now though its worker is registered: never, once loaded."""
        return ""

    def end_streams(self, timeout: float):
        """Called before the worker's server stops; classic servables keep no long-lived streams."""

    def extensions(self) -> dict[str, str]:
        """Extra registration facts for the master (e.g. an LLM engine's description)."""
        return {}

    @property
    def batch_size(self) -> int:
        """The largest model batch size (1 without models): the master's chunk size."""
        return max((model.batch_size for model in self.models.values()), default=1)

    def _check_io_counts(self):
        for key, model in self.models.items():
            for subgraph, (inputs, outputs) in model.spec.io_counts.items():
                if subgraph >= len(model.subgraphs):
                    raise RuntimeError(
                        f"The model does not have subgraph of index {subgraph}, "
                        f"the subgraph count of the model is {len(model.subgraphs)}"
                    )
                graph = model.subgraphs[subgraph]
                if inputs != len(graph.inputs):
                    raise errors.core_failure(
                        f"The inputs count {inputs} in register_method not equal to the count "
                        f"{len(graph.inputs)} defined in model, model info: {key}, subgraph: "
                        f"{subgraph}"
                    )
                if graph.outputs and outputs != len(graph.outputs):
                    raise errors.core_failure(
                        f"The outputs count {outputs} in register_method not equal to the count "
                        f"{len(graph.outputs)} defined in model, model info: {key}, subgraph: "
                        f"{subgraph}"
                    )

    def _method_batch_size(self, method, stage) -> int:
        if stage.batch_size:
            return stage.batch_size
        sizes = [self.models[s.model_key].batch_size for s in method.stages if s.kind == STAGE_MODEL]
        if not sizes:
            return 1
        if all(ref.stage_index == 0 for ref in stage.inputs):
            return min(sizes)
        return max(sizes)

    def _build_stage(self, method, stage):
        if stage.kind == STAGE_MODEL:
            return ModelStage(self.executors[(stage.model_key, stage.subgraph)])
        if stage.kind == STAGE_BUILTIN:
            return BUILTIN_STAGES[stage.builtin_name]()
        if stage.kind == STAGE_FUNCTION and stage.batch_size is None:
            return FunctionStage(stage.function, stage.outputs_count, self.pool)
        batcher = FunctionBatcher(
            stage.function_key or stage.tag,
            stage.function,
            self._method_batch_size(method, stage),
            stage.outputs_count,
            self.pool,
            self.batch_wait,
        )
        self._batchers.append(batcher)
        return BatchFunctionStage(batcher)

    def _install_model_call(self):
        set_model_call_handler(self.model_call)

    def model_call(self, model_key: str, subgraph: int, instances: Sequence[tuple]) -> list[tuple]:
        """Runs instances through a model from inside a Python stage (`Model.call`)."""
        prefix = call_prefix(model_key, subgraph)
        model = self.models.get(model_key)
        if model is None:
            raise RuntimeError(prefix + "the model is not declared or not loaded")
        if subgraph >= len(model.subgraphs):
            raise RuntimeError(
                prefix + f"The model does not have subgraph of index {subgraph}, "
                f"the subgraph count of the model is {len(model.subgraphs)}"
            )
        if not instances:
            raise RuntimeError(prefix + "Input instances count is 0")
        executor = self.executors[(model_key, subgraph)]
        for index, instance in enumerate(instances):
            if len(instance) != executor.inputs_count:
                raise RuntimeError(
                    prefix + f"The inputs count {len(instance)} of instance {index} is not equal to "
                    f"the inputs count {executor.inputs_count} of the model"
                )
            reason = executor.check(instance)
            if reason is not None:
                raise RuntimeError(prefix + reason)
        return [future.result() for future in _submit_together(executor, instances)]

    def run_model(self, model_key: str, subgraph: int, instances: Sequence[tuple]) -> list:
        """Runs a model call forwarded from an extra worker: per instance, its outputs or the exception it failed
        with. The instances join the same batches as this worker's own. RuntimeError when there is no such model."""
        executor = self.executors.get((model_key, subgraph))
        if executor is None:
            raise RuntimeError(f"model {model_key} subgraph {subgraph} is not loaded by this worker")
        results: list = [None] * len(instances)
        checked = []
        for index, instance in enumerate(instances):
            reason = executor.check(instance)
            if reason is None:
                checked.append(index)
            else:
                results[index] = RuntimeError(reason)
        futures = _submit_together(executor, [instances[index] for index in checked])
        for index, future in zip(checked, futures):
            try:
                results[index] = future.result()
            except Exception as err:
                results[index] = err
        return results

    def predict_direct(self, method_name: str, instances_pb: Sequence) -> list | None:
        """A model-only method's answers computed from the request's Instance messages as they are
        (direct_batch.py), or None when the call needs the general path (`predict` on decoded instances)."""
        direct = self.direct.get(method_name)
        return None if direct is None else direct.run(instances_pb)

    def predict(self, method_name: str, instances: Sequence[dict]) -> list:
        runner = self.methods.get(method_name)
        if runner is None:
            raise KeyError(method_name)
        return runner.run(instances)

    def close(self):
        for executor in self.executors.values():
            executor.close()
        for batcher in self._batchers:
            batcher.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        log.info(f"servable {self.spec.name} closed")
