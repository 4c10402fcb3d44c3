"""The reference LLaMA-architecture model: config, MindSpore network, paged-graph exporter, tokenizer, training.

Submodules import MindSpore on use; this package itself imports nothing heavy.
"""
