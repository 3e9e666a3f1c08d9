"""Exceptions raised by privfed for user mistakes.

Every error raised for bad input is a :class:`PrivfedError` (a ``ValueError``)
whose message names the offending input and says how to fix it.  Command-line
entry points catch it and print one line instead of a traceback.
"""

from __future__ import annotations

__all__ = ["PrivfedError", "InputError", "ConfigError", "MissingDependencyError"]


class PrivfedError(ValueError):
    """Base class of every error privfed raises for a user mistake."""


class InputError(PrivfedError):
    """Bad data: wrong shapes, non-finite values, labels out of range, ..."""


class ConfigError(PrivfedError):
    """Bad parameters: unknown method, invalid privacy budget, ..."""


class MissingDependencyError(PrivfedError, ImportError):
    """An optional dependency is not installed; the message names the extra."""
