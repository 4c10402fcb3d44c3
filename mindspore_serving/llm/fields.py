"""The check that the engine's validated dataclasses (SchedulerConfig, SamplingParams) apply to keyword
arguments from outside: an unknown name is refused, not dropped, and the message lists the known ones."""

from collections.abc import Iterable
from dataclasses import fields


def check_known_fields(cls: type, names: Iterable[str], what: str, error: type[Exception] = ValueError) -> None:
    """Raises `error` when some of `names` are not fields of the dataclass `cls`: "unknown <what> [...]; known:
    [...]", both lists sorted."""
    known = sorted(f.name for f in fields(cls))
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise error(f"unknown {what} {unknown}; known: {known}")
