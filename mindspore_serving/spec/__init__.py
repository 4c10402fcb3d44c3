"""What servable_config.py declares (recorded by `server.register`, read by the worker) and the LLM servable YAML."""
