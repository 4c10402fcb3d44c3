"""The messages between processes, one module per boundary; each boundary has its own version constant.

    master_worker.py   master <-> worker (internal.proto): sockets, channel options, PROTOCOL_VERSION
    predict_socket.py  master <-> worker Predict calls framed on a plain unix socket (internal.proto messages,
                       under the same PROTOCOL_VERSION): both ends of that wire
    shm_tensors.py     an extra worker's model calls through the master: their tensors in shared memory
                       (internal.proto CallModelRequest, under the same PROTOCOL_VERSION)
    agent.py           LLM worker <-> agent (agent.proto): start-up events, Step encoding, AGENT_PROTOCOL_VERSION
    llm_session.py     master <-> LLM worker generation session (llm_worker.proto): sampling params, events,
                       error kinds, finish reasons, LLM_SESSION_PROTOCOL_VERSION
    distributed.py     distributed worker <-> rank agents (distributed.proto): services, secret, channels,
                       DISTRIBUTED_PROTOCOL_VERSION
    internal_tls.py    mutual TLS on the internal channels that cross hosts (distributed.py's, and agent.py's on
                       TCP ports)

The public boundary, client <-> master, is MindSpore Serving's ms_service.proto and has no version of its own.
"""
