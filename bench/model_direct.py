"""A bench model's own best throughput: its MindIR called directly, in-process, back to back.

    python bench/model_direct.py [--model dense|add] [--cores 1] [--seconds 5] [--warmup 1]

Loads the MindIR with mindspore.load + nn.GraphCell (as the worker does), then calls it back to back for a fixed
time, converting numpy -> Tensor -> numpy on each call like the worker:
- dense: bench/servables/dense_batch/1/dense_batch.mindir on full batches of 64 fresh inputs;
- add: servables/add/1/tensor_add.mindir on one [2, 2] pair per call (the bare GraphCell loop that the served `add`
  is compared with).
With --cores N the process is bound to its first N allowed cores before MindSpore starts (its runtime then sizes its
thread pool to them). Prints one JSON line: instances/s, ms per call, cores used.
Run it while nothing else of the benchmark is busy; bench/classic.py runs it in a subprocess.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "servables", "dense_batch"))
import export_model  # noqa: E402  (bench/servables/dense_batch/export_model.py)

ADD_MODEL = os.path.join(ROOT, "servables", "add", "1", "tensor_add.mindir")


def bind(cores: int):
    """Binds this process to its first `cores` allowed cores."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, allowed[: max(1, cores)])


def model_call(model: str, op_threads: int = 0, dispatch_threads: int = 0):
    """(the call of one batch, instances per call)."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    if op_threads:
        ms.device_context.cpu.op_tuning.threads_num(op_threads)
    if dispatch_threads:
        ms.runtime.dispatch_threads_num(dispatch_threads)
    rng = np.random.default_rng(0)
    if model == "add":
        net = nn.GraphCell(ms.load(ADD_MODEL))
        pairs = [[rng.standard_normal((2, 2)).astype(np.float32) for _ in range(2)] for _ in range(8)]
        return (lambda index: net(*(Tensor(x) for x in pairs[index % len(pairs)])).asnumpy()), 1
    export_model.main()
    net = nn.GraphCell(ms.load(export_model.MODEL_PATH))
    inputs = [rng.standard_normal((export_model.BATCH, export_model.IN)).astype(np.float32) for _ in range(8)]
    return (lambda index: net(Tensor(np.ascontiguousarray(inputs[index % len(inputs)]))).asnumpy()), export_model.BATCH


def measure(model: str, seconds: float, warmup: float, op_threads: int = 0, dispatch_threads: int = 0) -> dict:
    call, batch = model_call(model, op_threads, dispatch_threads)
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
    return {
        "model": model,
        "batch": batch,
        "cores": len(os.sched_getaffinity(0)),
        "calls": calls,
        "seconds": round(elapsed, 3),
        "instances_per_s": round(calls * batch / elapsed, 1),
        "ms_per_batch_mean": round(elapsed / calls * 1000, 4),
        "ms_per_batch_p50": round(times[len(times) // 2] * 1000, 4),
        "cpu_cores_used": round(cpu / elapsed, 2),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("dense", "add"), default="dense")
    parser.add_argument("--cores", type=int, default=0, help="bind to this many cores (default: all allowed)")
    parser.add_argument("--op_threads", type=int, default=0, help="MindSpore's CPU kernel threads (default: its own)")
    parser.add_argument(
        "--dispatch_threads", type=int, default=0, help="MindSpore's runtime threads (default: its own)"
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    if args.cores:
        bind(args.cores)
    print(
        "DIRECT_JSON "
        + json.dumps(measure(args.model, args.seconds, args.warmup, args.op_threads, args.dispatch_threads)),
        flush=True,
    )


if __name__ == "__main__":
    main()
