"""MindSpore's dynamic cluster: the environment of its processes, its scheduler process, and joining it.

A cluster is one scheduler process (`MS_ROLE=MS_SCHED`) and N rank processes (`MS_ROLE=MS_WORKER`,
`MS_NODE_ID=r`), all with `MS_SCHED_HOST`, `MS_SCHED_PORT` and `MS_WORKER_NUM=N`. Each rank calls
`mindspore.communication.init()`, which returns once every rank has reached the scheduler; collectives
(AllReduce, also inside loaded MindIR graphs) then run between the ranks over TCP on CPU, HCCL on Ascend and NCCL
on GPU. The scheduler may run on another host. A rank that dies is noticed by the scheduler only after its node
timeout (about 30 s), while the other ranks block in their next collective: whoever runs a cluster watches its
ranks itself and stops them all when one is lost.

`start_scheduler` runs `python -m mindspore_serving.common.ms_cluster` with the scheduler's variables.

The cluster's own channel is plaintext and takes any node that registers, unless MindSpore's TLS is on: with
MS_SERVING_CLUSTER_SSL_CONFIG naming MindSpore's SSL JSON (server_cert_path and client_cert_path as PKCS#12,
ca_cert_path, crl_path, cipher_list, cert_expire_warning_time_in_day) and the two PKCS#12 passwords in
MS_SERVING_CLUSTER_SERVER_PASSWORD and MS_SERVING_CLUSTER_CLIENT_PASSWORD, the scheduler and every rank call
`mindspore.set_ps_context(enable_ssl=True, ...)` before `init()`: the scheduler and the ranks then speak mutual TLS,
collectives included.
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mindspore_serving import log
from mindspore_serving.common.child_process import child_env
from mindspore_serving.common.net import accepts_connections

SCHEDULER_MODULE = "mindspore_serving.common.ms_cluster"
_PARENT_PID_VAR = "MS_SERVING_SCHEDULER_PARENT"
_PARENT_CHECK_SECONDS = 0.5


@dataclass(frozen=True)
class ClusterAddress:
    """Where a cluster's scheduler listens and how many ranks the cluster has."""

    host: str
    port: int
    ranks: int

    def env(self, rank: int | None = None) -> dict[str, str]:
        """The variables of a rank's process (`rank` given) or of the scheduler's (None)."""
        env = {"MS_SCHED_HOST": self.host, "MS_SCHED_PORT": str(self.port), "MS_WORKER_NUM": str(self.ranks)}
        if rank is None:
            env["MS_ROLE"] = "MS_SCHED"
        else:
            env.update(MS_ROLE="MS_WORKER", MS_NODE_ID=str(rank))
        return env

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_address(address: str, ranks: int) -> ClusterAddress:
    """'host:port' -> ClusterAddress; ValueError names what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"cluster scheduler address '{address}' must be host:port with a port in [1, 65535]")
    return ClusterAddress(host, int(port), ranks)


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def start_scheduler(address: ClusterAddress, timeout: float = 60.0, **popen_kwargs: Any) -> subprocess.Popen:
    """Starts the cluster's scheduler process and returns once it listens (a rank that finds no scheduler
    backs off for many seconds before it tries again); it runs until the ranks finish, it is stopped, or this
    process is gone. Its own MindSpore log is kept to errors (GLOG_v=3) unless MS_SERVING_SCHEDULER_GLOG_v says
    otherwise: it reports the cluster's health every few seconds. This package's log in it keeps this process's
    level (MS_SUBMODULE_LOG_v's SERVING entry)."""
    cluster_ssl_settings()  # a TLS setting the scheduler could not use fails here, where it is seen
    env = child_env()
    env.update(address.env())
    env[_PARENT_PID_VAR] = str(os.getpid())
    env["MS_SUBMODULE_LOG_v"] = log.pinned_submodule_config()
    env["GLOG_v"] = os.environ.get("MS_SERVING_SCHEDULER_GLOG_v", "3")
    process = subprocess.Popen(
        [sys.executable, "-m", SCHEDULER_MODULE], env=env, stdin=subprocess.DEVNULL, **popen_kwargs
    )
    if not wait_listening(address, timeout, gone=lambda: process.poll() is not None):
        process.kill()
        process.wait()
        raise RuntimeError(
            f"the cluster scheduler did not listen on {address} "
            + (
                f"(it exited with code {process.returncode})"
                if process.returncode is not None
                else f"within {timeout:.0f} s"
            )
        )
    return process


def wait_listening(address: ClusterAddress, timeout: float, gone: Callable[[], bool] = lambda: False) -> bool:
    """Waits until the scheduler at `address` accepts connections (True), `timeout` passed or `gone()` (False).
    Ranks are started only then: one that finds no scheduler backs off for many seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if accepts_connections(address.host, address.port, timeout=1.0):
            return True
        if gone() or time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def rank_env(address: ClusterAddress, rank: int) -> dict[str, str]:
    """A child environment for rank `rank` of the cluster."""
    env = child_env()
    env.update(address.env(rank))
    return env


def is_cluster_rank() -> bool:
    """True in a process started as a cluster rank (rank_env)."""
    return os.environ.get("MS_ROLE") == "MS_WORKER"


SSL_CONFIG_ENV = "MS_SERVING_CLUSTER_SSL_CONFIG"
SERVER_PASSWORD_ENV = "MS_SERVING_CLUSTER_SERVER_PASSWORD"
CLIENT_PASSWORD_ENV = "MS_SERVING_CLUSTER_CLIENT_PASSWORD"


def cluster_ssl_settings(environ: Mapping[str, str] | None = None) -> dict[str, object] | None:
    """The `mindspore.set_ps_context` arguments that turn on TLS for the cluster's channel, None without
    MS_SERVING_CLUSTER_SSL_CONFIG; RuntimeError when the file or a password is missing (MindSpore would refuse
    it later, with less to go on)."""
    environ = os.environ if environ is None else environ
    path = environ.get(SSL_CONFIG_ENV, "")
    if not path:
        return None
    if not os.path.isfile(path):
        raise RuntimeError(f"{SSL_CONFIG_ENV}: no file '{path}'")
    missing = [name for name in (SERVER_PASSWORD_ENV, CLIENT_PASSWORD_ENV) if not environ.get(name)]
    if missing:
        raise RuntimeError(f"{SSL_CONFIG_ENV} needs the PKCS#12 passwords in {' and '.join(missing)}")
    return dict(
        enable_ssl=True,
        config_file_path=os.path.abspath(path),
        client_password=environ[CLIENT_PASSWORD_ENV],
        server_password=environ[SERVER_PASSWORD_ENV],
    )


def _init_cluster() -> None:
    """`mindspore.communication.init()`, with MindSpore's TLS on the cluster channel when it is configured."""
    settings = cluster_ssl_settings()
    import mindspore  # lazy: MindSpore loads only in the cluster's own processes
    from mindspore.communication import init  # lazy: as above

    if settings is not None:
        mindspore.set_ps_context(**settings)
    init()


def join_cluster() -> int:
    """`mindspore.communication.init()` in a rank process; returns this process's rank. Blocks until every rank
    has reached the scheduler."""
    from mindspore.communication import get_rank  # lazy: MindSpore loads only in processes that run models

    _init_cluster()
    rank: int = get_rank()
    return rank


def _run_scheduler() -> int:
    if os.environ.get("MS_ROLE") != "MS_SCHED":
        sys.exit("the cluster scheduler needs MS_ROLE=MS_SCHED, MS_SCHED_HOST, MS_SCHED_PORT and MS_WORKER_NUM")
    parent = int(os.environ.get(_PARENT_PID_VAR, "0"))
    done = threading.Event()

    def serve() -> None:
        try:
            _init_cluster()  # serves the cluster until its ranks finalize
        finally:
            done.set()

    threading.Thread(target=serve, name="cluster-scheduler", daemon=True).start()
    while not done.wait(_PARENT_CHECK_SECONDS):
        if parent and os.getppid() != parent:
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # MindSpore's exit handlers wait for ranks that may be gone


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    sys.exit(_run_scheduler())
