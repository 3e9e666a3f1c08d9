"""Aggregation methods, registered by name.

>>> from privfed import methods
>>> methods.available()  # doctest: +ELLIPSIS
['fed3r', 'fed3r-within', 'fedcgs', 'fedcof', 'fedcof-oracle', 'fedlog', 'fedncm']
>>> m = methods.get("fed3r", lam=0.1)
"""

from __future__ import annotations

from privfed._registry import Registry
from privfed.methods.base import Method, SecureSum

__all__ = ["Method", "SecureSum", "available", "get", "get_class", "register"]

_REGISTRY: Registry[Method] = Registry("method")

#: Class decorator: register a :class:`Method` under ``cls.name``.
register = _REGISTRY.register
#: Names of every registered method, sorted.
available = _REGISTRY.available
#: The class registered as a name; ConfigError listing the names otherwise.
get_class = _REGISTRY.get_class
#: An instance of a method with parameters: ``get("fed3r", lam=0.1)``.
get = _REGISTRY.get


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
