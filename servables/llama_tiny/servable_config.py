"""Servable `llama_tiny`: the bundled tiny LLaMA, served by the continuous-batching LLM engine.

Method `generate(prompt, [max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, ...])`
returns `text`, `token_ids`, `finish_reason`, `prompt_tokens` and `completion_tokens`.
"""

from mindspore_serving.server import register

register.declare_llm(config_file="../../config/llama_tiny.yaml")
