"""The messages between processes, one module per boundary; each boundary has its own version constant.

    master_worker.py  master <-> worker (internal.proto): sockets, channel options, PROTOCOL_VERSION
    agent.py          LLM worker <-> agent (agent.proto): start-up events, Step encoding, AGENT_PROTOCOL_VERSION
    llm_session.py    master <-> LLM worker generation session (llm_worker.proto): sampling params, events,
                      error kinds, finish reasons, LLM_SESSION_PROTOCOL_VERSION

The public boundary, client <-> master, is MindSpore Serving's ms_service.proto and has no version of its own.
"""
