"""The comparison's scenarios: what a user of MindSpore Serving does, grouped by server start (harness.Group).

Each scenario's observation must be the same on MindSpore Serving 2.0.2 and on ours, or be listed in
compare.KNOWN with the reason (docs/serving.md, "Differences from MindSpore Serving", says why).
"""

import base64
import json
import os
import time

import numpy as np
import psutil
from certificates import make_certs
from harness import Context, Group, Scenario, free_port, log_lines

ADD = {"add": {"1": ["tensor_add.mindir"]}}
EXAMPLE_PORT = 5500  # in addresses refused before anything listens (the same in both servings' texts)
X1 = [[1.0, 2.0], [3.0, 4.0]]
X2 = [[10.0, 20.0], [30.0, 40.0]]


def nd(array) -> dict:
    array = np.asarray(array)
    return {"__nd__": [str(array.dtype), list(array.shape), array.ravel().tolist()]}


def config(ctx: Context, name: str, **values) -> dict:
    return {"servable_directory": ctx.servables_dir, "servable_name": name, **values}


def start(*names, **values):
    """Steps: start_servables of `names` (each with `values`), then gRPC and RESTful servers."""

    def steps(ctx: Context) -> list[dict]:
        return [
            {"call": "start_servables", "configs": [config(ctx, name, **values) for name in names]},
            {"call": "start_grpc_server", "address": ctx.grpc},
            {"call": "start_restful_server", "address": ctx.rest},
        ]

    return steps


def without_reason(_ctx: Context, seen: list[dict]) -> list[dict]:
    """REST observations without the reason phrase, which "rest: status line" observes alone."""
    return [{key: value for key, value in item.items() if key != "reason"} for item in seen]


def rest(path: str, body, method: str = "POST"):
    """A scenario's requests: one RESTful request (a body that is not a str is sent as JSON)."""

    def requests(ctx: Context) -> list[dict]:
        text = body if isinstance(body, str) or body is None else json.dumps(body)
        return [{"kind": "rest", "address": ctx.rest, "path": path, "body": text, "method": method}]

    return requests


def client(servable: str, method: str, instances, version: int | None = None, call: str = "infer", address=None):
    """One call of the target's own mindspore_serving.client.Client."""

    def requests(ctx: Context) -> list[dict]:
        args = [address or ctx.grpc, servable, method] + ([version] if version is not None else [])
        return [{"kind": "client", "args": args, "instances": instances, "call": call}]

    return requests


def grpc(request: dict, timeout: float = 60.0):
    """One hand-made PredictRequest (protobuf JSON) to the gRPC port."""

    def requests(ctx: Context) -> list[dict]:
        return [{"kind": "grpc", "address": ctx.grpc, "request": request, "timeout": timeout}]

    return requests


def tensor(dtype: str, shape: list[int], data: bytes) -> dict:
    return {"dtype": dtype, "shape": {"dims": [str(d) for d in shape]}, "data": base64.b64encode(data).decode()}


def predict(servable: str, method: str, instances: list[dict]) -> dict:
    return {
        "servableSpec": {"name": servable, "methodName": method},
        "instances": [{"items": items} for items in instances],
    }


def b64(array) -> str:
    return base64.b64encode(np.asarray(array).tobytes()).decode()


ADD_BODY = {"instances": [{"x1": X1, "x2": X2}]}

REST = [
    Scenario("rest: status line", rest("/model/add:add_common", ADD_BODY)),
    Scenario("rest: add_common", rest("/model/add:add_common", ADD_BODY)),
    Scenario(
        "rest: add_cast of ints",
        rest("/model/add:add_cast", {"instances": [{"x1": [1, 2, 3, 4], "x2": [5, 6, 7, 8]}]}),
    ),
    Scenario("rest: one instance as an object", rest("/model/add:add_common", {"instances": {"x1": X1, "x2": X2}})),
    Scenario("rest: three instances", rest("/model/add:add_common", {"instances": [{"x1": X1, "x2": X2}] * 3})),
    Scenario("rest: version in the url", rest("/model/add/version/1:add_common", ADD_BODY)),
    Scenario("rest: url without model", rest("/mod/add:add_common", ADD_BODY)),
    Scenario("rest: url without method", rest("/model/add", ADD_BODY)),
    Scenario("rest: url with an empty method", rest("/model/add:", ADD_BODY)),
    Scenario("rest: version not a number", rest("/model/add/version/abc:add_common", ADD_BODY)),
    Scenario("rest: negative version", rest("/model/add/version/-1:add_common", ADD_BODY)),
    Scenario("rest: version not served", rest("/model/add/version/9:add_common", ADD_BODY)),
    Scenario("rest: version with a numeric prefix", rest("/model/add/version/1abc:add_common", ADD_BODY)),
    Scenario("rest: a query string after the method", rest("/model/add:add_common?x=1", ADD_BODY)),
    Scenario("rest: 'model' twice in the url", rest("/model/add/model/other:add_common", ADD_BODY)),
    Scenario("rest: a prefix before /model", rest("/api/model/add:add_common", ADD_BODY)),
    Scenario("rest: unknown servable", rest("/model/nope:add_common", ADD_BODY)),
    Scenario("rest: unknown method", rest("/model/add:nope", ADD_BODY)),
    Scenario("rest: GET", rest("/model/add:add_common", None, method="GET")),
    Scenario("rest: empty body", rest("/model/add:add_common", "")),
    Scenario("rest: empty body and a bad url", rest("/mod/add", "")),
    Scenario("rest: body not JSON", rest("/model/add:add_common", "{not json")),
    Scenario("rest: no instances key", rest("/model/add:add_common", {"x1": X1})),
    Scenario("rest: instances twice", rest("/model/add:add_common", '{"instances": [], "instances": []}')),
    Scenario("rest: a JSON array body", rest("/model/add:add_common", [1, 2])),
    Scenario("rest: empty instances", rest("/model/add:add_common", {"instances": []})),
    Scenario("rest: instances a number", rest("/model/add:add_common", {"instances": 1})),
    Scenario("rest: instances an empty object", rest("/model/add:add_common", {"instances": {}})),
    Scenario(
        "rest: an instance that is a number",
        rest("/model/add:add_common", {"instances": [{"x1": X1, "x2": X2}, 1]}),
    ),
    Scenario("rest: an empty instance", rest("/model/add:add_common", {"instances": [{}]})),
    Scenario("rest: missing input", rest("/model/add:add_common", {"instances": [{"x1": X1}]})),
    Scenario("rest: extra input", rest("/model/add:add_common", {"instances": [{"x1": X1, "x2": X2, "x3": X1}]})),
    Scenario("rest: wrong size", rest("/model/add:add_common", {"instances": [{"x1": [1.0, 2.0, 3.0], "x2": X2}]})),
    Scenario(
        "rest: same size, other shape",
        rest("/model/add:add_common", {"instances": [{"x1": [1.0, 2.0, 3.0, 4.0], "x2": X2}]}),
    ),
    Scenario(
        "rest: ints to a float model",
        rest("/model/add:add_common", {"instances": [{"x1": [[1, 2], [3, 4]], "x2": X2}]}),
    ),
    Scenario(
        "rest: ragged array",
        rest("/model/add:add_common", {"instances": [{"x1": [[1.0, 2.0], [3.0]], "x2": X2}]}),
    ),
    Scenario(
        "rest: mixed int and float",
        rest("/model/add:add_common", {"instances": [{"x1": [[1.0, 2], [3.0, 4.0]], "x2": X2}]}),
    ),
    Scenario("rest: null value", rest("/model/add:add_common", {"instances": [{"x1": None, "x2": X2}]})),
    Scenario("rest: empty array", rest("/model/add:add_common", {"instances": [{"x1": [], "x2": X2}]})),
    Scenario("rest: array of empty arrays", rest("/model/add:add_common", {"instances": [{"x1": [[]], "x2": X2}]})),
    Scenario(
        "rest: b64 fp32",
        rest(
            "/model/add:add_common",
            {"instances": [{"x1": {"b64": b64(np.float32(X1)), "type": "fp32", "shape": [2, 2]}, "x2": X2}]},
        ),
    ),
    Scenario(
        "rest: b64 unknown type",
        rest(
            "/model/add:add_common",
            {"instances": [{"x1": {"b64": b64(np.float32(X1)), "type": "fp128", "shape": [2, 2]}, "x2": X2}]},
        ),
    ),
    Scenario(
        "rest: b64 not base64",
        rest(
            "/model/add:add_common", {"instances": [{"x1": {"b64": "!!!", "type": "fp32", "shape": [2, 2]}, "x2": X2}]}
        ),
    ),
    Scenario(
        "rest: b64 size not the shape's",
        rest(
            "/model/add:add_common",
            {"instances": [{"x1": {"b64": b64(np.float32([1, 2, 3])), "type": "fp32", "shape": [2, 2]}, "x2": X2}]},
        ),
    ),
    Scenario(
        "rest: b64 with an unknown key",
        rest("/model/add:add_common", {"instances": [{"x1": {"b64": "AAAA", "kind": "fp32"}, "x2": X2}]}),
    ),
    Scenario(
        "rest: b64 negative shape",
        rest(
            "/model/add:add_common", {"instances": [{"x1": {"b64": "AAAA", "type": "fp32", "shape": [-1]}, "x2": X2}]}
        ),
    ),
    Scenario(
        "rest: some instances fail",
        rest(
            "/model/add:add_common",
            {"instances": [{"x1": X1, "x2": X2}, {"x1": [1.0], "x2": X2}, {"x1": X1, "x2": X2}]},
        ),
    ),
    Scenario(
        "rest: every instance fails alike",
        rest("/model/add:add_common", {"instances": [{"x1": [1.0], "x2": X2}] * 2}),
    ),
    Scenario(
        "rest: strings, bools and ints through a Python stage",
        rest(
            "/model/add:echo",
            {"instances": [{"x": "text"}, {"x": True}, {"x": [1, 2]}, {"x": 7}, {"x": [[True, False]]}]},
        ),
    ),
    Scenario(
        "rest: bytes through a Python stage",
        rest("/model/add:echo", {"instances": [{"x": {"b64": base64.b64encode(b"\x00\x01ab").decode()}}]}),
    ),
    Scenario("rest: a string array", rest("/model/add:echo", {"instances": [{"x": ["a", "b"]}]})),
    Scenario("rest: Python scalars returned", rest("/model/add:scalars", {"instances": [{"x": 1}]})),
    Scenario(
        "rest: a stage raises for one instance",
        rest("/model/add:checked", {"instances": [{"x": [1.0]}, {"x": [-1.0]}, {"x": [2.0]}]}),
    ),
    Scenario("rest: a tagged stage raises", rest("/model/add:checked_tagged", {"instances": [{"x": [-1.0]}]})),
    Scenario(
        "rest: a batch_size stage",
        rest("/model/add:doubled", {"instances": [{"x": [1.0]}, {"x": [2.0]}, {"x": [3.0]}]}),
    ),
    Scenario(
        "rest: a batch_size stage of two outputs",
        rest("/model/add:sum_diff", {"instances": [{"a": [5.0], "b": [3.0]}, {"a": 1, "b": 2}]}),
    ),
    Scenario("rest: float output digits", rest("/model/add:echo", {"instances": [{"x": [0.1, 1e-7, 123456.789]}]})),
]

for _scenario in REST[1:]:
    _scenario.observe = without_reason

F32 = np.float32
CLIENT = [
    Scenario("client: add_common", client("add", "add_common", [{"x1": nd(F32(X1)), "x2": nd(F32(X2))}])),
    Scenario("client: one instance as a dict", client("add", "add_common", {"x1": nd(F32(X1)), "x2": nd(F32(X2))})),
    Scenario(
        "client: add_cast of int64",
        client("add", "add_cast", [{"x1": nd(np.int64(X1)), "x2": nd(np.int64(X2))}]),
    ),
    Scenario("client: wrong size", client("add", "add_common", [{"x1": nd(F32([1, 2, 3])), "x2": nd(F32(X2))}])),
    Scenario(
        "client: int32 to a float model",
        client("add", "add_common", [{"x1": nd(np.int32(X1)), "x2": nd(F32(X2))}]),
    ),
    Scenario(
        "client: some instances fail",
        client("add", "add_common", [{"x1": nd(F32(X1)), "x2": nd(F32(X2))}, {"x1": nd(F32([1])), "x2": nd(F32(X2))}]),
    ),
    Scenario("client: unknown servable", client("nope", "add_common", [{"x1": nd(F32(X1)), "x2": nd(F32(X2))}])),
    Scenario("client: unknown method", client("add", "nope", [{"x1": nd(F32(X1)), "x2": nd(F32(X2))}])),
    Scenario(
        "client: version not served",
        client("add", "add_common", [{"x1": nd(F32(X1)), "x2": nd(F32(X2))}], version=9),
    ),
    Scenario("client: missing input", client("add", "add_common", [{"x1": nd(F32(X1))}])),
    Scenario("client: a list input", client("add", "echo", [{"x": [[True, True], [True]]}])),
    Scenario("client: a rectangular list input", client("add", "echo", [{"x": [[1.0, 2.0]]}])),
    Scenario("client: a string numpy array", client("add", "echo", [{"x": nd(np.array(["ab", "c"]))}])),
    Scenario("client: Python scalars", client("add", "echo", [{"x": 3}, {"x": 2.5}, {"x": True}])),
    Scenario(
        "client: str and bytes",
        client("add", "echo", [{"x": "text"}, {"x": {"__bytes__": base64.b64encode(b"\x00ab").decode()}}]),
    ),
    Scenario("client: numpy scalar", client("add", "echo", [{"x": {"__np__": ["float32", 1.5]}}])),
    Scenario("client: an instance that is not a dict", client("add", "echo", [1])),
    Scenario("client: None instances", client("add", "echo", None)),
    Scenario(
        "client: a stage raises for one instance",
        client("add", "checked", [{"x": nd(F32([1]))}, {"x": nd(F32([-1]))}]),
    ),
    Scenario(
        "client: a batch_size stage",
        client("add", "doubled", [{"x": nd(F32([1]))}, {"x": nd(F32([2]))}, {"x": nd(F32([3]))}]),
    ),
    Scenario("client: Python scalars returned", client("add", "scalars", [{"x": nd(F32([1]))}])),
    Scenario(
        "client: infer_async",
        client("add", "add_common", [{"x1": nd(F32(X1)), "x2": nd(F32(X2))}], call="infer_async"),
    ),
    Scenario("client: version -1", client("add", "add_common", [], version=-1)),
    Scenario(
        "client: version a bool",
        client("add", "add_common", [{"x1": nd(F32(X1)), "x2": nd(F32(X2))}], version=True),
    ),
]

RAW_GRPC = [
    Scenario("grpc: no instances", grpc(predict("add", "add_common", []), timeout=5.0)),
    Scenario("grpc: unknown servable", grpc(predict("nope", "add_common", [{}]))),
    Scenario(
        "grpc: data size not the shape's",
        grpc(
            predict(
                "add",
                "add_common",
                [{"x1": tensor("MS_FLOAT32", [2, 2], b"\0" * 12), "x2": tensor("MS_FLOAT32", [2, 2], b"\0" * 16)}],
            )
        ),
    ),
    Scenario(
        "grpc: negative dim",
        grpc(
            predict(
                "add",
                "add_common",
                [{"x1": tensor("MS_FLOAT32", [-1, 4], b"\0" * 16), "x2": tensor("MS_FLOAT32", [2, 2], b"\0" * 16)}],
            )
        ),
    ),
    Scenario(
        "grpc: unknown dtype",
        grpc(
            predict(
                "add",
                "add_common",
                [{"x1": tensor("MS_UNKNOWN", [2, 2], b"\0" * 16), "x2": tensor("MS_FLOAT32", [2, 2], b"\0" * 16)}],
            )
        ),
    ),
    Scenario(
        "grpc: a string of shape [2]",
        grpc(
            predict(
                "add",
                "echo",
                [
                    {
                        "x": {
                            "dtype": "MS_STRING",
                            "shape": {"dims": ["2"]},
                            "bytesVal": [base64.b64encode(b"a").decode(), base64.b64encode(b"b").decode()],
                        }
                    }
                ],
            )
        ),
    ),
]


def output_lines(*needles):
    """A scenario observing the server's output lines holding one of `needles`."""
    return lambda ctx, _: log_lines(ctx.output, *needles)


BASIC = Group(
    "basic",
    ADD,
    start("add"),
    [
        Scenario("start-up: start_servables, gRPC and RESTful", observe=lambda ctx, _: ctx.steps),
        *REST,
        *CLIENT,
        *RAW_GRPC,
        Scenario("logs: start-up lines at the default level", observe=output_lines("start success", "listening on")),
        Scenario("logs: worker log files", observe=lambda ctx, _: sorted(ctx.log_files())),
    ],
)


def start_failure(*steps_of):
    """A group of one start-up scenario: the steps' outcomes and the server's [ERROR] lines."""

    def steps(ctx):
        return [step for make in steps_of for step in make(ctx)]

    return steps


def servables_step(*configs):
    return lambda ctx: [
        {"call": "start_servables", "configs": [config(ctx, name, **values) for name, values in configs]}
    ]


def server_step(call, address, **values):
    return lambda ctx: [{"call": call, "address": address(ctx), **values}]


def refusal(name: str, servables: dict, *steps_of, env=None) -> Group:
    return Group(
        name.replace(" ", "_"),
        servables,
        start_failure(*steps_of),
        [
            Scenario(f"start-up: {name}", observe=lambda ctx, _: ctx.steps),
            Scenario(f"logs: {name}: error lines", observe=output_lines("[ERROR]", "[EXCEPTION]")),
        ],
        env=env or {},
        serve=False,
    )


ADD_ONLY = servables_step(("add", {}))
GRPC = lambda ctx: ctx.grpc  # noqa: E731
REST_ADDRESS = lambda ctx: ctx.rest  # noqa: E731

STARTUP = [
    refusal(
        "gRPC server started twice",
        ADD,
        ADD_ONLY,
        server_step("start_grpc_server", GRPC),
        server_step("start_grpc_server", GRPC),
    ),
    refusal(
        "RESTful server started twice",
        ADD,
        ADD_ONLY,
        server_step("start_restful_server", REST_ADDRESS),
        server_step("start_restful_server", REST_ADDRESS),
    ),
    refusal(
        "gRPC on the RESTful server's address",
        ADD,
        ADD_ONLY,
        server_step("start_restful_server", REST_ADDRESS),
        server_step("start_grpc_server", REST_ADDRESS),
    ),
    refusal(
        "RESTful on the gRPC server's address",
        ADD,
        ADD_ONLY,
        server_step("start_grpc_server", GRPC),
        server_step("start_restful_server", GRPC),
    ),
    refusal("gRPC address without a port", ADD, ADD_ONLY, server_step("start_grpc_server", lambda ctx: "127.0.0.1")),
    refusal(
        "gRPC address without an ip", ADD, ADD_ONLY, server_step("start_grpc_server", lambda ctx: f":{EXAMPLE_PORT}")
    ),
    refusal(
        "gRPC port out of range", ADD, ADD_ONLY, server_step("start_grpc_server", lambda ctx: f"127.0.0.1:{65535 + 1}")
    ),
    refusal("gRPC port not a number", ADD, ADD_ONLY, server_step("start_grpc_server", lambda ctx: "127.0.0.1:ab")),
    refusal(
        "RESTful on a unix socket", ADD, ADD_ONLY, server_step("start_restful_server", lambda ctx: "unix:rest.sock")
    ),
    refusal("gRPC unix socket without a path", ADD, ADD_ONLY, server_step("start_grpc_server", lambda ctx: "unix:")),
    refusal("gRPC message size 0", ADD, ADD_ONLY, server_step("start_grpc_server", GRPC, max_msg_mb_size=0)),
    refusal(
        "RESTful message size 513",
        ADD,
        ADD_ONLY,
        server_step("start_restful_server", REST_ADDRESS, max_msg_mb_size=513),
    ),
    refusal("servable directory missing", ADD, servables_step(("nope", {}))),
    refusal("servable_config.py missing", {"add": {}, "no_config": {}}, servables_step(("no_config", {}))),
    refusal("version number -1", ADD, servables_step(("add", {"version_number": -1}))),
    refusal("version folder missing", ADD, servables_step(("add", {"version_number": 3}))),
    refusal("device ids repeated", ADD, servables_step(("add", {"device_ids": [0, 0]}))),
    refusal("num_parallel_workers 65", ADD, servables_step(("add", {"num_parallel_workers": 65}))),
    refusal("device type unknown", ADD, servables_step(("add", {"device_type": "TPU"}))),
    refusal("device type GPU", ADD, servables_step(("add", {"device_type": "GPU"}))),
    refusal("dec_mode unknown", ADD, servables_step(("add", {"dec_mode": "AES-XYZ"}))),
    refusal("batch_size given in one add_stage only", {"bad_batch": {}}, servables_step(("bad_batch", {}))),
    refusal("method registered twice", {"dup_method": {}}, servables_step(("dup_method", {}))),
    refusal("servable_config.py fails to import", {"import_error": {}}, servables_step(("import_error", {}))),
    refusal("model declared without a version folder", {"no_version": {}}, servables_step(("no_version", {}))),
    refusal(
        "a function stage given more inputs than it takes", {"reg_arg_count": {}}, servables_step(("reg_arg_count", {}))
    ),
    refusal("a method returning a constant", {"reg_return": {}}, servables_step(("reg_return", {}))),
    refusal("add_stage of a number", {"reg_stage_type": {}}, servables_step(("reg_stage_type", {}))),
    refusal(
        "one model file declared twice",
        {"reg_model_twice": {"1": ["tensor_add.mindir"]}},
        servables_step(("reg_model_twice", {})),
    ),
    refusal(
        "model format ONNX",
        {"reg_model_format": {"1": ["tensor_add.mindir"]}},
        servables_step(("reg_model_format", {})),
    ),
    refusal("a method taking *args", {"reg_varargs": {}}, servables_step(("reg_varargs", {}))),
    refusal(
        "three inputs to a model of two",
        {"reg_model_inputs": {"1": ["tensor_add.mindir"]}},
        servables_step(("reg_model_inputs", {})),
    ),
    refusal("output names repeated", {"reg_output_names": {}}, servables_step(("reg_output_names", {}))),
    refusal("batch_size -1", {"reg_batch_negative": {}}, servables_step(("reg_batch_negative", {}))),
    refusal(
        "two versions of one servable on one device",
        {"add": {"1": ["tensor_add.mindir"], "2": ["tensor_add.mindir"]}},
        servables_step(
            ("add", {"version_number": 1, "device_ids": 0}), ("add", {"version_number": 2, "device_ids": 0})
        ),
    ),
    refusal(
        "two servables on one device",
        {**ADD, "add2": {"from": "add", "1": ["tensor_add.mindir"]}},
        servables_step(("add", {"device_ids": 0}), ("add2", {"device_ids": 0})),
    ),
]


def worker_lines(*needles):
    """A scenario observing the worker log files' lines holding one of `needles`: file name -> lines."""
    return lambda ctx, _: {name: log_lines(text, *needles) for name, text in ctx.log_files().items()}


def time_cost_lines(ctx, _):
    """How many `WorkerRequestHandle Time Cost` lines the worker logs wrote, and the first as `[LEVEL] text`."""
    lines = [line for text in ctx.log_files().values() for line in log_lines(text, "WorkerRequestHandle Time Cost")]
    return {"count": len(lines), "first": lines[:1]}


INFO = Group(
    "info_logs",
    ADD,
    start("add"),
    [
        Scenario("logs: GLOG_v=1: start-up lines", observe=output_lines("start success", "listening on")),
        Scenario(
            "logs: GLOG_v=1: a time-cost line per master-to-worker call",
            rest("/model/add:add_common", {"instances": [{"x1": X1, "x2": X2}] * 3}),
            observe=time_cost_lines,
        ),
        Scenario(
            "logs: worker log lines at start-up",
            observe=worker_lines("Serving: Worker gRPC server", "Serving: Start servable success"),
        ),
    ],
    env={"GLOG_v": "1"},
)


def tls_files(ctx: Context) -> dict:
    """A CA, a server certificate and a key that is not its key (the client's), under the run directory."""
    folder = os.path.join(ctx.run_dir, "certs")
    os.makedirs(folder, exist_ok=True)
    names = make_certs(folder)
    return {"certificate": names["server.crt"], "private_key": names["client.key"]}


def tls_refusal(call: str, address):
    def steps(ctx):
        return [
            {"call": "start_servables", "configs": [config(ctx, "add")]},
            {"call": "ssl_config", **tls_files(ctx)},
            {"call": call, "address": address(ctx)},
        ]

    return steps


TLS = [
    Group(
        f"tls_{call}",
        ADD,
        tls_refusal(call, GRPC if call == "start_grpc_server" else REST_ADDRESS),
        [
            Scenario(f"start-up: {call} with a key not its certificate's", observe=lambda ctx, _: ctx.steps),
        ],
        serve=False,
    )
    for call in ("start_grpc_server", "start_restful_server")
]


def kill_worker(ctx: Context) -> None:
    """SIGKILL to the servable's worker process (a child of the server running target_server.py)."""
    for child in psutil.Process(ctx.pid).children(recursive=True):
        if any("worker" in part for part in child.cmdline()):
            child.kill()
            child.wait(10)
            return
    raise AssertionError("no worker process found")


def after_kill(ctx: Context) -> list[dict]:
    """A request just after the worker was killed, then one every 0.5 s until one is served (at most 20)."""
    one = {"kind": "rest", "address": ctx.rest, "path": "/model/add:add_common", "body": json.dumps(ADD_BODY)}
    return [one] + [dict(one, sleep=0.5, until_served=True)] * 20


def restart_observation(_ctx, seen):
    first = without_reason(_ctx, seen[:1])[0]
    recovered = next((i for i, item in enumerate(seen[1:]) if "instances" in item.get("json", {})), None)
    return {"first request": first, "served again within 10 s": recovered is not None}


KILLED = Group(
    "killed_worker",
    ADD,
    start("add"),
    [
        Scenario(
            "faults: a request before the kill",
            rest("/model/add:add_common", ADD_BODY),
            observe=without_reason,
        ),
        Scenario(
            "faults: requests while a killed worker restarts",
            after_kill,
            observe=restart_observation,
            before=kill_worker,
        ),
    ],
)


def grpc_error_head(_ctx, seen):
    """The client's observations with a gRPC error cut after its status (grpc's own details vary by version)."""
    cut = []
    for item in seen:
        result = item.get("result")
        if isinstance(result, dict) and str(result.get("error", "")).startswith("Grpc Error"):
            item = dict(item, result={"error": result["error"].split("), ")[0] + ")"})
            item.pop("printed", None)
        cut.append(item)
    return cut


def small_limits(ctx: Context) -> list[dict]:
    return [
        {"call": "start_servables", "configs": [config(ctx, "add")]},
        {"call": "start_grpc_server", "address": ctx.grpc, "max_msg_mb_size": 1},
        {"call": "start_restful_server", "address": ctx.rest, "max_msg_mb_size": 1},
    ]


BIG = nd(np.zeros((600, 600), np.float32))
LIMITS = Group(
    "limits",
    ADD,
    small_limits,
    [
        Scenario(
            "rest: a body over max_msg_mb_size",
            rest("/model/add:add_common", '{"instances": [{"x1": [' + "1.0," * 400000 + "1.0]}]}"),
            observe=without_reason,
        ),
        Scenario(
            "client: a message over max_msg_mb_size",
            client("add", "add_common", {"x1": BIG, "x2": BIG}),
            observe=grpc_error_head,
        ),
        Scenario(
            "client: no server at the address",
            lambda ctx: client("add", "add_common", {"x1": BIG}, address=f"127.0.0.1:{free_port()}")(ctx),
            observe=grpc_error_head,
        ),
        Scenario(
            "client: served after a refused message",
            client("add", "add_common", {"x1": nd(F32(X1)), "x2": nd(F32(X2))}),
        ),
    ],
)

QUIET = Group(
    "errors_only",
    ADD,
    start("add"),
    [
        Scenario(
            "logs: GLOG_v=3: the master's lines",
            observe=lambda ctx, _: [
                line for line in log_lines(ctx.output, "") if line.startswith(("[INFO]", "[WARNING]", "[DEBUG]"))
            ],
        ),
        Scenario("logs: GLOG_v=3: start-up lines", observe=output_lines("start success")),
    ],
    env={"GLOG_v": "3"},
)


def stop_lines(ctx, _):
    """The WARNING and ERROR lines the server wrote once SIGTERM reached it (at the default GLOG_v), and how it
    exited."""
    lines = log_lines(ctx.output, "[WARNING]", "[ERROR]")
    lines = [line for line in lines if "exit" in line.lower() or "signal" in line.lower()]
    # said once a second while the workers exit: how many depends on how fast they do
    lines = [line for line in lines if "Wait for all worker processes to exit" not in line]
    return {"lines": lines, "exit code": ctx.exit_code}


STOPPED = Group(
    "sigterm",
    ADD,
    start("add"),
    [Scenario("faults: SIGTERM: the lines at stop and the exit code", observe=stop_lines)],
)


def kill_and_wait(ctx: Context) -> None:
    kill_worker(ctx)
    time.sleep(3.0)  # ok-sleep: past MindSpore Serving's 1 s before it decides whether to restart a worker


def served_or_refused(_ctx, seen):
    item = seen[0]
    return {"served": "instances" in item.get("json", {}), "connection_error": item.get("connection_error")}


FIRST_KILLED = Group(
    "killed_before_serving",
    ADD,
    start("add"),
    [
        Scenario(
            "faults: a worker killed before its first request, a request 3 s later",
            rest("/model/add:add_common", ADD_BODY),
            observe=served_or_refused,
            before=kill_and_wait,
        )
    ],
)

LEGACY = Group(
    "legacy",
    {"legacy": {"1": ["tensor_add.mindir"]}},
    start("legacy"),
    [
        Scenario(
            "rest: the call_* interface",
            rest("/model/legacy:add_twice", {"instances": [{"x1": [[1, 2], [3, 4]], "x2": X2}]}),
            observe=without_reason,
        ),
        Scenario("logs: the call_* interface's deprecation warnings", observe=worker_lines("deprecated")),
    ],
)

WORKERS = Group(
    "worker_layout",
    {**ADD, "add2": {"from": "add", "1": ["tensor_add.mindir"]}},
    lambda ctx: [
        {
            "call": "start_servables",
            "configs": [
                config(ctx, "add", num_parallel_workers=2),
                config(ctx, "add2", device_ids=0, device_type="CPU"),
            ],
        },
        {"call": "start_grpc_server", "address": ctx.grpc},
        {"call": "start_restful_server", "address": ctx.rest},
    ],
    [
        Scenario(
            "logs: log files of two extra workers and a device worker",
            observe=lambda ctx, _: sorted(ctx.log_files()),
        ),
        Scenario("rest: a device worker on the CPU", rest("/model/add2:add_common", ADD_BODY), observe=without_reason),
        Scenario(
            "rest: two extra workers",
            rest("/model/add:add_cast", {"instances": [{"x1": X1, "x2": X2}] * 4}),
            observe=without_reason,
        ),
    ],
)

GROUPS = [BASIC, WORKERS, INFO, QUIET, LIMITS, *TLS, KILLED, FIRST_KILLED, STOPPED, LEGACY, *STARTUP]
