"""Parameter validators shared by the server API, the engine's validated dataclasses and the model configs.

Every failure raises RuntimeError with MindSpore Serving's exact text, e.g.
"Parameter 'device_ids' should be int or tuple/list of int, but actually <class 'str'>".
Items of tuple/list parameters are reported as "The item value '<v>' in parameter '<n>' ...".

`int_fault` is the one test of an int parameter (a real int, bool rejected, within optional bounds) that every
validator of the package uses, each raising its own error in its own words: `check_int` here, SchedulerConfig
(llm/config.py) and the model configs (models/llama/config.py). `check_known_fields` is the one test of keyword
arguments given to a validated dataclass (SchedulerConfig, SamplingParams).
"""

import enum
import os
import sys
from collections.abc import Iterable
from dataclasses import fields
from typing import TypeVar, cast

_T = TypeVar("_T")


class IntFault(enum.Enum):
    """What is wrong with a value that should be an int within bounds."""

    NOT_INT = "not an int"  # bool included: True is not a count
    BELOW_MINIMUM = "below the minimum"
    ABOVE_MAXIMUM = "above the maximum"


def int_fault(value: object, minimum: int | None = None, maximum: int | None = None) -> IntFault | None:
    """None when `value` is an int (not a bool) in [minimum, maximum] (a bound of None: none), else the fault."""
    if isinstance(value, bool) or not isinstance(value, int):
        return IntFault.NOT_INT
    if minimum is not None and value < minimum:
        return IntFault.BELOW_MINIMUM
    if maximum is not None and value > maximum:
        return IntFault.ABOVE_MAXIMUM
    return None


def check_known_fields(cls: type, names: Iterable[str], what: str, error: type[Exception] = ValueError) -> None:
    """Raises `error` when some of `names` are not fields of the dataclass `cls`: "unknown <what> [...]; known:
    [...]", both lists sorted: an unknown name from outside is refused, not dropped."""
    known = sorted(f.name for f in fields(cls))
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise error(f"unknown {what} {unknown}; known: {known}")


def _subject(arg_name: str, value: object, is_item: bool) -> str:
    if is_item:
        return f"The item value '{value}' in parameter '{arg_name}'"
    return f"Parameter '{arg_name}'"


def _check_nonempty(arg_name: str, value: object, kind: type[_T]) -> _T:
    if not isinstance(value, kind):
        raise RuntimeError(f"Parameter '{arg_name}' should be {kind.__name__}, but actually {type(value)}")
    if not value:
        raise RuntimeError(f"Parameter '{arg_name}' should not be empty {kind.__name__}")
    return value


def check_str(arg_name: str, str_val: object) -> str:
    """A non-empty str."""
    return _check_nonempty(arg_name, str_val, str)


def check_bytes(arg_name: str, bytes_val: object) -> bytes:
    """A non-empty bytes object."""
    return _check_nonempty(arg_name, bytes_val, bytes)


def check_bool(arg_name: str, bool_val: object) -> bool:
    """A real bool (0/1 are rejected)."""
    if not isinstance(bool_val, bool):
        raise RuntimeError(f"Parameter '{arg_name}' should be bool, but actually {type(bool_val)}")
    return bool_val


def check_int(
    arg_name: str, int_val: object, minimum: int | None = None, maximum: int | None = None, is_tuple_item: bool = False
) -> int:
    """An int (bool rejected) inside the optional bounds [minimum, maximum]."""
    fault = int_fault(int_val, minimum, maximum)
    if fault is None:
        return cast(int, int_val)  # int_fault found an int within the bounds
    subject = _subject(arg_name, int_val, is_tuple_item)
    if fault is IntFault.NOT_INT:
        raise RuntimeError(f"{subject} should be int, but actually {type(int_val)}")
    if minimum is not None and maximum is not None:
        raise RuntimeError(f"{subject} should be in range [{minimum},{maximum}]")
    if fault is IntFault.BELOW_MINIMUM:
        raise RuntimeError(f"{subject} should be >= {minimum}")
    raise RuntimeError(f"{subject} should be <= {maximum}")


def check_ip_port(arg_name: str, port: object) -> int:
    return check_int(arg_name, port, 1, 65535)


def _check_int_items(
    arg_name: str, ints: Iterable[object], minimum: int | None, maximum: int | None
) -> tuple[int, ...]:
    seen: list[int] = []
    for value in ints:
        item = check_int(arg_name, value, minimum, maximum, is_tuple_item=True)
        if item in seen:
            raise RuntimeError(f"The item value '{item}' in parameter '{arg_name}' should not be repeated")
        seen.append(item)
    return tuple(seen)


def check_and_as_int_tuple_list(
    arg_name: str, ints: object, minimum: int | None = None, maximum: int | None = None
) -> tuple[int, ...]:
    """A single int or a tuple/list of distinct ints; returns a tuple."""
    if isinstance(ints, int) and not isinstance(ints, bool):
        ints = (ints,)
    if not isinstance(ints, (tuple, list)):
        raise RuntimeError(f"Parameter '{arg_name}' should be int or tuple/list of int, but actually {type(ints)}")
    return _check_int_items(arg_name, ints, minimum, maximum)


def check_int_tuple_list(
    arg_name: str, ints: object, minimum: int | None = None, maximum: int | None = None
) -> tuple[int, ...]:
    """A tuple/list of distinct ints (a single int is rejected); returns a tuple."""
    if not isinstance(ints, (tuple, list)):
        raise RuntimeError(f"Parameter '{arg_name}' should be tuple/list of int, but actually {type(ints)}")
    return _check_int_items(arg_name, ints, minimum, maximum)


def check_and_as_str_tuple_list(arg_name: str, strs: object) -> tuple[str, ...]:
    """A single str or a tuple/list of distinct non-empty strs; returns a tuple."""
    if isinstance(strs, str):
        strs = (strs,)
    if not isinstance(strs, (tuple, list)):
        raise RuntimeError(f"Parameter '{arg_name}' should be str or tuple/list of str, but actually {type(strs)}")
    seen: list[str] = []
    for item in strs:
        if not isinstance(item, str):
            raise RuntimeError(f"The item of parameter '{arg_name}' should be str, but actually {type(item)}")
        if not item:
            raise RuntimeError(f"The item of parameter '{arg_name}' should not be empty str")
        if item in seen:
            raise RuntimeError(f"The item value '{item}' in parameter '{arg_name}' should not be repeated")
        seen.append(item)
    return tuple(seen)


def check_str_tuple(arg_name: str, strs: object) -> tuple[str, ...]:
    """Alias of check_and_as_str_tuple_list."""
    return check_and_as_str_tuple_list(arg_name, strs)


def check_int_tuple(
    arg_name: str, ints: object, minimum: int | None = None, maximum: int | None = None
) -> tuple[int, ...]:
    """Alias of check_and_as_int_tuple_list (int or tuple/list of int)."""
    return check_and_as_int_tuple_list(arg_name, ints, minimum, maximum)


def script_directory() -> str:
    """The directory of the running script; relative paths given to the server API are resolved against it."""
    return os.path.dirname(os.path.realpath(sys.argv[0]))


def get_abs_path(path: str) -> str:
    """`path` made absolute against dirname(realpath(sys.argv[0])), not the current directory."""
    return os.path.realpath(os.path.join(script_directory(), path))
