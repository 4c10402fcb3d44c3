"""The environment-variable reference: a table kept by hand (a variable's meaning is not in the code in a form a
generator can read), checked against the code by `variables_in_code`: every variable the package reads must be in
`VARIABLES`, and every name in `VARIABLES` must still occur in the package."""

import ast
import functools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from reference_gen.markdown import GENERATED_NOTE, cell, code, table

PACKAGE_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "mindspore_serving"
)

SERVER, LOGS, SECURITY, CHILD = "server", "logs", "security", "child"
GROUPS = {
    SERVER: ("Server", "Read by the master and its workers at start-up; set them in the server's environment."),
    LOGS: (
        "Logs",
        "MindSpore Serving's logging variables, read by every process of the server (master, workers, agents); "
        "a bad value stops the process at its first log line with MindSpore Serving's message.",
    ),
    SECURITY: (
        "Secrets and TLS of internal channels",
        "For servables whose processes run on several hosts; set the same group secret, and each host's own "
        "certificate, on every host of the group.",
    ),
    CHILD: (
        "Set by the server for the processes it starts",
        "Not for users to set: the server sets them in its child processes' environment, and user code may read them.",
    ),
}


@dataclass(frozen=True)
class Variable:
    name: str
    group: str
    default: str
    meaning: str


VARIABLES = (
    Variable(
        "MS_SERVING_API_KEY",
        SERVER,
        "unset: no key",
        "The key every request but the health probes must carry (`Authorization: Bearer <key>` or `x-api-key`); "
        "`--api_key` and `--api_key_file` win over it.",
    ),
    Variable(
        "MS_SERVING_BATCH_WAIT_MS",
        SERVER,
        "2",
        "Milliseconds a model stage's batch waits for instances known to be on their way before it runs partly "
        "filled (a lone request never waits).",
    ),
    Variable(
        "MS_SERVING_WORKER_SPIN_US",
        SERVER,
        "500",
        "Microseconds an idle Predict connection of a worker polls for its next call before it sleeps; 0: never polls.",
    ),
    Variable(
        "MS_SERVING_WORKER_START_TIMEOUT",
        SERVER,
        "600",
        "Seconds a worker has to start and register (model loading, warm-up, an LLM's graph export included).",
    ),
    Variable(
        "MS_SERVING_AGENT_START_TIMEOUT",
        SERVER,
        "600",
        "Seconds an LLM worker waits for its agents to load and warm up their graphs.",
    ),
    Variable(
        "MS_SERVING_GRPC_SERVER",
        SERVER,
        "h2grpc",
        "`grpcio`: serve the public gRPC port with grpcio's aio server instead of the built-in gRPC-over-HTTP/2 "
        "server.",
    ),
    Variable(
        "MS_SERVING_EVENT_LOOP",
        SERVER,
        "uvloop",
        "`asyncio`: run the master's and front ends' event loops on asyncio's loop instead of uvloop's.",
    ),
    Variable(
        "MS_SERVING_CLUSTER_REGISTER_TIMEOUT",
        SERVER,
        "30",
        "Seconds a tensor-parallel rank has to register with MindSpore's cluster scheduler before it is restarted.",
    ),
    Variable(
        "MS_SERVING_SCHEDULER_GLOG_v",
        SERVER,
        "3",
        "`GLOG_v` of MindSpore's own log in the cluster scheduler process (it reports the cluster's health every "
        "few seconds).",
    ),
    Variable("GLOG_v", LOGS, "2", "Log level: 0 DEBUG, 1 INFO, 2 WARNING, 3 ERROR. MindSpore reads it too."),
    Variable(
        "MS_SUBMODULE_LOG_v",
        LOGS,
        "",
        "`{SERVING:n}` sets this package's level apart from `GLOG_v` (other entries are MindSpore's); a malformed "
        "text is ignored with a warning.",
    ),
    Variable(
        "GLOG_logtostderr",
        LOGS,
        "1",
        "1: log to stderr. 0: write `<GLOG_log_dir>/mindspore_serving.log.<pid>`, one file per process.",
    ),
    Variable("GLOG_log_dir", LOGS, "", "An existing directory for the log files (required with GLOG_logtostderr=0)."),
    Variable(
        "GLOG_stderrthreshold",
        LOGS,
        "2",
        "With log files: records at this level (0-3, as GLOG_v) and above also go to stderr.",
    ),
    Variable("logger_maxBytes", LOGS, "52428800", "With log files: the size at which a file is rotated."),
    Variable("logger_backupCount", LOGS, "30", "With log files: the rotated files kept."),
    Variable(
        "MS_SERVING_AGENT_SECRET",
        SECURITY,
        "unset",
        "The secret of LLM agents on fixed ports (`start_agent.py`) and of their worker: the agents refuse a "
        "worker that does not carry it. Without it they take any worker that reaches them.",
    ),
    Variable(
        "MS_SERVING_DISTRIBUTED_SECRET",
        SECURITY,
        "unset",
        "The secret of a distributed servable's worker and rank agents, carried as metadata of every call. "
        "Without it (and without TLS) their ports must not be reachable beyond the host.",
    ),
    Variable(
        "MS_SERVING_AGENT_TLS_CERT",
        SECURITY,
        "unset",
        "With `_KEY` and `_CA`: this host's certificate (PEM) for mutual TLS between an LLM worker and its agents "
        "on TCP ports.",
    ),
    Variable("MS_SERVING_AGENT_TLS_KEY", SECURITY, "unset", "The private key (PEM) of that certificate."),
    Variable("MS_SERVING_AGENT_TLS_CA", SECURITY, "unset", "The group's CA (PEM), which signed every host's."),
    Variable(
        "MS_SERVING_DISTRIBUTED_TLS_CERT",
        SECURITY,
        "unset",
        "With `_KEY` and `_CA`: this host's certificate (PEM) for mutual TLS between a distributed worker and its "
        "rank agents.",
    ),
    Variable("MS_SERVING_DISTRIBUTED_TLS_KEY", SECURITY, "unset", "The private key (PEM) of that certificate."),
    Variable("MS_SERVING_DISTRIBUTED_TLS_CA", SECURITY, "unset", "The group's CA (PEM), which signed every host's."),
    Variable(
        "MS_SERVING_CLUSTER_SSL_CONFIG",
        SECURITY,
        "unset",
        "MindSpore's SSL JSON (`server_cert_path`, `client_cert_path`: PKCS#12; `ca_cert_path`: PEM): turns on "
        "MindSpore's own TLS for the cluster scheduler, the ranks and their collectives.",
    ),
    Variable(
        "MS_SERVING_CLUSTER_SERVER_PASSWORD", SECURITY, "", "The server PKCS#12 file's password (required with it)."
    ),
    Variable(
        "MS_SERVING_CLUSTER_CLIENT_PASSWORD", SECURITY, "", "The client PKCS#12 file's password (required with it)."
    ),
    Variable(
        "SERVING_DEVICE_ID",
        CHILD,
        "",
        "The device id of the worker that imports `servable_config.py` (MindSpore Serving's variable).",
    ),
    Variable(
        "MS_ROLE",
        CHILD,
        "",
        "MindSpore's cluster role (`MS_SCHED`, `MS_WORKER`) of the scheduler and rank processes of a "
        "tensor-parallel group.",
    ),
    Variable(
        "MS_SERVING_SCHEDULER_PARENT",
        CHILD,
        "",
        "The pid of the process that started the cluster scheduler, which exits when that process is gone.",
    ),
    Variable(
        "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION",
        CHILD,
        "",
        "`python` (which MindSpore sets when it is imported) is removed in the server's processes, so they keep "
        "the compiled protobuf.",
    ),
)

# ---- what the code reads ----

_OURS = re.compile(r"^(MS_SERVING_[A-Za-z0-9_]+|MS_SUBMODULE_LOG_v|GLOG_[A-Za-z_]+|logger_[A-Za-z]+)$")
_READERS = ("duration_seconds",)  # helpers whose first argument is a variable's name


def _python_files(package_dir: str) -> Iterator[str]:
    for directory, _dirs, files in os.walk(package_dir):
        for name in sorted(files):
            if name.endswith(".py") and not name.endswith(("_pb2.py", "_pb2_grpc.py")):
                yield os.path.join(directory, name)


def _is_environ(node: ast.expr) -> bool:
    """`os.environ`, or a name `environ` (a mapping parameter that defaults to it)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _read_arguments(tree: ast.AST) -> Iterator[ast.expr]:
    """The name expressions of environment reads: environ.get(X), os.getenv(X), environ[X], duration_seconds(X)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and _is_environ(func.value):
                yield node.args[0]
            elif isinstance(func, ast.Attribute) and func.attr == "getenv":
                yield node.args[0]
            elif isinstance(func, ast.Name) and func.id in _READERS:
                yield node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            yield node.slice


_CONSTANT = re.compile(r'^([A-Za-z_]\w*) = "([^"\\]*)"', re.M)  # a module-level NAME = "text"
_LITERAL = re.compile(r'"([A-Za-z_]\w*)"')
_READ_TOKENS = ("environ", "getenv", *_READERS)


@functools.lru_cache(maxsize=4)
def _sources(package_dir: str) -> tuple[str, ...]:
    """The text of every module of the package but the generated protobuf ones; read once."""
    texts = []
    for path in _python_files(package_dir):
        with open(path, encoding="utf-8") as stream:
            texts.append(stream.read())
    return tuple(texts)


@functools.lru_cache(maxsize=4)
def variables_in_code(package_dir: str = PACKAGE_DIR) -> tuple[frozenset[str], frozenset[str]]:
    """(names read, name literals): the variables read through the calls above whose name is a literal or a module
    constant, and every literal of the package's own variable families (MS_SERVING_*, GLOG_*, logger_*), which
    also finds names read through a loop or built from a prefix (`<PREFIX>_CERT`). Only the modules that mention a
    reader are parsed."""
    texts = _sources(package_dir)
    every_constant: dict[str, set[str]] = {}  # a constant's name -> its values in every module
    for text in texts:
        for name, value in _CONSTANT.findall(text):
            every_constant.setdefault(name, set()).add(value)
    read, literals = set(), set()
    for text in texts:
        literals.update(name for name in _LITERAL.findall(text) if _OURS.match(name))
        if not any(token in text for token in _READ_TOKENS):
            continue
        local = dict(_CONSTANT.findall(text))
        for arg in _read_arguments(ast.parse(text)):
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                read.add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in local:
                read.add(local[arg.id])
            elif isinstance(arg, ast.Attribute) and arg.attr in every_constant:
                read |= every_constant[arg.attr]
    return frozenset(read), frozenset(literals)


def undocumented(package_dir: str = PACKAGE_DIR) -> list[str]:
    """Variables the code reads (or names) that the table lacks; a literal that is a prefix of documented names
    (`MS_SERVING_AGENT_TLS` of `MS_SERVING_AGENT_TLS_CERT`) counts as documented."""
    names = {v.name for v in VARIABLES}
    read, literals = variables_in_code(package_dir)
    missing = {name for name in read if name not in names}
    missing |= {name for name in literals if name not in names and not any(n.startswith(name + "_") for n in names)}
    return sorted(missing)


def stale(package_dir: str = PACKAGE_DIR) -> list[str]:
    """Documented variables whose name (or a prefix of it) no longer occurs in the package."""
    read, literals = variables_in_code(package_dir)
    known = read | literals
    text = "".join(_sources(package_dir))
    return sorted(
        v.name
        for v in VARIABLES
        if v.name not in known and not any(v.name.startswith(k + "_") for k in known) and f'"{v.name}"' not in text
    )


def render() -> str:
    parts = [
        GENERATED_NOTE,
        "# Environment variables\n",
        "Every environment variable the package reads. Durations that are not numbers stop the process with an "
        "error that names the variable.\n",
    ]
    for group, (title, intro) in GROUPS.items():
        parts.append(f"## {title}\n\n{intro}\n")
        rows = ([code(v.name), cell(v.default), cell(v.meaning)] for v in VARIABLES if v.group == group)
        parts.append(table(["variable", "default", "meaning"], rows))
    return "\n".join(parts)
