"""What the secured server (secured_server.py), started with the shipped configurations, leaves open: its runtime
directory of sockets, of its own, only its user can enter, its sockets and every log file owner-only, and no TCP
port but its two public ones (every internal channel of a server on one host is a unix socket, the LLM agent's
included)."""

import os
import stat

import psutil
import requests
from secured_server import ADD_BODY, AUTH


def test_sockets_and_logs_are_owner_only(server, server_process, server_directory):
    _, url = server
    assert requests.post(url + "/model/add:add_common", json=ADD_BODY, headers=AUTH, timeout=30).status_code == 200
    parent = server_directory / "unix_socket_files"
    (runtime,) = os.listdir(parent)  # the server's own directory: nothing else in there
    sockets = parent / runtime
    assert runtime.startswith(f"{server_process.proc.pid}_")  # named after its master
    for directory in (parent, sockets, server_directory / "serving_logs"):
        info = os.lstat(directory)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700, (directory, oct(info.st_mode))
    names = os.listdir(sockets)
    assert any(name.startswith("serving_master_") for name in names)
    assert any(name.startswith("serving_worker_add_") for name in names)
    assert any(name.startswith("serving_frontend_") for name in names)
    assert any(name.startswith("serving_agent_") for name in names)  # the LLM agent, on a unix socket too
    for name in names:
        mode = os.lstat(sockets / name).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, (name, oct(mode))
    logs = os.listdir(server_directory / "serving_logs")
    assert any(name.startswith("log_add_") for name in logs) and "log_frontend_1.log" in logs, logs
    for name in logs:
        assert stat.S_IMODE(os.stat(server_directory / "serving_logs" / name).st_mode) == 0o600, name


def test_no_tcp_port_is_open_but_the_public_ones(server, server_process):
    grpc_addr, url = server
    assert requests.get(url + "/v1/models", headers=AUTH, timeout=30).status_code == 200  # every process is up
    processes = [psutil.Process(server_process.proc.pid)]
    processes += processes[0].children(recursive=True)
    listening = {
        (c.laddr.ip, c.laddr.port)
        for p in processes
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }
    public = {int(grpc_addr.rsplit(":", 1)[1]), int(url.rsplit(":", 1)[1])}
    assert {port for _, port in listening} == public, listening
    assert {ip for ip, _ in listening} <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening
