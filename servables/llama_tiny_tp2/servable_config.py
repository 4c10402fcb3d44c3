"""Servable `llama_tiny_tp2`: the bundled tiny LLaMA sharded over two tensor-parallel agents (a MindSpore cluster).

The same methods and answers as `llama_tiny` (greedy outputs are equal); each agent holds half of the model and of
the KV cache.
"""

from mindspore_serving.server import register

register.declare_llm(config_file="../../config/llama_tiny_tp2.yaml")
