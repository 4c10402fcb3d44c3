"""Keeps a process on the compiled protobuf implementation whatever its parent did.

MindSpore sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python when it is imported and the variable is unset (for
its checkpoint files). Children of a process that imported MindSpore (a worker started by such a master, the
agents a worker spawns) inherit it, and every message of theirs would then go through the pure-Python protobuf,
several times slower. A process module that loads protobuf before MindSpore calls `prefer_native_protobuf()`
before its first protobuf import, so it uses the implementation it gets with the variable unset.
"""

import os

_VARIABLE = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"


def prefer_native_protobuf() -> None:
    if os.environ.get(_VARIABLE) == "python":
        del os.environ[_VARIABLE]
