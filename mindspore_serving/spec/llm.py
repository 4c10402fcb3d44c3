"""What `declare_llm` records: an LLM servable served by the continuous-batching engine, and its one method."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from mindspore_serving.spec.hf_serving import HfModelSettings

LLM_EXTENSION = "llm"
"""Key of the LLM worker's facts in its registration's `extensions` (JSON: max_model_len, max_num_seqs, ...)."""

GENERATE_METHOD = "generate"
GENERATE_INPUTS: list[str] = []  # "prompt" or "inputs", checked by the worker
GENERATE_OUTPUTS = ["text", "token_ids", "finish_reason", "prompt_tokens", "completion_tokens"]


@dataclass(frozen=True)
class LlmDeclaration:
    config_file: str | None
    """Absolute path of the LLM configuration YAML (model, engine, agents); None with hf_model."""
    hf_model: Optional["HfModelSettings"] = None
    """A Hugging Face model directory to serve instead: the worker exports its graphs into the model cache when
    they are missing there and writes the configuration it serves (worker/llm/hf_model.py)."""
