"""Reads a register_method function's source to support the 1.x `call_*` interfaces, as MindSpore Serving does.

Those interfaces do not say how many outputs a stage has; it comes from the assignment they appear in
(`x, y = register.call_preprocess(fun, a)` -> 2 outputs). They therefore only work in straight-line
methods: one top-level statement per call, no conditions, loops or add_stage beside them.

MindSpore Serving reads only assignments; `return register.call_servable(x)` and a bare
`register.call_servable(x)` statement are read here too (with len(output_names) and 1 outputs).
"""

import ast
import inspect
import textwrap
from dataclasses import dataclass, field

CALL_SERVABLE = "call_servable"
_STAGE_CALLS = ("call_preprocess", "call_postprocess", "call_preprocess_pipeline", "call_postprocess_pipeline")
LEGACY_NAMES = _STAGE_CALLS + (CALL_SERVABLE,)


@dataclass
class LegacyMeta:
    """The call_* calls found in a method's source: {interface name: outputs count of each call, in order}.
    `source_known` is False when the source could not be read (then any call is accepted with 1 output)."""

    counts: dict[str, list[int]] = field(default_factory=dict)
    source_known: bool = True

    @property
    def calls(self) -> int:
        return sum(len(counts) for counts in self.counts.values())


def complex_statements_text(method_name: str, names: str) -> str:
    return (
        f"Failed to parse method '{method_name}', complex statements such as conditions and loops are not "
        f"supported in register_method when the interface '{names}' is used, use 'add_stage' to replace "
        f"'{names}'"
    )


def _code_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names


def uses_legacy_interface(func) -> bool:
    code = getattr(func, "__code__", None)
    return code is not None and bool(_code_names(code) & set(LEGACY_NAMES))


def _called_name(node) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _function_def(func) -> tuple[ast.FunctionDef | None, list[str], int]:
    """The function's AST, its source lines and the number of the file line before its first one."""
    try:
        _, start = inspect.findsource(func)
        source = textwrap.dedent(inspect.getsource(func))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None, [], 0
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node, source.split("\n"), start
    return None, [], 0


def _node_info(func, node, lines: list[str], start: int) -> str:
    """MindSpore Serving's "line <n>[~<m>] in <function>, code: \\n<the statement's lines>"."""
    end = getattr(node, "end_lineno", None) or node.lineno
    code = "".join(lines[line - 1] + "\n" for line in range(node.lineno, end + 1))
    first, last = node.lineno + start, end + start
    where = f"{first}~{last}" if first != last else f"{first}"
    return f"line {where} in {getattr(func, '__name__', func)}, code: \n" + code


def _legacy_call(statement, output_names_count: int) -> tuple[str | None, int | None, bool]:
    """(interface, outputs count, is other code) of one top-level statement of the method."""
    if isinstance(statement, (ast.Return, ast.Expr)):  # MindSpore Serving skips these; its calls are read here
        name = _called_name(statement.value)
        if name not in LEGACY_NAMES:
            return None, None, False
        return name, output_names_count if isinstance(statement, ast.Return) else 1, False
    if not isinstance(statement, ast.Assign):
        return None, None, True
    target = statement.targets[0]
    if isinstance(target, ast.Name):
        outputs_count = 1
    elif isinstance(target, ast.Tuple):
        outputs_count = len(target.elts)
    else:
        return None, None, False
    call = statement.value
    if not isinstance(call, ast.Call):
        return None, None, False
    name = _called_name(call)
    if name is None or name not in LEGACY_NAMES:
        return None, None, True
    return name, outputs_count, False


def parse_legacy_calls(func, method_name: str, output_names_count: int) -> LegacyMeta | None:
    """The call_* calls of a method's top-level statements; None when the method does not use them.

    Raises RuntimeError, in MindSpore Serving's words, when such a call comes with other statements (conditions,
    loops, add_stage, ...), when a call has no inputs, or when call_servable is missing.
    """
    if not uses_legacy_interface(func):
        return None
    func_def, lines, start = _function_def(func)
    if func_def is None:  # source unavailable: order checks still apply, outputs count defaults to 1
        return LegacyMeta(source_known=False)
    meta = LegacyMeta()
    names = []
    other = None
    for statement in func_def.body:
        name, outputs_count, is_other = _legacy_call(statement, output_names_count)
        if is_other:
            other = other or statement
        if name is None:
            continue
        call = statement.value
        inputs_count = len(call.args) - (1 if name in _STAGE_CALLS else 0)
        if inputs_count <= 0:
            raise RuntimeError(f"Invalid '{name}' invoke args")
        meta.counts.setdefault(name, []).append(outputs_count)
        names.append(name)
    if names and other is not None:
        joined = ";".join(names)
        raise RuntimeError(
            f"{complex_statements_text(method_name, joined)}, code {type(other)}: "
            f"{_node_info(func, other, lines, start)}"
        )
    if names and CALL_SERVABLE not in meta.counts:
        raise RuntimeError(f"Not find the invoke of '{CALL_SERVABLE}'")
    return meta
