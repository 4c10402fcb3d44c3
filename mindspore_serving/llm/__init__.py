"""The LLM engine: continuous batching over a paged KV cache, as pure engine logic: no MindSpore, no transport, no
files (the import contracts forbid them). Everything steps in the caller's thread, except `engine_loop.py`, which
runs an engine in a thread of its own for callers in other threads.

config.py              SchedulerConfig (limits, KV geometry, batching policy) and SpeculativeConfig
sampling_params.py     SamplingParams: how a request samples and stops
generation_defaults.py a model's generation_config.json defaults and how a request's values win over them
instance_params.py     sampling parameters carried as tensors in a classic instance
request.py             Request and its state machine (RequestStatus, FinishReason)
errors.py              InvalidRequestError: what a client did wrong
block_manager.py       KV blocks: allocation, ref counts, prefix caching
kv_budget.py           how many KV blocks a memory budget holds
batching_policy.py     who may join the running batch: continuous or static batching
scheduler.py           Scheduler.schedule() -> SchedulerOutput; update_from_output()
step_executor.py       how plans run on the runner: single steps, multi-step rounds, async scheduling
choices.py             several choices of one request (n / best_of): one prompt, then forks
ngram_proposer.py      prompt-lookup proposals for speculative decoding
logits_processors.py   what sampling parameters do to the logits (penalties, bias, bad words, ...)
structured_output.py   which tokens a request's grammar allows next (llguidance)
sampler.py             numpy sampler over logits, and verification of proposed tokens
prompt_scores.py       prompt logprobs from the prompt's logits
detokenizer.py         incremental detokenization and stop strings
chat_template.py       chat messages -> prompt text, as Hugging Face's chat templates render them
tool_call_formats.py   the tool-call formats of model families, and which one a chat template prompts for
engine_core.py         EngineCore: schedule -> run model -> sample -> update, token level
engine.py              LLMEngine: validation, tokenization, text, RequestOutput, generate()
engine_loop.py         EngineLoop: an LLMEngine in its own thread; submit, stream, abort from other threads
step_report.py         the engine's periodic statistics line
model_io.py            the contract with the model runner (SeqStep; ModelRunner, MultiStepRunner, StepSubmitter)
testing.py             FakeModelRunner that really reads its paged cache, reference_greedy
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
