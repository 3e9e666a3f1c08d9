"""Bytes a client sends and receives under each secure-aggregation protocol.

Plain uploads follow each method's ``upload_bytes`` (FedCOF paper, App. H:
4 bytes a float, sparse over the M (client, class) pairs with data).
Secure aggregation changes this in three ways:

* **dense statistics**: which classes a client holds is itself private, so
  every client uploads every coordinate of every summed statistic (C counts,
  C d sums, d^2 second moments, ...), not only its M_k pairs;
* **payload expansion**: masking uploads ring elements of 8 bytes (Z_{2^64});
  CKKS uploads ceil(D / (N/2)) ciphertexts whose serialized size is measured
  here with TenSEAL (about 331 kB per 4096 slots, ~81 bytes a value, for
  N = 8192 and [60, 40, 40, 60]);
* **protocol overhead** per summed statistic (each runs with fresh keys):
  masking (Bonawitz et al. 2017, Sec. 7.1) sends two X25519 public keys
  (64 bytes), one AES-GCM encrypted pair of Shamir shares to every neighbour
  (4-byte id + 12-byte nonce + 72-byte plaintext + 16-byte tag) and, in the
  unmasking round, one 37-byte answer per group member; it receives the
  neighbours' public keys, their encrypted shares and the list of uploaders.
  CKKS clients download the public context (public key only, measured).

Methods and the arrays they sum (one secure-sum call each):

=================  ====================================================  =======================
method             summed arrays (per client)                            protocols
=================  ====================================================  =======================
fedncm             counts C, sums C d                                    mask, ckks
fed3r              counts C, sums C d, second d^2                        mask, ckks
fed3r-within       counts C, sums C d, second d^2                        mask, ckks
fedcgs             counts C, sums C d, second d^2                        mask, ckks
fedlog             counts C, sums C d                                    mask, ckks
fedcof-oracle      counts C, sums C d, class second C d^2                mask, ckks
fedcof             round 1: counts C, sums C d, presence C (one sum;     mask, ckks (App. I.2)
                   + C with noise_var); round 2: spread d^2
=================  ====================================================  =======================

Methods with ``per_client = True`` and no secure protocol are refused.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from mechanisms.secagg import masking
from mechanisms.secagg.ckks.scheme import CKKSParams
from privfed.errors import ConfigError, InputError

__all__ = ["PROTOCOLS", "ckks_sizes", "secagg_upload_bytes", "secure_arrays"]

#: Protocol names accepted by :func:`secagg_upload_bytes`.
PROTOCOLS = ("none", "mask", "ckks")

_FIELD_SIZE = {
    "counts": lambda d, C: C,
    "sums": lambda d, C: C * d,
    "second": lambda d, C: d * d,
    "class_second": lambda d, C: C * d * d,
}


def _method_class(method: Any):
    from privfed import methods

    if isinstance(method, str):
        return methods.get_class(method)
    if isinstance(method, methods.Method):
        return type(method)
    if isinstance(method, type) and issubclass(method, methods.Method):
        return method
    raise ConfigError(f"method must be a registered name, a Method or a Method class, got {method!r}")


def has_secure_protocol(cls) -> bool:
    """Whether ``cls`` overrides :meth:`Method.secure_aggregate` (a per-client method with a secure variant)."""
    from privfed.methods.base import Method

    return cls.secure_aggregate is not Method.secure_aggregate


def secure_arrays(method: Any, *, d: int, C: int) -> list[tuple[str, int]]:
    """(name, values per client) of each array a method sums, in call order.

    Raises ConfigError for a per-client method without a secure protocol.
    """
    cls = _method_class(method)
    if has_secure_protocol(cls):
        if getattr(cls, "secure_protocol", None) == "fedcof-two-round":
            from privfed.methods.fedcof_protocol import round_lengths

            params = getattr(method, "params", None)
            noise_aware = isinstance(params, dict) and float(params.get("noise_var", 0.0)) > 0
            n = round_lengths(C, d, noise_aware)
            return [("counts, sums, presence", n["fedcof-1"]), ("spread", n["fedcof-2"])]
        raise ConfigError(f"no communication model for the secure protocol of {cls.name!r}")
    if cls.per_client:
        raise ConfigError(
            f"method {cls.name!r} needs every client's individual statistics and has no secure protocol; "
            "it cannot run under secure aggregation"
        )
    order = ("counts", "sums", "second", "class_second")
    names = [f for f in order if f in set(cls.requires) | {"counts", "sums"}]
    return [(f, _FIELD_SIZE[f](d, C)) for f in names]


def ckks_sizes(params: CKKSParams | None = None) -> dict[str, int]:
    """Measured serialized sizes: one full ciphertext and the public context (TenSEAL)."""
    return _ckks_sizes(CKKSParams() if params is None else params)


@functools.lru_cache(maxsize=8)
def _ckks_sizes(params: CKKSParams) -> dict[str, int]:
    import numpy as np
    import tenseal as ts

    from mechanisms.secagg.ckks.scheme import ckks_encrypt, new_context, public_bytes

    pub = public_bytes(new_context(params))
    ctx = ts.context_from(pub)
    rng = np.random.default_rng(0)
    ct = ckks_encrypt(ctx, rng.uniform(-1, 1, size=params.slots), params.slots)[0]
    return {"ciphertext": len(ct), "public_context": len(pub)}


def secagg_upload_bytes(
    method: Any,
    M: int,
    K: int,
    d: int,
    C: int,
    protocol: str = "mask",
    *,
    neighbours: int | None = None,
    ckks_params: CKKSParams | None = None,
) -> dict[str, Any]:
    """Bytes per client of one aggregation of ``method`` under ``protocol``.

    Parameters
    ----------
    method : str, Method or Method class
    M, K, d, C : int
        (client, class) pairs with data, clients, feature dimension, classes.
    protocol : {"none", "mask", "ckks"}
    neighbours : int, optional
        SecAgg+ degree k (masking); ``None`` for the complete graph (k = K - 1).
    ckks_params : CKKSParams, optional
        Defaults to ``CKKSParams()`` (N = 8192, [60, 40, 40, 60], scale 2^40).

    Returns
    -------
    dict
        ``upload`` (total bytes a client sends), ``download``, ``plain``
        (the method's clear upload per client), ``expansion`` (upload /
        plain), and the parts: ``payload``, ``key_exchange``, ``shares``,
        ``unmask`` (masking) or ``ciphertexts``, ``public_context`` (CKKS),
        plus ``arrays`` (name, values) and ``calls``.
    """
    for nm, v in (("M", M), ("K", K), ("d", d), ("C", C)):
        whole = (
            isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, bool)
            and math.isfinite(v)
        )
        if not whole or int(v) != v or int(v) < (0 if nm == "M" else 1):  # NaN raised int()'s error
            raise InputError(
                f"{nm} must be a {'non-negative' if nm == 'M' else 'positive'} integer, got {v!r}"
            )
    M, K, d, C = int(M), int(K), int(d), int(C)
    if protocol not in PROTOCOLS:
        raise ConfigError(f"protocol must be one of {list(PROTOCOLS)}, got {protocol!r}")
    cls = _method_class(method)
    plain = cls.upload_bytes(M=M, K=K, d=d, C=C) / K
    if protocol == "none":
        return {
            "protocol": "none",
            "method": cls.name,
            "upload": plain,
            "download": 0.0,
            "plain": plain,
            "expansion": 1.0,
        }
    arrays = secure_arrays(method, d=d, C=C)
    calls = len(arrays)
    values = sum(n for _, n in arrays)
    out: dict[str, Any] = {
        "protocol": protocol,
        "method": cls.name,
        "plain": plain,
        "arrays": arrays,
        "calls": calls,
    }
    if protocol == "mask":
        if neighbours is not None and (
            isinstance(neighbours, bool)
            or not isinstance(neighbours, (int, np.integer))
            or neighbours < 2
            or neighbours % 2
        ):
            # -2 gave a negative upload, 3 a graph no masked sum draws
            raise ConfigError(
                f"neighbours must be an even integer >= 2 (a SecAgg+ graph), got {neighbours!r}"
            )
        k = K - 1 if neighbours is None else min(int(neighbours), K - 1)
        payload = 8 * values
        key_exchange = calls * 2 * masking.PUBLIC_KEY_BYTES
        shares = calls * k * (masking.ID_BYTES + masking.SHARE_CIPHERTEXT_BYTES)
        unmask = calls * (k + 1) * masking.UNMASK_ANSWER_BYTES
        download = calls * (
            k * (masking.ID_BYTES + 2 * masking.PUBLIC_KEY_BYTES)
            + k * (masking.ID_BYTES + masking.SHARE_CIPHERTEXT_BYTES)
            + masking.ID_BYTES * K
        )
        upload = payload + key_exchange + shares + unmask
        out.update(
            payload=payload,
            key_exchange=key_exchange,
            shares=shares,
            unmask=unmask,
            neighbours=k,
            ring_bits=64,
        )
    else:
        ckks_params = CKKSParams() if ckks_params is None else ckks_params
        sizes = ckks_sizes(ckks_params)
        n_ct = sum(ckks_params.num_ciphertexts(n) for _, n in arrays)
        upload = n_ct * sizes["ciphertext"]
        download = calls * sizes["public_context"]
        out.update(
            ciphertexts=upload,
            num_ciphertexts=n_ct,
            ciphertext_bytes=sizes["ciphertext"],
            public_context=sizes["public_context"],
        )
    out.update(
        upload=float(upload), download=float(download), expansion=upload / plain if plain else float("inf")
    )
    return out
