"""An LLM servable inside its worker process.

runtime.py          LlmRuntime: the engine loop (llm/) over the agents, behind the worker's runtime interface
session_service.py  the LlmWorker gRPC Session the master opens: generate / abort in, step batches out
agent_client.py     AgentRunner: the engine's model runner, one Step call to every agent rank
agents.py           starts the agent processes and waits for their start-up events
"""
