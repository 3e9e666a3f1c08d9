"""Aggregation methods, registered by name.

>>> from privfed import methods
>>> methods.available()  # doctest: +ELLIPSIS
['fed3r', 'fed3r-within', 'fedcgs', 'fedcof', 'fedcof-oracle', 'fedlog', 'fedncm']
>>> m = methods.get("fed3r", lam=0.1)
"""

from __future__ import annotations

from privfed.errors import ConfigError
from privfed.methods.base import Method, SecureSum

__all__ = ["Method", "SecureSum", "available", "get", "get_class", "register"]

_REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: register a :class:`Method` under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"method name {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    """Names of every registered method, sorted."""
    return sorted(_REGISTRY)


def get_class(name: str) -> type[Method]:
    """The class registered as ``name``; ConfigError listing the names otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown method {name!r}; available: {', '.join(available())}") from None


def get(name: str, **params) -> Method:
    """An instance of method ``name`` with ``params``."""
    return get_class(name)(**params)


# Importing the modules registers the methods.
from privfed.methods import (  # noqa: E402,F401
    fed3r,
    fed3r_within,
    fedcgs,
    fedcof,
    fedcof_oracle,
    fedlog,
    fedncm,
)
