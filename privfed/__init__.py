"""privfed: federated learning from shared statistics of frozen-backbone features.

Accuracy, communication, formal privacy and what a curious server can
recover, for FedNCM, Fed3R, FedCOF, FedCGS and FedLog.

>>> import privfed
>>> privfed.methods.available()  # doctest: +ELLIPSIS
['fed3r', ...]
"""

from privfed import methods
from privfed.api import fit
from privfed.errors import ConfigError, InputError, PrivfedError
from privfed.head import LinearHead
from privfed.stats import ClientStats, compute_client_stats

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
