"""Servable `llama_tiny_spec`: the bundled tiny LLaMA with speculative decoding (engine.speculative: n-gram
proposals from each request's own tokens, verified in one graph call per step).

The same methods and answers as `llama_tiny` (speculation is lossless: greedy outputs are equal); not served by
default (`serving_server.py --servables llama_tiny_spec`).
"""

from mindspore_serving.server import register

register.declare_llm(config_file="../../config/llama_tiny_spec.yaml")
