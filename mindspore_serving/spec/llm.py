"""What `declare_llm` records: an LLM servable served by the continuous-batching engine, and its one method."""
from dataclasses import dataclass

LLM_EXTENSION = "llm"
"""Key of the LLM worker's facts in its registration's `extensions` (JSON: max_model_len, max_num_seqs, ...)."""

GENERATE_METHOD = "generate"
GENERATE_INPUTS = []  # "prompt" or "inputs", checked by the worker
GENERATE_OUTPUTS = ["text", "token_ids", "finish_reason", "prompt_tokens", "completion_tokens"]


@dataclass(frozen=True)
class LlmDeclaration:
    config_file: str
    """Absolute path of the LLM configuration YAML (model, engine, agents)."""
