"""Peer for bench/classic.py: mosec 0.9.8 serving the dense_batch MindIR through GraphCell, with dynamic batching.

    python bench/peers/mosec_dense.py --address 127.0.0.1 --port 8003 --log-level warning

One mosec worker process loads bench/servables/dense_batch/1/dense_batch.mindir with mindspore.load +
nn.GraphCell (as our worker does) and gets up to 64 requests at once (max_wait_time 10 ms), mosec's default JSON
codec in and out. The graph has a fixed batch of 64: a smaller batch is padded with copies of its first row.
It takes the body of our classic REST route and answers in its shape:
POST /inference  {"instances": [{"x": [512 floats]}]} -> {"instances": [{"y": [16 floats]}]}
"""

import os
import sys

import numpy as np
from mosec import Worker
from mosec_common import flatten, replies, serve  # bench/peers/mosec_common.py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "servables", "dense_batch"))
import export_model  # noqa: E402  (bench/servables/dense_batch/export_model.py)

MAX_BATCH_SIZE = export_model.BATCH
MAX_WAIT_MS = 10


class DenseWorker(Worker):
    """forward gets a list of request bodies (mosec batching) and returns one reply per body, in order."""

    def __init__(self):
        super().__init__()
        import mindspore as ms
        from mindspore import Tensor, nn

        ms.set_device("CPU")
        ms.set_context(mode=ms.GRAPH_MODE)
        self.tensor = Tensor
        self.net = nn.GraphCell(ms.load(export_model.MODEL_PATH))

    def forward(self, data: list) -> list:
        instances, counts = flatten(data)
        rows = [instance["x"] for instance in instances]
        outputs = []
        for start in range(0, len(rows), MAX_BATCH_SIZE):
            chunk = rows[start : start + MAX_BATCH_SIZE]
            batch = np.empty((MAX_BATCH_SIZE, export_model.IN), np.float32)
            batch[: len(chunk)] = np.asarray(chunk, np.float32)
            batch[len(chunk) :] = batch[0]
            outputs.extend(self.net(self.tensor(batch)).asnumpy()[: len(chunk)].tolist())
        return replies(outputs, counts)


if __name__ == "__main__":
    serve(DenseWorker, MAX_BATCH_SIZE, MAX_WAIT_MS)
