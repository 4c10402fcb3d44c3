"""Builds the original MindSpore Serving 2.0.2 (its C++ master and worker, MindSpore Lite 2.0.0 as the CPU backend)
for bench/classic.py to measure beside ours, all from PyPI, under ORIG_MS_BASE (default ${TMPDIR:-/tmp}/orig-ms).

    python bench/peers/orig_ms_setup.py          # about 2 minutes and 1.1 GB of downloads the first time
    python bench/peers/orig_ms_setup.py --check  # prints its python and exits 0 when the build is complete

Each step is skipped when its result is there, so a second run takes a second. What it builds, and why:
- BASE/venv: CPython 3.9 (pyenv's, or PY39=...) with mindspore-serving 2.0.2, grpcio 1.47.0 (the wheel's cap),
  protobuf 3.20.3 (its generated modules predate protobuf 4), numpy 1.23.5 (its client uses np.bool, gone in 1.24)
  and packaging (imported by its server, not declared).
- BASE/venv/lite/lib: the native libraries of the mindspore-lite 2.0.0 wheel. PyPI has that release for CPython 3.7
  only, and the original uses only Lite's C++ libraries, which do not depend on the Python version; the cp37
  binding module is left out.
- BASE/venv/lite/lib/libmindspore-lite.so, the name the original's worker dlopens: the wheel calls its runtime
  libmindspore-extendrt_python.so, and Lite finds its MindIR converter plugin from the file name of the library it
  runs in, so a symlink fails ("Get path of libruntime_convert_plugin.so failed") where a library that only needs
  the real one works. It is compiled from an empty C file (apt-get installs gcc when no compiler is found).
- BASE/servables/{add,dense_batch}: servable_config.py (bench/peers/orig_ms_add/, bench/servables/dense_batch/) and
  the models exported with MindSpore 2.0.0 in a temporary venv (bench/peers/orig_ms_export.py), removed afterwards.
- a check that the original picks Lite on the CPU (Worker_.get_device_type("cpu", True) == "Cpu").
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PEERS = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(PEERS)
BASE = os.environ.get("ORIG_MS_BASE") or os.path.join(os.environ.get("TMPDIR") or tempfile.gettempdir(), "orig-ms")
VENV = os.path.join(BASE, "venv")
PYTHON = os.path.join(VENV, "bin", "python")
LITE_LIB = os.path.join(VENV, "lite", "lib")
SERVABLES = os.path.join(BASE, "servables")
MODELS = {"add": "tensor_add.mindir", "dense_batch": "dense_batch.mindir"}
CONFIGS = {
    "add": os.path.join(PEERS, "orig_ms_add", "servable_config.py"),
    "dense_batch": os.path.join(BENCH, "servables", "dense_batch", "servable_config.py"),
}
SERVING_PINS = [
    "mindspore-serving==2.0.2",
    "grpcio==1.47.0",
    "protobuf==3.20.3",
    "numpy==1.23.5",
    "psutil",
    "packaging",
]
EXPORT_PINS = ["mindspore==2.0.0", "numpy==1.23.5", "protobuf==3.20.3", "pillow<10", "scipy<1.12"]
PIP = ["-m", "pip", "install", "-q", "--disable-pip-version-check"]


def say(text: str):
    print(f"[orig_ms] {text}", flush=True)


def python39() -> str:
    if os.environ.get("PY39"):
        return os.environ["PY39"]
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    versions = os.path.join(root, "versions")
    found = sorted(v for v in (os.listdir(versions) if os.path.isdir(versions) else []) if v.startswith("3.9."))
    if not found:
        sys.exit("orig_ms_setup: no CPython 3.9 found (pyenv install 3.9, or set PY39=/path/to/python3.9)")
    return os.path.join(versions, found[-1], "bin", "python3.9")


def run(*command, **kwargs):
    subprocess.run(list(command), check=True, **kwargs)


def serving_venv_ok() -> bool:
    return (
        os.path.exists(PYTHON)
        and subprocess.run(
            [
                PYTHON,
                "-c",
                "import mindspore_serving.server, packaging, numpy; assert int(numpy.__version__.split('.')[1]) < 24",
            ],
            capture_output=True,
            cwd=BASE,
        ).returncode
        == 0
    )  # not where this project's own mindspore_serving could be imported instead


def build_serving_venv():
    say(f"creating {VENV}: {' '.join(SERVING_PINS)}")
    if not os.path.exists(PYTHON):
        run(python39(), "-m", "venv", VENV)
    run(PYTHON, *PIP, *SERVING_PINS)


def lite_ok() -> bool:
    return os.path.isfile(os.path.join(LITE_LIB, "libmindspore-extendrt_python.so"))


def fetch_lite():
    say("fetching the mindspore-lite 2.0.0 wheel (cp37: only its native libraries are used)")
    with tempfile.TemporaryDirectory(dir=BASE) as scratch:
        run(
            PYTHON,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.7",
            "--implementation",
            "cp",
            "--abi",
            "cp37m",
            "--platform",
            "manylinux1_x86_64",
            "mindspore-lite==2.0.0",
            "-d",
            scratch,
        )
        wheel = next(os.path.join(scratch, name) for name in os.listdir(scratch) if name.endswith(".whl"))
        staged = os.path.join(scratch, "lib")
        os.makedirs(staged)
        prefix = "mindspore_lite/lib/"
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                name = member.filename[len(prefix) :]
                if not member.filename.startswith(prefix) or not name or name.startswith("_c_lite_wrapper"):
                    continue
                target = os.path.join(staged, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with archive.open(member) as source, open(target, "wb") as sink:
                    shutil.copyfileobj(source, sink)
                os.chmod(target, 0o755)
        shutil.rmtree(LITE_LIB, ignore_errors=True)
        os.makedirs(os.path.dirname(LITE_LIB), exist_ok=True)
        shutil.move(staged, LITE_LIB)


def stub_ok() -> bool:
    path = os.path.join(LITE_LIB, "libmindspore-lite.so")
    return os.path.isfile(path) and not os.path.islink(path)


def build_stub():
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        say("no C compiler: apt-get install gcc")
        run("apt-get", "update", "-qq")
        run("apt-get", "install", "-y", "-qq", "gcc", stdout=subprocess.DEVNULL)
        compiler = shutil.which("gcc")
    say("compiling libmindspore-lite.so (it only needs libmindspore-extendrt_python.so)")
    with tempfile.TemporaryDirectory(dir=BASE) as scratch:
        source = os.path.join(scratch, "empty.c")
        with open(source, "w") as stream:
            stream.write("/* no code: the library exists for its DT_NEEDED entry */\n")
        run(
            compiler,
            "-shared",
            "-fPIC",
            "-o",
            os.path.join(LITE_LIB, "libmindspore-lite.so"),
            source,
            f"-L{LITE_LIB}",
            "-Wl,--no-as-needed",
            "-l:libmindspore-extendrt_python.so",
            "-Wl,-rpath,$ORIGIN",
        )


def models_ok() -> bool:
    return all(os.path.isfile(os.path.join(SERVABLES, name, "1", model)) for name, model in MODELS.items())


def export_models():
    export_venv = os.path.join(BASE, "export-venv")
    python = os.path.join(export_venv, "bin", "python")
    if (
        not os.path.exists(python)
        or subprocess.run([python, "-c", "import mindspore"], capture_output=True).returncode != 0
    ):
        say(f"creating {export_venv} for the export: {' '.join(EXPORT_PINS)} (about 950 MB)")
        run(python39(), "-m", "venv", export_venv)
        run(python, *PIP, "--no-cache-dir", *EXPORT_PINS)
    run(python, os.path.join(PEERS, "orig_ms_export.py"), SERVABLES, cwd=BASE, env=dict(os.environ, GLOG_v="3"))
    shutil.rmtree(export_venv)  # kept when the export failed, for the next run


def copy_configs():
    for name, config in CONFIGS.items():
        os.makedirs(os.path.join(SERVABLES, name, "1"), exist_ok=True)
        shutil.copyfile(config, os.path.join(SERVABLES, name, "servable_config.py"))


def device_check() -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(p for p in (LITE_LIB, os.environ.get("LD_LIBRARY_PATH")) if p))
    out = subprocess.run(
        [
            PYTHON,
            "-c",
            "from mindspore_serving._mindspore_serving import Worker_; print(Worker_.get_device_type('cpu', True))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=BASE,
    )
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]


def complete() -> bool:
    return serving_venv_ok() and lite_ok() and stub_ok() and models_ok()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only say whether the build is complete")
    args = parser.parse_args()
    if args.check:
        if not complete():
            sys.exit(1)
        print(PYTHON)
        return
    os.makedirs(BASE, exist_ok=True)
    for ok, build in (
        (serving_venv_ok, build_serving_venv),
        (lite_ok, fetch_lite),
        (stub_ok, build_stub),
        (models_ok, export_models),
    ):
        if not ok():
            build()
    copy_configs()
    device = device_check()
    if device != "Cpu":
        sys.exit(f"orig_ms_setup: the original does not pick Lite on the CPU: {device}")
    say(f"ready under {BASE}: {PYTHON} bench/peers/orig_ms_serve.py --grpc-port P --rest-port Q")


if __name__ == "__main__":
    main()
