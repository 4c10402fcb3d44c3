"""Hugging Face model directories of the LLaMA family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM) as `LlamaModel`s computing what transformers computes.

* `config`: config.json -> (LlamaConfig, extras), refusing what the network does not implement;
  generation_config.json -> stop ids and sampling defaults. Pure (no MindSpore).
* `weights`: *.safetensors (one file or sharded) -> float32 arrays under LlamaModel's parameter names. NumPy only.
* `loader`: `build_hf_model(model_dir)`, the MindSpore model holding those weights.

This package itself imports nothing heavy.
"""
