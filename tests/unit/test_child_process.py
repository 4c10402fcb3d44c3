"""The environment of the processes a server starts (common/child_process.py)."""

import subprocess
import sys

import mindspore_serving
from mindspore_serving.common.child_process import child_env


def test_a_child_runs_its_parents_package_even_from_a_directory_holding_another(tmp_path):
    """A server installed from a wheel and started inside a checkout: `python -m` must not pick the checkout's
    package from the working directory."""
    other = tmp_path / "mindspore_serving"
    other.mkdir()
    (other / "__init__.py").write_text("raise ImportError('the working directory copy')\n")
    done = subprocess.run(
        [sys.executable, "-c", "import mindspore_serving; print(mindspore_serving.__file__)"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == mindspore_serving.__file__
