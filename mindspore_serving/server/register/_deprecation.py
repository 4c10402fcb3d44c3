"""Warnings for the interfaces kept from MindSpore Serving 1.x."""

import functools

from mindspore_serving import log

DEPRECATED_VERSION = "1.5.0"


def warn_deprecated(name: str, substitute: str, version: str = DEPRECATED_VERSION):
    log.warning(
        f"'{name}' is deprecated from version {version} and will be removed in a future version, "
        f"use '{substitute}' instead."
    )


def deprecated(substitute: str, version: str = DEPRECATED_VERSION):
    """Decorates a function (or a class' __init__) so that each call logs the deprecation warning."""

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            name = func.__name__
            if name == "__init__" and args:
                name = type(args[0]).__name__
            warn_deprecated(name, substitute, version)
            return func(*args, **kwargs)

        return wrapper

    return decorate
