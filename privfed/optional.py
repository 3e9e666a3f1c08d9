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
from types import ModuleType

from privfed.errors import MissingDependencyError

__all__ = ["EXTRAS", "require"]

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
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != module.split(".")[0]:
            raise
        extra = EXTRAS.get(module.split(".")[0], "all")
        raise MissingDependencyError(
            f'{feature} needs {module}, which is not installed: pip install "privfed[{extra}]"'
        ) from None
