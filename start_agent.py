"""Starts the LLM agents of a configuration on this host, one process per device rank. The same as
`mindspore-serving agent`, with the same flags:

    python start_agent.py --config config/llama_tiny.yaml
    python start_agent.py --config llm.yaml --rank_start 1 [--scheduler_address 10.0.0.1:7090]

`python start_agent.py --help` tells more (mindspore_serving/cli/agent.py defines it).
"""

from mindspore_serving.cli import agent

if __name__ == "__main__":
    agent.main(prog="start_agent.py")
