"""Model-parallel servables (MindSpore Serving's `server.distributed`) on MindSpore's own cluster.

In servable_config.py, `declare_servable(rank_size, stage_size)` declares the model. The server calls
`start_servable(servable_directory, servable_name, rank_table_json_file, distributed_address=...)`, which starts
one distributed worker that waits for the ranks; on each machine, `startup_agents(distributed_address,
model_files)` starts one rank agent process per local rank of the rank table. Example::

    # serving_server.py
    distributed.start_servable("servables", "matmul_distributed", "rank_table_2pcs.json",
                               distributed_address="127.0.0.1:6200")
    server.start_grpc_server("127.0.0.1:5500")

    # serving_agent.py
    distributed.startup_agents("127.0.0.1:6200", ["model/device0/matmul.mindir", "model/device1/matmul.mindir"])
"""

from mindspore_serving.server.distributed._declare import declare_servable
from mindspore_serving.server.distributed._start import start_servable, startup_agents

__all__ = ["start_servable", "startup_agents", "declare_servable"]
