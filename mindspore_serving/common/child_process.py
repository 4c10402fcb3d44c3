"""The environment of the processes this package starts (workers, agents)."""

import os

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env() -> dict[str, str]:
    """This process's environment, with this copy of the package first on PYTHONPATH: a child started with
    `python -m mindspore_serving...` runs the same code as its parent, wherever that was imported from.
    PYTHONSAFEPATH keeps `-m` from putting the working directory before it: an installed server started from a
    checkout would otherwise run the checkout's children."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONSAFEPATH"] = "1"
    return env
