"""An LLM servable inside its worker process.

runtime.py          LlmRuntime: the engine loop (llm/) over the agents, behind the worker's runtime interface
session_service.py  the LlmWorker gRPC Session the master opens: generate / abort in, step batches out
agent_client.py     AgentRunner: the engine's model runner, one Step call to every agent rank
agents.py           starts the agent processes and waits for their start-up events
prompts.py          Prompter: a request's input made into the engine's prompt (chat template); /tokenize, /detokenize
kv_cache.py         the KV cache's size where it needs the machine (memory budget), for the log and /metrics
hf_model.py         prepares a Hugging Face model directory: checks it, finds or exports its graphs, writes its config
"""
