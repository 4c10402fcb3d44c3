"""Master settings that users change from serving_server.py."""

import dataclasses

from mindspore_serving.common.check_type import check_int, check_str
from mindspore_serving.frontends.api_groups import Access, check_groups
from mindspore_serving.master import master


def set_max_enqueued_requests(max_enqueued_requests):
    """Sets the most requests the master holds at once (default 10000); more get
    "Serving Error: enqueued requests count exceeds the limit <n>"."""
    check_int("max_enqueued_requests", max_enqueued_requests, 1)
    master.set_max_enqueued_requests(max_enqueued_requests)


def set_max_enqueued_bytes(max_enqueued_bytes):
    """Sets the most bytes of requests (their serialized instances) the master holds at once (default 1 GiB);
    beyond it new requests are refused as overloaded (gRPC RESOURCE_EXHAUSTED, HTTP 429), a request alone always
    goes (max_msg_mb_size bounds it)."""
    check_int("max_enqueued_bytes", max_enqueued_bytes, 1)
    master.set_max_enqueued_bytes(max_enqueued_bytes)


def get_max_enqueued_requests() -> int:
    return master.get_max_enqueued_requests()


def _check_seconds(name: str, value, low: float = 0.0, high: float = float("inf"), low_open: bool = False):
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value <= high
        or (value <= low if low_open else value < low)
    ):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        if high != float("inf"):
            bound = f"in [{low:g}, {high:g}]"
        raise RuntimeError(f"Parameter '{name}' should be a number of seconds {bound}, but actually {value!r}")


def check_grace(grace):
    _check_seconds("grace", grace, 0, 3600)


def set_stop_grace(grace):
    """Sets how many seconds requests in flight get to finish when the server stops (SIGTERM, SIGINT or
    server.stop(); default 10). New requests are refused at once; those still running at the end get an
    unavailable error."""
    check_grace(grace)
    master.set_stop_grace(grace)


def get_stop_grace() -> float:
    return master.get_stop_grace()


def set_heartbeat(interval_seconds=1.0, max_missed=3):
    """How often the master pings each worker (default every 1 s) and after how many missed pings in a row it
    gives one up (default 3): a worker that stops answering then has its requests failed with "... is not
    responding" and is killed and restarted, within interval_seconds * (max_missed + 1)."""
    _check_seconds("interval_seconds", interval_seconds, low_open=True)
    check_int("max_missed", max_missed, 1)
    master.set_heartbeat(interval_seconds, max_missed)


def set_request_timeout(seconds=300):
    """How long a request that carries no deadline of its own (RESTful; a gRPC client's deadline is used as it
    is) may take before it fails with "deadline of <n> s exceeded"; the calls to the workers carry the same
    deadline. 0 means no limit. Default 300 s."""
    _check_seconds("seconds", seconds)
    master.set_request_timeout(seconds)


def set_llm_token_timeout(seconds=60):
    """How long a language-model worker's engine may make no progress (no step completed) while it has
    generations before they end with an error event / a 503 answer ("... made no progress for <n> s") and are
    aborted in the worker. A generation queued behind work that progresses waits as long as it takes (a full
    queue refuses new requests at once: 429 / RESOURCE_EXHAUSTED). The worker reports its progress every second,
    so keep the timeout well above that. 0 means no limit. Default 60 s."""
    _check_seconds("seconds", seconds)
    master.set_llm_token_timeout(seconds)


def set_frontend_processes(count):
    """How many processes serve the public gRPC and RESTful ports (default 1: the master alone). With more, the
    master starts count-1 front-end processes when the first server starts; they open the same ports
    (SO_REUSEPORT: the kernel spreads new connections over them), parse, check and batch the requests they accept
    and call the workers directly, while the master keeps the control plane. Call it before start_grpc_server /
    start_restful_server; a `unix:` gRPC address is served by the master alone."""
    check_int("count", count, 1, 64)
    master.set_frontend_processes(count)


def get_frontend_processes() -> int:
    return master.get_frontend_processes()


def set_request_limits(
    llm_payload_bytes=None,
    read_timeout=None,
    max_connections=None,
    max_concurrent_rpcs=None,
    max_streams_per_conn=None,
    max_watch_streams=None,
    idle_timeout=None,
):
    """What one client may hold of the gRPC and RESTful servers started from now on; None keeps a setting as it
    is. `llm_payload_bytes`: the body limit of the LLM routes (OpenAI, TGI, MindSpore LLM; default 2,000,000; the
    classic and KServe routes keep the server's max_msg_mb_size), 413 beyond it. `read_timeout`: seconds a
    connection may take to send its request head, or stall in its body, before it is closed (default 10).
    `max_connections`: open RESTful connections beyond which requests are refused as overloaded (default 2048).
    `max_concurrent_rpcs` (default 2048) and `max_streams_per_conn` (HTTP/2 streams of one connection, default
    512): gRPC calls at once, RESOURCE_EXHAUSTED beyond. `max_watch_streams`: open grpc.health.v1 Watch streams
    (default 1000), RESOURCE_EXHAUSTED beyond. `idle_timeout`: seconds a keep-alive connection without a request
    (gRPC: without an open call) stays open (default 100)."""
    given = {
        name: value
        for name, value in (
            ("llm_payload_bytes", llm_payload_bytes),
            ("read_timeout", read_timeout),
            ("max_connections", max_connections),
            ("max_concurrent_rpcs", max_concurrent_rpcs),
            ("max_streams_per_conn", max_streams_per_conn),
            ("max_watch_streams", max_watch_streams),
            ("idle_timeout", idle_timeout),
        )
        if value is not None
    }
    master.set_request_limits(dataclasses.replace(master.get_request_limits(), **given))


def get_request_limits():
    return master.get_request_limits()


def set_api_key(key=None, key_file=None):
    """Requires an API key on the gRPC and RESTful servers started from now on (default: the environment's
    MS_SERVING_API_KEY, else none): every request but the health probes must carry `Authorization: Bearer <key>`
    (REST also `x-api-key: <key>`; gRPC as metadata, `Client(..., api_key=key)`), or it gets 401 /
    UNAUTHENTICATED. `key_file`: read the key from that file instead (its first line), as secrets are mounted.
    None for both: no key."""
    if key is not None and key_file is not None:
        raise RuntimeError("Parameters 'key' and 'key_file' cannot both be set")
    if key_file is not None:
        try:
            with open(check_str("key_file", key_file), encoding="utf-8") as stream:
                key = stream.readline().strip()
        except OSError as err:
            raise RuntimeError(f"Serving Error: read the API key from {key_file} failed: {err.strerror}") from None
        if not key:
            raise RuntimeError(f"Serving Error: the API key file {key_file} is empty")
    elif key is not None:
        check_str("key", key)
        if not key.strip() or key != key.strip():
            raise RuntimeError("Parameter 'key' should be a non-empty string without surrounding spaces")
    master.set_api_key(key)


def set_api_groups(restricted=None, opened=()):
    """Keys per API group, Triton's `--http-restricted-api` way, for the servers started from now on. `restricted`:
    {groups: key}, each a comma-separated list of groups that need that key instead of the server's (e.g.
    {"model-repository,admin": admin_key}); `opened`: groups that need no key (e.g. ("metrics",) for a scraper).
    The groups: health (open unless restricted), metadata, metrics, model-repository, admin (/docs, /openapi.json,
    /ready's worker details), inference (see frontends/api_groups.py)."""
    keys = {}
    for groups, key in (restricted or {}).items():
        check_str("key", key)
        if not key.strip() or key != key.strip():
            raise RuntimeError(
                "the key of a restricted API group should be a non-empty string without surrounding spaces"
            )
        for group in check_groups((g.strip() for g in check_str("groups", groups).split(",")), "restricted_api"):
            keys[group] = key
    opened = check_groups(opened, "open_api")
    Access(None, keys, opened)  # both at once are refused
    master.set_api_groups(keys, opened)


def set_model_control(mode="explicit"):
    """Opens model control to the front ends started from now on: "explicit" lets clients load and unload
    servables of the servable directory (KServe v2 `POST /v2/repository/models/<name>/load|unload`, gRPC
    RepositoryModelLoad/Unload); "none" (the default) and "poll" (`server.start_model_control_poll`, which sets
    it) refuse those requests with 403 / PERMISSION_DENIED. server.load_servable and unload_servable, called in
    the server's own process, work in every mode."""
    check_str("mode", mode)
    if mode not in master.MODEL_CONTROL_MODES:
        raise RuntimeError(
            f"Parameter 'mode' should be one of {', '.join(master.MODEL_CONTROL_MODES)}, but actually {mode!r}"
        )
    master.set_model_control(mode)
