"""Optional dependencies: import one, or fail with the extra to install.

The core install (``pip install privfed``) runs the statistics, the methods,
the privacy mechanisms and the main job on the embedded default without
torch.  Features built on torch (training a backbone, the learned attacks,
torchvision data sets, multi-round FedLog) need ``pip install "privfed[torch]"``
(or ``[vision]``, ``[all]``); :func:`require` says so instead of a bare
``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from privfed._files import signals_held
from privfed.errors import MissingDependencyError

__all__ = ["EXTRAS", "import_held", "require"]

#: import name -> the privfed extra that installs it.
EXTRAS = {
    "torch": "torch",
    "opacus": "torch",
    "torchvision": "vision",
    "tenseal": "he",
    "opendp": "secure-noise",
    "skimage": "attacks",
    "flwr": "flower",
}


def require(module: str, feature: str) -> ModuleType:
    """Import ``module``, or raise :class:`~privfed.errors.MissingDependencyError` naming the extra.

    Parameters
    ----------
    module : str
        Import name, e.g. ``"torch"``.
    feature : str
        What needs it, for the message (e.g. ``"training the digits backbone"``).
    """
    try:
        return import_held(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != module.split(".")[0]:
            raise
        extra = EXTRAS.get(module.split(".")[0], "all")
        raise MissingDependencyError(
            f'{feature} needs {module}, which is not installed: pip install "privfed[{extra}]"'
        ) from None


def import_held(module: str) -> ModuleType:
    """Import ``module`` with Ctrl-C (SIGINT) and SIGTERM held until the import has finished.

    A large extension's import (torch's runs C++ that calls back into Python) can abort the whole
    process when a KeyboardInterrupt is raised inside it (exit -6, no message), where the command would
    have said "interrupted" and exited 130.  A signal that arrives meanwhile is raised again once the
    import is done, so it reaches the handler that was in place (a command's one-line exit, Python's
    KeyboardInterrupt) at a line of Python.  A module already imported, or an import off the main
    thread (signals are only ever handled there), is not held.
    """
    if module in sys.modules:
        return importlib.import_module(module)
    with signals_held():  # the signals a command turns into an interrupt, raised again after the import
        return importlib.import_module(module)
