"""scikit-learn's parameter protocol for mechanisms and protections: ``get_params``, ``set_params``, ``clone``.

A class that inherits :class:`Parameters` records the arguments its
constructor was called with (defaults filled in) and returns them from
:meth:`~Parameters.get_params`, the objects themselves, so that
:func:`sklearn.base.clone` rebuilds an equal, unused copy and
``FederatedHeadClassifier(privacy=GaussianMechanism(...))`` exposes
``privacy__epsilon`` to :class:`sklearn.model_selection.GridSearchCV`.

:meth:`~Parameters.set_params` rebuilds the object with the new arguments
(every check of the constructor runs again).  An object that has already
released something (its ledger holds events) refuses: the new parameters
would describe a mechanism whose past releases the ledger no longer matches.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

from privfed.errors import ConfigError

__all__ = ["Parameters"]


class Parameters:
    """Mixin: the constructor's arguments as scikit-learn parameters (see the module docstring)."""

    _params: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_records_params", False):
            return
        signature = inspect.signature(init)
        names = [
            n
            for n, p in signature.parameters.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]

        @functools.wraps(init)
        def recording(self, *args: Any, **kw: Any) -> None:
            if type(self).__init__ is recording:  # the class's own constructor, not a super() call
                try:
                    bound = signature.bind(self, *args, **kw)
                except TypeError:  # a wrong call: Python's own error names the class and what was wrong
                    init(self, *args, **kw)
                    raise
                bound.apply_defaults()
                self._params = {n: bound.arguments[n] for n in names}
            init(self, *args, **kw)

        recording._records_params = True  # type: ignore[attr-defined]
        cls.__init__ = recording  # type: ignore[method-assign]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments (the objects passed, defaults filled in); ``deep`` adds nested ones."""
        params = dict(getattr(self, "_params", {}))
        if deep:
            for name, value in list(params.items()):
                if hasattr(value, "get_params") and not isinstance(value, type):
                    params.update({f"{name}__{k}": v for k, v in value.get_params(deep=True).items()})
        return params

    def set_params(self, **params: Any):
        """Rebuild with these arguments changed (nested ``name__param`` too); returns ``self``.

        Refused once the object has released anything: its ledger would no longer describe it.
        """
        if not params:
            return self
        ledger = getattr(self, "ledger", None)
        if ledger is not None and len(getattr(ledger, "events", ())):
            raise ConfigError(
                f"{type(self).__name__}.set_params: this mechanism has released already and its ledger "
                "books those releases; make a new one (sklearn.base.clone(mechanism)) with the new parameters"
            )
        current = dict(getattr(self, "_params", {}))
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, sep, sub = key.partition("__")
            if name not in current:
                raise ConfigError(
                    f"{type(self).__name__} has no parameter {name!r}; its parameters: {', '.join(sorted(current))}"
                )
            if sep:
                nested.setdefault(name, {})[sub] = value
            else:
                current[name] = value
        # All or nothing: the new parameters are checked on a trial object (nested ones on copies) first, so
        # a refused value leaves this object as it was, not its parameters changed and its state not.
        trial = dict(current)
        for name, sub in nested.items():
            trial[name] = copy.deepcopy(current[name]).set_params(**sub)
        type(self).__new__(type(self)).__init__(**trial)
        for name, sub in nested.items():
            current[name].set_params(**sub)
        self.__init__(**current)  # every check of the constructor, and a fresh state
        return self
