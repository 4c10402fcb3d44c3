"""start_servable and startup_agents of server.distributed."""

from mindspore_serving.agent.distributed import startup
from mindspore_serving.server._server import start_servables
from mindspore_serving.server.start_config import DistributedStartConfig


def start_servable(
    servable_directory,
    servable_name,
    rank_table_json_file,
    version_number=1,
    distributed_address="127.0.0.1:6200",
    wait_agents_time_in_seconds=0,
    ssl_config=None,
):
    r"""Starts the distributed servable `servable_name` of `servable_directory` and blocks until its rank agents
    (started by `startup_agents` on each machine) have all registered.

    One worker process (log `serving_logs/log_<servable_name>_distributed.log`, never restarted) parses the rank
    table, checks that it lists `rank_size` ranks (from declare_servable) and that rank_size is a multiple of
    stage_size, and listens on `distributed_address` for the agents; it then registers with the master like any
    worker, so gRPC and RESTful requests reach the servable.

    Args:
        servable_directory (str): the directory holding `<servable_name>/servable_config.py`.
        servable_name (str): the servable name.
        rank_table_json_file (str): the rank table: `server_list[].device[{device_id, device_ip, rank_id}]` (with
            `server_id` the machine's ip) or `group_list`.
        version_number (int): the version, >= 0 (0 means 1). Default 1.
        distributed_address (str): `ip:port` where the worker waits for the agents. Default "127.0.0.1:6200":
            this host only (MindSpore Serving's is "0.0.0.0:6200"); give an address the agents reach for agents on
            other hosts.
        wait_agents_time_in_seconds (int): how long to wait for the agents, 0 (default) without limit.
        ssl_config (SSLConfig, optional): mutual TLS with the agents: this host's `certificate` and `private_key`
            and, as `custom_ca`, the CA that signed every agent host's certificate (client certificates are always
            required). The same as setting MS_SERVING_DISTRIBUTED_TLS_CERT, _KEY and _CA; the agents' hosts need
            theirs (`startup_agents(ssl_config=...)`).

    Raises:
        RuntimeError: a parameter is invalid, or the worker failed ("Fail to start workers: ...").
    """
    config = DistributedStartConfig(
        servable_directory,
        servable_name,
        rank_table_json_file,
        version_number,
        distributed_address,
        wait_agents_time_in_seconds,
        ssl_config,
    )
    start_servables(config)


def startup_agents(
    distributed_address,
    model_files,
    group_config_files=None,
    agent_start_port=7000,
    agent_ip=None,
    rank_start=None,
    dec_key=None,
    dec_mode="AES-GCM",
    ssl_config=None,
):
    r"""Starts the rank agents of this machine for the distributed worker at `distributed_address`.

    It reads the rank table from the worker, takes the ranks of this machine (the first rank table ip it can
    bind, or, with `agent_ip` and `rank_start`, the ranks on rank_start's machine) and starts one process per
    rank, as ranks of one MindSpore cluster whose scheduler runs beside rank 0. Each loads its model file and
    serves on `agent_ip:agent_start_port+i`. It returns once every local rank is ready ("Child <i>: Receive
    success"); a watcher then keeps the process alive, and stops the whole group (telling the worker, which
    then exits) when any rank dies or on SIGINT/SIGTERM.

    Args:
        distributed_address (str): the worker's distributed_address.
        model_files (Union[list[str], tuple[str]]): one model file per local rank, absolute or relative to the
            running script's directory.
        group_config_files: accepted for compatibility (HCCL group configs); unused.
        agent_start_port (int): the first agent port, in [1, 65528]. Default 7000.
        agent_ip (str, optional): this machine's ip; must be given together with rank_start.
        rank_start (int, optional): a rank of this machine; must be given together with agent_ip.
        dec_key (bytes, optional): a 16, 24 or 32 byte key to decrypt the model files.
        dec_mode (str): 'AES-GCM' (default) or 'AES-CBC'.
        ssl_config (SSLConfig, optional): mutual TLS with the distributed worker: this host's `certificate` and
            `private_key` and, as `custom_ca`, the CA that signed every host's certificate. It sets
            MS_SERVING_DISTRIBUTED_TLS_CERT, _KEY and _CA of this process, which the rank agents inherit.

    Raises:
        RuntimeError: a parameter is invalid, or the agents failed to start.
    """
    startup.startup_agents(
        distributed_address,
        model_files,
        group_config_files,
        agent_start_port,
        agent_ip,
        rank_start,
        dec_key,
        dec_mode,
        ssl_config,
    )
