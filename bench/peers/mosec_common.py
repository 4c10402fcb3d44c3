"""What the mosec peers share: mosec's batches of request bodies in and out, and serving one worker class."""

from mosec import Server


def flatten(data: list) -> tuple:
    """(instances of every body of a mosec batch, in order; how many each body has)."""
    counts = [len(body["instances"]) for body in data]
    return [instance for body in data for instance in body["instances"]], counts


def replies(outputs: list, counts: list) -> list:
    """One reply body per request body: {"instances": [{"y": ...}, ...]}, its share of `outputs` in order."""
    answers, start = [], 0
    for count in counts:
        answers.append({"instances": [{"y": value} for value in outputs[start : start + count]]})
        start += count
    return answers


def serve(worker_class, max_batch_size: int, max_wait_ms: int):
    """One worker process of `worker_class`; the address, port, log level... come from the command line."""
    server = Server()
    server.append_worker(worker_class, num=1, max_batch_size=max_batch_size, max_wait_time=max_wait_ms)
    server.run()
