"""Secure aggregation: the server learns the sum of the clients' statistics and nothing else.

Two protocols, each written once as node and server state machines that exchange messages, run
in one process (a loop) and on Flower:

* :mod:`mechanisms.secagg.masking` -- pairwise masking with dropout recovery (Bonawitz et al.,
  CCS 2017; the SecAgg+ graph of Bell et al., CCS 2020): :mod:`~mechanisms.secagg.masking.node`,
  :mod:`~mechanisms.secagg.masking.server`, the checks a node makes on what the server shows
  (:mod:`~mechanisms.secagg.masking.views`) and the messages' shapes
  (:mod:`~mechanisms.secagg.masking.messages`);
* :mod:`mechanisms.secagg.ckks` -- CKKS homomorphic encryption with a node as the key holder.

What both share sits beside them: the cryptographic building blocks (:mod:`~mechanisms.secagg.crypto`,
:mod:`~mechanisms.secagg.shamir`, :mod:`~mechanisms.secagg.fixed_point`), the nodes' identities and
roster (:mod:`~mechanisms.secagg.identity`) with its SecAgg+ graph (:mod:`~mechanisms.secagg.graph`),
what a node has already answered for (:mod:`~mechanisms.secagg.ledger`), the public bounds a node checks
the server against (:mod:`~mechanisms.secagg.bounds`), distributed noise and what survives dropouts
(:mod:`~mechanisms.secagg.noise`), what a server can learn, computed for each configuration and run
(:mod:`~mechanisms.secagg.threat`), the bytes each protocol sends (:mod:`~mechanisms.secagg.comm`) and
the protections :func:`privfed.fit` takes (:mod:`~mechanisms.secagg.protection`).

The names below are imported on first use (the key-agreement stack and TenSEAL are heavy)::

    from mechanisms.secagg import PairwiseMasking, CKKSAggregation, make_secure_agg
"""

from __future__ import annotations

import importlib

#: public name -> the module of the package that defines it
_HOME = {
    "CKKSAggregation": "protection",
    "PairwiseMasking": "protection",
    "SecureAggReport": "protection",
    "SecureSumRun": "protection",
    "make_secure_agg": "protection",
    "ThreatModel": "threat",
    "masking_threat": "threat",
    "ckks_threat": "threat",
    "ProtocolAbort": "crypto",
    "DistributedGaussian": "noise",
    "CKKSParams": "ckks.scheme",
    "secagg_upload_bytes": "comm",
    "masked_sum": "masking",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'mechanisms.secagg' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mechanisms.secagg.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
