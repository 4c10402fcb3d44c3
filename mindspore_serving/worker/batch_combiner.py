"""Calls that meet at a busy graph share its next batches.

A worker answers each master connection on a thread of its own (ipc/predict_socket.py), and several connections
carry calls at once: the master keeps a second call in flight, and every front-end process has connections of
its own (master/frontend_processes.py). Each call's instances are already joined into arrays (direct_batch.py);
run alone, two calls of 32 rows would cost two batch-64 graph runs. Here the rows of every call wait in one
queue while the graph runs, and the next run takes them in arrival order, up to a full batch, from however many
calls: a call may be spread over several runs and a run may serve several calls.

One caller at a time leads: it runs batches for the whole queue until its own rows are done, then hands the lead
to the oldest waiting call (whose thread wakes and goes on) or, with none waiting, leaves. So the graph never
idles while rows wait, no thread polls, and a call waits for at most the runs ahead of it plus its own.
"""

import collections
import threading
from collections.abc import Callable

import numpy as np

RunBatch = Callable[[list[np.ndarray], int], list[np.ndarray]]
"""(inputs padded to a full batch, rows that are real) -> the graph's outputs, batch first."""


class _Call:
    __slots__ = ("inputs", "count", "taken", "outputs", "done_rows", "error", "wake", "lead")

    def __init__(self, inputs: list[np.ndarray]):
        self.inputs = inputs
        self.count = len(inputs[0])
        self.taken = 0  # rows handed to runs so far
        self.outputs: list[list] = []  # per run that served it: (offset in the call, output arrays)
        self.done_rows = 0
        self.error: BaseException | None = None
        self.wake = threading.Event()  # its rows are done, or it leads now
        self.lead = False

    @property
    def finished(self) -> bool:
        return self.error is not None or self.done_rows == self.count


class BatchCombiner:
    def __init__(self, run_batch: RunBatch, batch_size: int):
        self.run_batch = run_batch
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._queue: collections.deque[_Call] = collections.deque()  # calls with rows not yet taken by a run
        self._leading = False

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs of the call's rows (`inputs`: arrays of the same length, batch first), batch first.
        Raises what the graph raised on a run that held some of its rows."""
        call = _Call(inputs)
        with self._lock:
            self._queue.append(call)
            lead = not self._leading
            self._leading = True
        if not lead:
            call.wake.wait()
            if not call.lead:
                return _result(call)
        self._lead(call)
        return _result(call)

    def _lead(self, own: _Call):
        while True:
            with self._lock:
                if own.finished:
                    waiting = next((c for c in self._queue if not c.finished), None)
                    if waiting is None:
                        self._leading = False
                    else:
                        waiting.lead = True
                        waiting.wake.set()
                    return
                parts = self._take()
            self._run(parts)

    def _take(self) -> list[tuple]:
        """Up to a batch of rows from the head of the queue: [(call, first row, rows)] (under the lock)."""
        parts, room = [], self.batch_size
        while self._queue and room:
            call = self._queue[0]
            rows = min(room, call.count - call.taken)
            parts.append((call, call.taken, rows))
            call.taken += rows
            room -= rows
            if call.taken == call.count:
                self._queue.popleft()
        return parts

    def _run(self, parts: list[tuple]):
        count = sum(rows for _, _, rows in parts)
        inputs = [
            _batch([call.inputs[index][start : start + rows] for call, start, rows in parts], self.batch_size)
            for index in range(len(parts[0][0].inputs))
        ]
        try:
            outputs = self.run_batch(inputs, count)
        except BaseException as err:  # pylint: disable=broad-except
            with self._lock:
                for call, _, _ in parts:
                    call.error = err
                    if call in self._queue:
                        self._queue.remove(call)  # its other rows are not run: the call failed
            for call, _, _ in parts:
                call.wake.set()
            return
        offset = 0
        finished = []
        with self._lock:
            for call, start, rows in parts:
                call.outputs.append((start, [output[offset : offset + rows] for output in outputs]))
                offset += rows
                call.done_rows += rows
                if call.finished:
                    finished.append(call)
        for call in finished:
            call.wake.set()


def _result(call: _Call) -> list[np.ndarray]:
    if call.error is not None:
        raise call.error
    pieces = sorted(call.outputs, key=lambda piece: piece[0])
    if len(pieces) == 1:
        return pieces[0][1]
    return [np.concatenate([arrays[index] for _, arrays in pieces]) for index in range(len(pieces[0][1]))]


def _batch(pieces: list[np.ndarray], batch_size: int) -> np.ndarray:
    """The rows of `pieces`, in order, padded to `batch_size` with copies of the first row; contiguous."""
    count = sum(len(piece) for piece in pieces)
    if len(pieces) == 1 and count == batch_size:
        return np.asarray(pieces[0], order="C")
    first = pieces[0]
    batch = np.empty((batch_size,) + first.shape[1:], first.dtype)
    offset = 0
    for piece in pieces:
        batch[offset : offset + len(piece)] = piece
        offset += len(piece)
    batch[offset:] = first[0]
    return batch
