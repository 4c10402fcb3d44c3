"""Peer for bench/classic.py: the original MindSpore Serving 2.0.2 serving `add` and `dense_batch` on the CPU
through MindSpore Lite, as orig_ms_setup.py built it (run that first).

    $ORIG_MS_BASE/venv/bin/python bench/peers/orig_ms_serve.py --grpc-port P --rest-port Q [--servables add]

Its C++ master serves gRPC and RESTful on 127.0.0.1; each servable gets one worker process (on the CPU the
original holds no device, so it runs them as its "extra" workers) that runs the model in Lite. The original writes
serving_logs/, unix_socket_files/ and models_build_temp/ into its working directory: --run-dir (default a
temporary folder). Once both servers listen it prints
    ORIG_MS_READY grpc=HOST:P rest=HOST:Q
and serves until SIGTERM or SIGINT, which the original's own handler turns into a clean stop; its workers are in
this process's group.

The worker dlopens libmindspore-lite.so through the loader's search path, which the loader reads only when a
process starts: without the Lite folder on LD_LIBRARY_PATH this script puts it there and executes itself again.
"""

import argparse
import os
import sys
import tempfile
import time

LITE_LIB = os.path.join(sys.prefix, "lite", "lib")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--rest-port", type=int, required=True)
    parser.add_argument("--servables", default="add,dense_batch")
    parser.add_argument("--servables-dir", default=os.path.join(os.path.dirname(sys.prefix), "servables"))
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()

    search = [path for path in os.environ.get("LD_LIBRARY_PATH", "").split(":") if path]
    if LITE_LIB not in search:
        if not os.path.isfile(os.path.join(LITE_LIB, "libmindspore-lite.so")):
            sys.exit(
                f"{LITE_LIB}/libmindspore-lite.so is missing: run bench/peers/orig_ms_setup.py and start this "
                f"script with the python of the venv it built"
            )
        os.environ["LD_LIBRARY_PATH"] = ":".join([LITE_LIB] + search)
        os.execv(sys.executable, [sys.executable] + sys.argv)

    servables_dir = os.path.abspath(args.servables_dir)
    os.chdir(args.run_dir or tempfile.mkdtemp(prefix="orig_ms_run_"))
    from mindspore_serving import server
    from mindspore_serving._mindspore_serving import ExitSignalHandle_

    server.start_servables(
        [
            server.ServableStartConfig(servable_directory=servables_dir, servable_name=name, device_type="CPU")
            for name in args.servables.split(",")
            if name
        ],
        enable_lite=True,
    )
    grpc_address, rest_address = f"{args.host}:{args.grpc_port}", f"{args.host}:{args.rest_port}"
    server.start_grpc_server(grpc_address)
    server.start_restful_server(rest_address)
    print(f"ORIG_MS_READY grpc={grpc_address} rest={rest_address}", flush=True)
    try:
        while not ExitSignalHandle_.has_stopped():  # set by the original's SIGINT/SIGTERM handler
            time.sleep(0.1)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
