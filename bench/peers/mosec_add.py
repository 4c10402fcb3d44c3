"""Peer for bench/classic.py: mosec 0.9.8 doing the same 2x2 float32 add with dynamic batching.

    python bench/peers/mosec_add.py --address 127.0.0.1 --port 8002 --log-level warning

One Python worker, max_batch_size 8, max_wait_time 5 ms, mosec's default JSON codec in and out.
It takes the body of our classic REST route and answers in its shape:
POST /inference  {"instances": [{"x1": [[..]], "x2": [[..]]}]} -> {"instances": [{"y": [[..]]}]}
"""

import numpy as np
from mosec import Worker
from mosec_common import flatten, replies, serve  # bench/peers/mosec_common.py

MAX_BATCH_SIZE = 8
MAX_WAIT_MS = 5


class AddWorker(Worker):
    """forward gets a list of request bodies (mosec batching) and returns one reply per body, in order."""

    def forward(self, data: list) -> list:
        instances, counts = flatten(data)
        x1 = np.asarray([instance["x1"] for instance in instances], np.float32)
        x2 = np.asarray([instance["x2"] for instance in instances], np.float32)
        return replies((x1 + x2).tolist(), counts)  # one add for the whole batch


if __name__ == "__main__":
    serve(AddWorker, MAX_BATCH_SIZE, MAX_WAIT_MS)
