"""The LLM engine: continuous batching over a paged KV cache, as pure logic (no I/O, no MindSpore).

config.py          SchedulerConfig: limits, KV geometry, batching policy
sampling_params.py SamplingParams: how a request samples and stops
request.py         Request and its state machine (RequestStatus, FinishReason)
block_manager.py   KV blocks: allocation, ref counts, prefix caching
batching_policy.py who may join the running batch: continuous or static batching
scheduler.py       Scheduler.schedule() -> SchedulerOutput; update_from_output()
step_executor.py   how plans run on the runner: single steps, multi-step rounds, async scheduling
sampler.py         numpy sampler over logits
detokenizer.py     incremental detokenization and stop strings
engine_core.py     EngineCore: schedule -> run model -> sample -> update, token level
engine.py          LLMEngine: validation, tokenization, text, RequestOutput, generate()
model_io.py        the contract with the model runner (SeqStep; ModelRunner, MultiStepRunner, StepSubmitter)
testing.py         FakeModelRunner that really reads its paged cache, reference_greedy
"""

from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.engine import LLMEngine, RequestMetrics, RequestOutput
from mindspore_serving.llm.engine_core import EngineCore, EngineCoreOutput, StepStats
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.model_io import ModelRunner, SeqStep
from mindspore_serving.llm.request import FinishReason, Request, RequestStatus
from mindspore_serving.llm.sampling_params import SamplingParams

__all__ = [
    "SchedulerConfig",
    "LLMEngine",
    "RequestMetrics",
    "RequestOutput",
    "EngineCore",
    "EngineCoreOutput",
    "StepStats",
    "InvalidRequestError",
    "ModelRunner",
    "SeqStep",
    "FinishReason",
    "Request",
    "RequestStatus",
    "SamplingParams",
]
