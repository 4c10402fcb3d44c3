"""Master settings that users change from serving_server.py."""
from mindspore_serving.common.check_type import check_int
from mindspore_serving.master.dispatcher import DEFAULT_MAX_ENQUEUED_REQUESTS

_settings = {"max_enqueued_requests": DEFAULT_MAX_ENQUEUED_REQUESTS}


def set_max_enqueued_requests(max_enqueued_requests):
    """Sets the most requests the master holds at once (default 10000); more get
    "Serving Error: enqueued requests count exceeds the limit <n>"."""
    check_int("max_enqueued_requests", max_enqueued_requests, 1)
    _settings["max_enqueued_requests"] = max_enqueued_requests
    from mindspore_serving.master.master import get_master
    master = get_master(create=False)
    if master is not None:
        master.dispatcher.max_enqueued_requests = max_enqueued_requests


def get_max_enqueued_requests() -> int:
    return _settings["max_enqueued_requests"]
