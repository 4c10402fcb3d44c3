"""The bench model's own best throughput: its MindIR called directly, in-process, with full batches.

    python bench/model_direct.py [--seconds 5] [--warmup 1]

Loads bench/servables/dense_batch/1/dense_batch.mindir with mindspore.load + nn.GraphCell (as the worker
does), then calls it back to back on full batches of fresh inputs for a fixed time, converting numpy ->
Tensor -> numpy on each call like the worker. Prints one JSON line: instances/s, ms per batch.
Run it while nothing else of the benchmark is busy; bench/classic.py runs it in a subprocess.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "servables", "dense_batch"))
import export_model  # noqa: E402  (bench/servables/dense_batch/export_model.py)


def measure(seconds: float, warmup: float) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn
    from mindspore_serving.common.ms_device import select_device
    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    export_model.main()
    net = nn.GraphCell(ms.load(export_model.MODEL_PATH))
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((export_model.BATCH, export_model.IN)).astype(np.float32) for _ in range(8)]

    def call(index):
        return net(Tensor(np.ascontiguousarray(inputs[index % len(inputs)]))).asnumpy()

    call(0)
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        call(0)
    calls, times = 0, []
    cpu0, start = time.process_time(), time.perf_counter()
    end = start + seconds
    while True:
        t0 = time.perf_counter()
        call(calls)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        calls += 1
        if t1 >= end:
            break
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    times.sort()
    return {"batch": export_model.BATCH, "calls": calls, "seconds": round(elapsed, 3),
            "instances_per_s": round(calls * export_model.BATCH / elapsed, 1),
            "ms_per_batch_mean": round(elapsed / calls * 1000, 3),
            "ms_per_batch_p50": round(times[len(times) // 2] * 1000, 3),
            "cpu_cores_used": round(cpu / elapsed, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    print("DIRECT_JSON " + json.dumps(measure(args.seconds, args.warmup)), flush=True)


if __name__ == "__main__":
    main()
