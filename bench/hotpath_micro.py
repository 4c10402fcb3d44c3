"""Per-request cost of the pieces of our hot path, each measured alone in this process (no network).

    python bench/hotpath_micro.py [--n 2000] [--only master|worker]

Master side (pure Python, no worker): REST JSON parse -> Instance protos -> dispatcher checks -> internal request
-> reply -> JSON; the public gRPC reply build. Worker side: tensor codec, MethodRunner + ModelExecutor thread
handoff, GraphCell call of the `add` MindIR (and the same call through MindSpore's executor with the compiled
phase, skipping Cell.compile's per-call checks). Prints wall and CPU microseconds per call; CPU counts every
thread of this process. Numbers vary with the load on the machine: compare rows of one run.
"""

import argparse
import asyncio
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BODY = b'{"instances":[{"x1":[[1.0,2.0],[3.0,4.0]],"x2":[[5.0,6.0],[7.0,8.0]]}]}'
PATH = "/model/add:add_common"


def timeit(label: str, fn, n: int, rows: list):
    for _ in range(min(200, n)):
        fn()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    t1, c1 = time.perf_counter(), time.process_time()
    rows.append((label, (t1 - t0) / n * 1e6, (c1 - c0) / n * 1e6))


def master_rows(n: int, rows: list):
    from mindspore_serving.common.tensor_codec import instances_to_proto, proto_to_instance
    from mindspore_serving.frontends import restful_codec
    from mindspore_serving.frontends.replies import predict_reply
    from mindspore_serving.master.dispatcher import Dispatcher
    from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
    from mindspore_serving.proto import internal_pb2, ms_service_pb2

    def parse():
        name, method, version, instances = restful_codec.parse_request(PATH, BODY, 1 << 26, "POST")
        spec = ms_service_pb2.ServableSpec(name=name, method_name=method, version_number=version)
        request = ms_service_pb2.PredictRequest()
        instances_to_proto(instances, request.instances)
        return spec, request

    spec, request = parse()
    y = np.array([[6.0, 8.0], [10.0, 12.0]], np.float32)
    reply_instance = ms_service_pb2.Instance()
    reply_instance.items["y"].dtype = ms_service_pb2.MS_FLOAT32
    reply_instance.items["y"].shape.dims.extend([2, 2])
    reply_instance.items["y"].data = y.tobytes()

    timeit("master REST: parse_request + instances_to_proto", parse, n, rows)
    timeit(
        "master REST: encode_reply(proto_to_instance)",
        lambda: restful_codec.encode_reply([proto_to_instance(reply_instance, copy=False)]),
        n,
        rows,
    )

    class Stub:
        async def Predict(self, request, timeout=None):
            reply = internal_pb2.WorkerPredictReply(request_id=request.request_id)
            for _ in request.request.instances:
                reply.instances.add().CopyFrom(reply_instance)
                reply.error_msg.add()
            return reply

    class Signature:
        input_names = ["x1", "x2"]
        only_model_stage = True

    registry = WorkerRegistry()
    registry.add(
        WorkerRecord(
            key="add/v1",
            pid=1,
            address="",
            servable_name="add",
            version_number=1,
            batch_size=1,
            methods={"add_common": Signature()},
            stub=Stub(),
        )
    )
    dispatcher = Dispatcher(registry)
    loop = asyncio.new_event_loop()

    async def many(count):
        for _ in range(count):
            await dispatcher.predict(spec, request.instances)

    c0, t0 = time.process_time(), time.perf_counter()
    loop.run_until_complete(many(n))
    t1, c1 = time.perf_counter(), time.process_time()
    rows.append(
        (
            "master: Dispatcher.predict (checks, WorkerPredictRequest, fake stub)",
            (t1 - t0) / n * 1e6,
            (c1 - c0) / n * 1e6,
        )
    )

    async def gathered(count):
        await asyncio.gather(*[dispatcher.predict(spec, request.instances) for _ in range(count)])

    c0, t0 = time.process_time(), time.perf_counter()
    loop.run_until_complete(gathered(n))
    t1, c1 = time.perf_counter(), time.process_time()
    rows.append(("master: same, n concurrent tasks (asyncio task overhead)", (t1 - t0) / n * 1e6, (c1 - c0) / n * 1e6))

    from mindspore_serving.frontends.restful_server import RestfulApp

    app = RestfulApp(dispatcher, 1 << 26, fallback=None)
    scope = {"type": "http", "method": "POST", "path": PATH, "headers": []}

    async def one_request():
        async def receive():
            return {"type": "http.request", "body": BODY, "more_body": False}

        async def send(_message):
            pass

        await app(scope, receive, send)

    async def app_gathered(count):
        await asyncio.gather(*[one_request() for _ in range(count)])

    for _ in range(2):  # the first round warms up, the second is kept
        c0, t0 = time.process_time(), time.perf_counter()
        loop.run_until_complete(app_gathered(n))
        t1, c1 = time.perf_counter(), time.process_time()
    rows.append(
        ("master REST: the whole ASGI app, n concurrent (no uvicorn)", (t1 - t0) / n * 1e6, (c1 - c0) / n * 1e6)
    )
    loop.close()
    results = [reply_instance]
    timeit("master gRPC: predict_reply", lambda: predict_reply(spec, results), n, rows)
    timeit(
        "master gRPC: PredictRequest parse (upb)",
        lambda: ms_service_pb2.PredictRequest.FromString(request.SerializeToString()),
        n,
        rows,
    )


def worker_rows(n: int, rows: list):
    import mindspore as ms
    from mindspore import Tensor
    from mindspore.graph.api import _cell_graph_executor

    from mindspore_serving.client import convert
    from mindspore_serving.common.tensor_codec import proto_to_instances, value_to_tensor
    from mindspore_serving.proto import internal_pb2
    from mindspore_serving.worker.servable_loader import load_servable
    from mindspore_serving.worker.service import WorkerServicer

    runtime, _ = load_servable(os.path.join(ROOT, "servables"), "add", 0, "CPU", 0)
    servicer = WorkerServicer(runtime, lambda reason: None)
    x1 = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    x2 = np.array([[5.0, 6.0], [7.0, 8.0]], np.float32)
    public = convert.create_request([{"x1": x1, "x2": x2}], "add", "add_common", 0)
    request = internal_pb2.WorkerPredictRequest(request_id="1")
    request.request.CopyFrom(public)
    request.request.servable_spec.version_number = 1

    timeit("worker: proto_to_instances", lambda: proto_to_instances(request.request.instances), n, rows)
    reply = internal_pb2.WorkerPredictReply()
    y = x1 + x2
    timeit("worker: value_to_tensor (output)", lambda: value_to_tensor(y, reply.instances.add().items["y"]), n, rows)
    instances = proto_to_instances(request.request.instances)
    timeit(
        "worker: runtime.predict (MethodRunner + executor thread + GraphCell)",
        lambda: runtime.predict("add_common", instances),
        n,
        rows,
    )
    timeit(
        "worker: WorkerServicer.Predict (all of the above, no gRPC)", lambda: servicer.Predict(request, None), n, rows
    )
    graph = runtime.models[next(iter(runtime.models))].subgraphs[0]
    timeit("worker: Subgraph.run (GraphCell call, Tensor in, asnumpy out)", lambda: graph.run([x1, x2]), n, rows)
    cell = graph.cell
    phase = cell.phase

    def fast():
        out = _cell_graph_executor(cell, Tensor(x1), Tensor(x2), phase=phase)
        return out.asnumpy()

    np.testing.assert_allclose(fast(), x1 + x2)
    timeit("worker: same graph via _cell_graph_executor(cell, ..., phase) (no per-call compile)", fast, n, rows)
    timeit("worker: numpy x1 + x2", lambda: x1 + x2, n, rows)
    runtime.close()
    del ms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--only", choices=("master", "worker"))
    args = parser.parse_args(argv)
    rows = []
    if args.only in (None, "master"):
        master_rows(args.n, rows)
    if args.only in (None, "worker"):
        worker_rows(args.n, rows)
    width = max(len(label) for label, _, _ in rows)
    print(f"{'piece':{width}s}  wall us  cpu us")
    for label, wall, cpu in rows:
        print(f"{label:{width}s}  {wall:7.1f}  {cpu:6.1f}")
    measures = [{"piece": piece, "wall_us": round(w, 1), "cpu_us": round(c, 1)} for piece, w, c in rows]
    print("MICRO_JSON " + json.dumps(measures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
