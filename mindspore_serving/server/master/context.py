"""Master settings that users change from serving_server.py."""
from mindspore_serving.common.check_type import check_int
from mindspore_serving.master import master


def set_max_enqueued_requests(max_enqueued_requests):
    """Sets the most requests the master holds at once (default 10000); more get
    "Serving Error: enqueued requests count exceeds the limit <n>"."""
    check_int("max_enqueued_requests", max_enqueued_requests, 1)
    master.set_max_enqueued_requests(max_enqueued_requests)


def get_max_enqueued_requests() -> int:
    return master.get_max_enqueued_requests()


def set_heartbeat(interval_seconds=1.0, max_missed=3):
    """How often the master pings each worker (default every 1 s) and after how many missed pings in a row it
    gives one up (default 3): a worker that stops answering then has its requests failed with "... is not
    responding" and is killed and restarted, within interval_seconds * (max_missed + 1)."""
    if isinstance(interval_seconds, bool) or not isinstance(interval_seconds, (int, float)) or interval_seconds <= 0:
        raise RuntimeError(f"Parameter 'interval_seconds' should be a number > 0, but actually {interval_seconds!r}")
    check_int("max_missed", max_missed, 1)
    master.set_heartbeat(interval_seconds, max_missed)


def set_request_timeout(seconds=300):
    """How long a request that carries no deadline of its own (RESTful; a gRPC client's deadline is used as it
    is) may take before it fails with "deadline of <n> s exceeded"; the calls to the workers carry the same
    deadline. 0 means no limit. Default 300 s."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise RuntimeError(f"Parameter 'seconds' should be a number >= 0, but actually {seconds!r}")
    master.set_request_timeout(seconds)


def set_llm_token_timeout(seconds=60):
    """How long a language-model generation may go without producing a token (the first one included, so a long
    queue counts) before it ends with an error event / a 503 answer and is aborted in its worker. 0 means no
    limit. Default 60 s."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise RuntimeError(f"Parameter 'seconds' should be a number >= 0, but actually {seconds!r}")
    master.set_llm_token_timeout(seconds)
