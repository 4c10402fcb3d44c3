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


def check_grace(grace):
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= 3600:
        raise RuntimeError(f"Parameter 'grace' should be a number of seconds in [0, 3600], but actually {grace!r}")


def set_stop_grace(grace):
    """Sets how many seconds requests in flight get to finish when the server stops (SIGTERM, SIGINT or
    server.stop(); default 10). New requests are refused at once; those still running at the end get an
    unavailable error."""
    check_grace(grace)
    master.set_stop_grace(grace)


def get_stop_grace() -> float:
    return master.get_stop_grace()
