"""One server of a comparison scenario, run by the interpreter of the serving under test (ours, or MindSpore
Serving 2.0.2's Python 3.9 venv): the same calls of the `mindspore_serving.server` API in both.

    python target_server.py SPEC.json STEPS.jsonl

SPEC holds `steps`, run in order, each a call and its arguments:

    {"call": "start_servables", "configs": [{"servable_directory": ..., "servable_name": ..., ...}],
     "enable_lite": true}
    {"call": "start_grpc_server", "address": "127.0.0.1:P", ...keyword arguments}
    {"call": "start_restful_server", "address": "127.0.0.1:Q", ...}
    {"call": "ssl_config", "certificate": ..., "private_key": ..., "custom_ca": ..., "verify_client": false}
        (the SSLConfig the next start_*_server call gets)

and `serve` (default true). Each step's outcome is written to STEPS as one line, `COMPAT_STEP {"call": ..., "ok":
true}` or `COMPAT_STEP {"call": ..., "error": "RuntimeError", "text": ...}` (a file of its own: the servers write
their lines to stdout from their own threads); a failed step ends the steps. Then, when every
step passed (or failed with `"then_serve": true`) and `serve` is true, `COMPAT_READY` is written and the script ends
there, as a user's does, and the server serves until SIGTERM or SIGINT (its own handler); otherwise
`server.stop()` runs and the process exits. The working directory is the server's (serving_logs/,
unix_socket_files/ are written there). Python 3.9: MindSpore Serving's venv runs this file too.
"""

import json
import sys

from mindspore_serving import server

_STEPS = []


def _print(tag, data=None):
    with open(_STEPS[0], "a", encoding="utf-8") as stream:
        stream.write(tag + ("" if data is None else " " + json.dumps(data, sort_keys=True)) + "\n")


def _run(step, ssl):
    call = step["call"]
    kwargs = {key: value for key, value in step.items() if key not in ("call", "then_serve")}
    if call == "start_servables":
        configs = [server.ServableStartConfig(**config) for config in kwargs.pop("configs")]
        server.start_servables(configs, **kwargs)
    elif call in ("start_grpc_server", "start_restful_server"):
        if ssl:
            kwargs["ssl_config"] = ssl.pop()
        getattr(server, call)(**kwargs)
    elif call == "ssl_config":
        ssl.append(server.SSLConfig(**kwargs))
    elif call == "stop":
        server.stop()
    else:
        raise ValueError("unknown call " + call)


def main():
    with open(sys.argv[1], encoding="utf-8") as stream:
        spec = json.load(stream)
    _STEPS.append(sys.argv[2])
    ssl = []
    for step in spec["steps"]:
        try:
            _run(step, ssl)
        except Exception as err:  # the scenario observes it
            _print("COMPAT_STEP", {"call": step["call"], "error": type(err).__name__, "text": str(err)})
            if step.get("then_serve"):
                continue
            server.stop()
            _print("COMPAT_DONE")
            return
        _print("COMPAT_STEP", {"call": step["call"], "ok": True})
    if not spec.get("serve", True):
        server.stop()
        _print("COMPAT_DONE")
        return
    # as a user's script does: it ends here, and the server serves on until SIGTERM or SIGINT
    _print("COMPAT_READY")


if __name__ == "__main__":
    main()
