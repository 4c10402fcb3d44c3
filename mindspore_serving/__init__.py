"""MindSpore Serving: serve MindSpore MindIR models and large language models over gRPC and HTTP."""

__version__ = "0.1.0"
