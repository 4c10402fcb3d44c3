"""The servable_config.py reference: the signature and docstring of every name `server.register` exports (the
declarations a servable's configuration makes), of `server.distributed`'s declaration, and of the server API a
script calls (`server.start_servables` and the rest)."""

import inspect

from mindspore_serving import server
from mindspore_serving.server import distributed, register
from reference_gen.markdown import GENERATED_NOTE, docstring, fence

DEPRECATED = "Deprecated"


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _entry(prefix: str, name: str, obj, level: str = "###") -> str:
    parts = [f"{level} {prefix}.{name}\n", fence(f"{prefix}.{name}{_signature(obj)}", "python")]
    parts.append(docstring(inspect.getdoc(obj) or ""))
    if inspect.isclass(obj):
        for method_name, method in inspect.getmembers(obj, inspect.isfunction):
            if not method_name.startswith("_") and method.__qualname__.startswith(obj.__name__ + "."):
                parts.append(_entry(f"{prefix}.{name}", method_name, method, level + "#"))
    return "\n".join(parts)


def _is_deprecated(obj) -> bool:
    return (inspect.getdoc(obj) or "").startswith(DEPRECATED)


def render() -> str:
    current = [n for n in register.__all__ if not _is_deprecated(getattr(register, n))]
    deprecated = [n for n in register.__all__ if _is_deprecated(getattr(register, n))]
    server_api = [n for n in server.__all__ if n not in ("register", "distributed")]
    parts = [
        GENERATED_NOTE,
        "# servable_config.py and the server API\n",
        "## Declarations (`server.register`)\n",
        docstring(inspect.getdoc(register)),
    ]
    parts += [_entry("register", n, getattr(register, n)) for n in current]
    parts.append("## Distributed servables (`server.distributed`)\n")
    parts.append(docstring(inspect.getdoc(distributed)))
    parts += [_entry("distributed", n, getattr(distributed, n)) for n in distributed.__all__]
    parts.append("## The server API (`mindspore_serving.server`)\n")
    parts.append(docstring(inspect.getdoc(server)))
    parts += [_entry("server", n, getattr(server, n)) for n in server_api]
    parts.append("## Deprecated declarations\n")
    parts.append("MindSpore Serving's older interfaces, still accepted; each names what replaces it.\n")
    parts += [_entry("register", n, getattr(register, n)) for n in deprecated]
    return "\n".join(parts)
