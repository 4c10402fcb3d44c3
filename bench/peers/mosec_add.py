"""Peer for bench/classic.py: mosec 0.9.8 doing the same 2x2 float32 add with dynamic batching.

    python bench/peers/mosec_add.py --address 127.0.0.1 --port 8002 --log-level warning

One Python worker, max_batch_size 8, max_wait_time 5 ms, mosec's default JSON codec in and out.
It takes the body of our classic REST route and answers in its shape:
POST /inference  {"instances": [{"x1": [[..]], "x2": [[..]]}]} -> {"instances": [{"y": [[..]]}]}
"""
import numpy as np
from mosec import Server, Worker

MAX_BATCH_SIZE = 8
MAX_WAIT_MS = 5


class AddWorker(Worker):
    """forward gets a list of request bodies (mosec batching) and returns one reply per body, in order."""

    def forward(self, data: list) -> list:
        counts = [len(body["instances"]) for body in data]
        instances = [instance for body in data for instance in body["instances"]]
        x1 = np.asarray([instance["x1"] for instance in instances], np.float32)
        x2 = np.asarray([instance["x2"] for instance in instances], np.float32)
        y = (x1 + x2).tolist()  # one add for the whole batch
        replies, start = [], 0
        for count in counts:
            replies.append({"instances": [{"y": value} for value in y[start:start + count]]})
            start += count
        return replies


if __name__ == "__main__":
    server = Server()  # reads --address, --port, --log-level, --timeout ... from the command line
    server.append_worker(AddWorker, num=1, max_batch_size=MAX_BATCH_SIZE, max_wait_time=MAX_WAIT_MS)
    server.run()
