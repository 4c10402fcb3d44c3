"""The LLM serving benchmark (bench/llm_serving.py) by role: the workload and the client that sends it, the server
and the engine subprocess it is measured against, CPU accounting, the logs the server writes, py-spy profiles,
and the summary and report made of it all."""
