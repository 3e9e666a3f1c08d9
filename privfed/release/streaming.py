"""Whether an object's streamed path still stands for its one-call path.

A streamed release (a mechanism folding each client's noisy upload as it
arrives, a method folding its pairs as they are summed) is written once, next
to the hooks of the one-call release it reproduces.  A subclass that replaces
one of those hooks changes the one-call release but not the inherited
stream, which would then bypass the change: such an object keeps the
one-call path.  :func:`stream_stands_for` is that one check, used by the
release plan (:mod:`privfed.release.plan`) and by the plain fold of
:func:`privfed.release.pipeline.server_head`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["stream_stands_for"]


def stream_stands_for(obj: Any, entry: str, hooks: Iterable[str]) -> bool:
    """Whether ``obj``'s class uses the ``hooks`` of the class that defines its streamed ``entry``.

    False when no class of ``obj`` defines ``entry``, or when ``obj``'s class
    resolves any of ``hooks`` (list ``entry`` itself among them to catch a
    stream replaced on its own) to another function than that class does.
    """
    cls = type(obj)
    owner = next((c for c in cls.__mro__ if entry in c.__dict__), None)
    if owner is None:
        return False
    return all(getattr(cls, name, None) is getattr(owner, name, None) for name in hooks)
