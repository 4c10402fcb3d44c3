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
