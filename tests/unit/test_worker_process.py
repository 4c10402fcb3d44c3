"""The worker and agent process modules: what they do at import, before protobuf and MindSpore are loaded."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def protobuf_implementation_of(module, env_value):
    env = dict(os.environ)
    env.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
    if env_value is not None:
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = env_value
    code = f"import {module}\nfrom google.protobuf.internal import api_implementation\nprint(api_implementation.Type())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "module",
    ["mindspore_serving.worker.process", "mindspore_serving.worker.extra_worker", "mindspore_serving.agent.process"],
)
def test_workers_and_agents_ignore_the_pure_python_protobuf_that_mindspore_sets_in_their_parent(module):
    default = protobuf_implementation_of(module, None)
    assert protobuf_implementation_of(module, "python") == default
    assert default != "python"


def test_an_extra_worker_imports_no_mindspore_to_call_another_workers_models():
    code = (
        "import sys\n"
        "import mindspore_serving.worker.extra_worker\n"
        "from mindspore_serving.server import register\n"
        "print('mindspore' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False"
