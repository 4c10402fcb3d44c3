"""Reads a register_method function's source to support the 1.x `call_*` interfaces.

Those interfaces do not say how many outputs a stage has; it comes from the assignment they appear in
(`x, y = register.call_preprocess(fun, a)` -> 2 outputs). They therefore only work in straight-line
methods: one statement per call, no conditions, loops or add_stage.
"""
import ast
import inspect
import textwrap
from typing import Dict, List, Optional

LEGACY_NAMES = ("call_preprocess", "call_preprocess_pipeline", "call_servable", "call_postprocess",
                "call_postprocess_pipeline")


def _code_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names


def uses_legacy_interface(func) -> bool:
    code = getattr(func, "__code__", None)
    return code is not None and bool(_code_names(code) & set(LEGACY_NAMES))


def _called_name(node) -> Optional[str]:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _legacy_names_in(tree) -> List[str]:
    calls = sorted((node.lineno, node.col_offset, _called_name(node)) for node in ast.walk(tree)
                   if _called_name(node) in LEGACY_NAMES)
    found = []
    for _, _, name in calls:
        if name not in found:
            found.append(name)
    return found


def _function_def(func):
    try:
        source = textwrap.dedent(inspect.getsource(func))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def parse_legacy_calls(func, method_name: str, output_names_count: int) -> Optional[Dict[str, List[int]]]:
    """For a method using the call_* interfaces: {interface name: outputs count of each call, in order}.

    Returns None when the method does not use them. Raises RuntimeError for complex statements or
    when call_servable is missing.
    """
    if not uses_legacy_interface(func):
        return None
    func_def = _function_def(func)
    if func_def is None:  # source unavailable: order checks still apply, outputs count defaults to 1
        return {}
    names = _legacy_names_in(func_def)
    if not names:
        return None
    meta: Dict[str, List[int]] = {}
    complex_found = False
    for index, statement in enumerate(func_def.body):
        if index == 0 and isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # docstring
        if isinstance(statement, ast.Return):
            called = _called_name(statement.value)
            if called in LEGACY_NAMES:
                meta.setdefault(called, []).append(output_names_count)
            elif statement.value is not None and not isinstance(statement.value, (ast.Name, ast.Tuple, ast.List)):
                complex_found = True
            continue
        if isinstance(statement, ast.Expr) and _called_name(statement.value) in LEGACY_NAMES:
            meta.setdefault(_called_name(statement.value), []).append(1)
            continue
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and _called_name(statement.value) in LEGACY_NAMES:
            target = statement.targets[0]
            if isinstance(target, ast.Name):
                meta.setdefault(_called_name(statement.value), []).append(1)
                continue
            if isinstance(target, (ast.Tuple, ast.List)):
                meta.setdefault(_called_name(statement.value), []).append(len(target.elts))
                continue
        complex_found = True
    if complex_found:
        joined = ", ".join(names)
        raise RuntimeError(f"complex statements such as conditions and loops are not supported in register_method "
                           f"when the interface '{joined}' is used, use 'add_stage' to replace '{joined}'")
    if "call_servable" not in names:
        raise RuntimeError(f"Not find the invoke of 'call_servable' in method '{method_name}'")
    return meta
