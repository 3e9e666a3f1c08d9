"""privfed: federated learning from shared statistics of frozen-backbone features.

Accuracy, communication, formal privacy and what a curious server can
recover, for FedNCM, Fed3R, FedCOF, FedCGS and FedLog.

>>> import privfed
>>> privfed.methods.available()  # doctest: +ELLIPSIS
['fed3r', ...]

The names below are imported on first use, so ``import privfed`` (and every
command's ``--help``) is instant.
"""

from __future__ import annotations

import importlib
import importlib.util

__all__ = [
    "ClientStats",
    "ConfigError",
    "InputError",
    "LinearHead",
    "PrivfedError",
    "compute_client_stats",
    "fit",
    "methods",
]

__version__ = "0.1.0"

#: public name -> (module, attribute or None for the module itself)
_LAZY = {
    "methods": ("privfed.methods", None),
    "fit": ("privfed.api", "fit"),
    "ConfigError": ("privfed.errors", "ConfigError"),
    "InputError": ("privfed.errors", "InputError"),
    "PrivfedError": ("privfed.errors", "PrivfedError"),
    "LinearHead": ("privfed.head", "LinearHead"),
    "ClientStats": ("privfed.stats", "ClientStats"),
    "compute_client_stats": ("privfed.stats", "compute_client_stats"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        if not name.startswith("__") and importlib.util.find_spec(f"privfed.{name}") is not None:
            return importlib.import_module(f"privfed.{name}")  # a submodule, as `import privfed.stats` gives
        raise AttributeError(f"module 'privfed' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
