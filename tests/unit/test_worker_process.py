"""The worker process module: what it does at import, before protobuf and MindSpore are loaded."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def protobuf_implementation_of_a_worker(env_value):
    env = dict(os.environ)
    env.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
    if env_value is not None:
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = env_value
    code = ("import mindspore_serving.worker.process\n"
            "from google.protobuf.internal import api_implementation\n"
            "print(api_implementation.Type())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_a_worker_ignores_the_pure_python_protobuf_that_mindspore_sets_in_its_parent():
    default = protobuf_implementation_of_a_worker(None)
    assert protobuf_implementation_of_a_worker("python") == default
    assert default != "python"
