"""A name -> class registry with helpful errors (methods, attacks)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from privfed.errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Classes registered under their ``name`` attribute.

    Parameters
    ----------
    kind : str
        What the entries are ("method", "attack"); used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, type[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        """Class decorator: register ``cls`` under ``cls.name``."""
        name = getattr(cls, "name", "")
        if not name:
            raise ValueError(f"{cls.__name__} has no name")
        if name in self._items and self._items[name] is not cls:
            raise ValueError(f"{self.kind} name {name!r} is already registered")
        self._items[name] = cls
        return cls

    def available(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._items)

    def get_class(self, name: str) -> type[T]:
        """The class registered as ``name``; ConfigError listing the names otherwise."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ConfigError(
                f"unknown {self.kind} {name!r}; available: {', '.join(self.available())}"
            ) from None

    def get(self, name: str, **params: Any) -> T:
        """An instance of ``name`` with ``params``."""
        return self.get_class(name)(**params)
