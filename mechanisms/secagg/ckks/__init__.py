"""CKKS secure summation of a (K, ...) stack in one process: the protocol's own objects over a loop.

:func:`ckks_sum` checks the stack (finite, within the agreed bound and the
CKKS bound, a release grid above the decryption error), makes roster
identities for this run (OS entropy), and runs
:func:`mechanisms.secagg.ckks.server.run_in_process` over one
:class:`~mechanisms.secagg.ckks.node.CKKSNode` per client and a
:class:`~mechanisms.secagg.ckks.holder.CKKSKeyHolder` (client 0, as a Flower node
the server names): the same checks as over Flower, so a deviating server
is refused here too.  See :mod:`mechanisms.secagg.ckks.scheme` for the scheme, the bound
and the release grid.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mechanisms.secagg import fixed_point
from mechanisms.secagg.ckks.holder import CKKSKeyHolder
from mechanisms.secagg.ckks.node import CKKSNode
from mechanisms.secagg.ckks.scheme import GRID_MARGIN_BITS, CKKSParams
from mechanisms.secagg.ckks.server import CKKSServer, CKKSServerView, run_in_process
from mechanisms.secagg.identity import make_roster
from mechanisms.secagg.ledger import SessionLedger
from mechanisms.secagg.noise import check_add_noise, check_nonnegative, noise_rng, noise_share
from privfed.errors import ConfigError, InputError

__all__ = ["KEY_HOLDER", "CKKSSumResult", "ckks_sum"]

#: The client that holds the keys in process.
KEY_HOLDER = 0


@dataclass
class CKKSSumResult:
    """Output of :func:`ckks_sum`.

    ``upload_bytes`` are each client's ciphertext bytes, ``download_bytes`` the public context's,
    ``aggregate_bytes`` the ciphertexts and signatures the server forwards to the key holder.
    """

    total: np.ndarray
    view: CKKSServerView
    integral: bool
    num_ciphertexts: int
    upload_bytes: dict[int, int]
    download_bytes: int
    aggregate_bytes: int
    seconds: dict[str, float]
    #: Fewest signed contributions the key holder decrypts a sum of (the roster's sum threshold).
    threshold: int = 0


def _check_stack(stack, params, integers, noise_std, value_bound, name):
    raw = fixed_point.as_stack(stack, name)  # as masking reads it
    X = raw.astype(np.float64, copy=False)
    if X.ndim < 1 or X.shape[0] < 2:
        raise InputError(
            f"{name}: secure aggregation needs a (K, ...) stack with K >= 2 clients, got {X.shape}"
        )
    K, shape = X.shape[0], X.shape[1:]
    flat = X.reshape(K, -1)
    if flat.shape[1] == 0:
        raise InputError(f"{name}: the clients' statistics are empty (shape {X.shape}); nothing to sum")
    if not np.all(np.isfinite(flat)):
        raise InputError(f"{name} contains NaN/inf values; secure aggregation needs finite statistics")
    noise_std = check_nonnegative(noise_std, "noise_std")
    data_max = float(np.abs(flat).max())
    max_abs = data_max if value_bound is None else check_nonnegative(value_bound, "value_bound")
    if value_bound is not None and data_max > max_abs:
        over = np.flatnonzero(np.abs(flat).max(axis=1) > max_abs)
        raise InputError(
            f"{name}: client(s) {over[:5].tolist()} hold values outside the agreed bound |x| <= {max_abs:g}; "
            "they refuse to encrypt them"
        )
    # whole numbers: the release is rounded to whole numbers (exact while the sum stays below 2^53)
    integral = fixed_point.integer_encoding(flat, integers, noise_std, data_max, name)
    if not integral and params.precision_bits > params.max_precision_bits(K):
        err_bits = int(params.scale_bits) - math.log2(params.poly_modulus_degree) - 0.5 * math.log2(K)
        raise ConfigError(
            f"{name}: with K={K} clients the decryption error reaches about 2^-{err_bits:.1f}; "
            f"precision_bits={params.precision_bits} would release key-dependent error bits; use "
            f"precision_bits <= {params.max_precision_bits(K)} or a larger scale_bits"
        )
    bound = K * (max_abs + 40.0 * noise_std)
    if not bound < 2.0**params.bound_bits:
        raise InputError(
            f"{name} could exceed the CKKS bound: {K} clients x max|x| = {max_abs:.4g} gives |sum| up to "
            f"2^{np.log2(bound):.1f} >= 2^{params.bound_bits} (coeff_mod_bit_sizes={list(params.coeff_mod_bit_sizes)}, "
            f"scale 2^{params.scale_bits}); the sum would wrap silently. Lower scale_bits, add a modulus prime, "
            "or clip the features"
        )
    # CKKS encodes in float64 (its FFT): a slot's error grows with the largest value in the ciphertext, about
    # 2^-54 of it (measured: 2^-54.0 to 2^-55.2 for sums of 1e12 to 1e18), so small sums beside a large one lose
    # their low bits; the release grid (whole numbers for integer sums) must stay above that error as well
    grid_bits = 0 if integral else int(params.precision_bits)
    top = ENCODING_BITS - GRID_MARGIN_BITS - grid_bits - 1
    if not bound < 2.0**top:
        coarser = top + grid_bits - math.ceil(np.log2(bound))  # the finest grid this |sum| leaves
        raise InputError(
            f"{name}: |sum| up to 2^{np.log2(bound):.1f} leaves CKKS's float64 encoding an error of about "
            f"2^{np.log2(bound) - ENCODING_BITS:.1f} on every value beside it, above the release grid "
            f"2^-{grid_bits}; clip or rescale the features so |sum| < 2^{top}"
            + (f", or lower precision_bits to at most {coarser}" if coarser >= 0 and not integral else "")
        )
    return flat, shape, integral


#: Bits of a CKKS slot's error below the largest value in its ciphertext (float64 encoding, measured 54-55;
#: two bits of margin).
ENCODING_BITS = 52


def ckks_sum(
    stack: np.ndarray,
    *,
    params: CKKSParams | None = None,
    integers: str | bool = "auto",
    noise_std: float = 0.0,
    add_noise: Callable[[np.ndarray, float, np.random.Generator], np.ndarray] | None = None,
    rng: np.random.Generator | None = None,
    value_bound: float | None = None,
    name: str = "statistic",
) -> CKKSSumResult:
    """Sum the rows of ``stack`` through CKKS with client 0 as the key holder (see the module docstring).

    Parameters
    ----------
    stack : array, shape (K, ...)
    params : CKKSParams, optional
        Default ``CKKSParams()``.
    integers : {"auto", True, False}
        Integer statistics are rounded to whole numbers on release (exact
        counts); ``"auto"`` detects whole-number stacks without noise.
    noise_std : float
        Standard deviation of each client's Gaussian noise share (0: none).
    add_noise : callable, optional
        ``add_noise(row, std, rng) -> noisy row`` draws a client's share (a
        noise backend's ``add_gaussian``); default: numpy normal draws.
    rng : numpy.random.Generator, optional
        Draws the noise shares (keys, identities and session ids come from OS entropy).
    value_bound : float, optional
        Public bound on |x| per coordinate (defaults to the stack's largest).
    name : str
        What is being summed (error messages).

    Raises
    ------
    InputError
        If K * bound could exceed the CKKS bound 2^bound_bits.
    ProtocolAbort
        If a node or the key holder refuses a request (see :mod:`mechanisms.secagg.ckks.node`).
    """
    t_start = time.perf_counter()
    params = CKKSParams() if params is None else params
    if not isinstance(params, CKKSParams):  # a dict of its fields was an AttributeError later
        raise ConfigError(f"params must be a CKKSParams, e.g. CKKSParams(scale_bits=40), got {params!r}")
    rng = noise_rng(rng)
    add_noise = check_add_noise(add_noise)
    flat, shape, integral = _check_stack(stack, params, integers, noise_std, value_bound, name)
    K = flat.shape[0]
    # CKKS tolerates no colluder (the key holder decrypts everything): the roster declares none.
    roster, ids = make_roster(K, None, 0)
    contexts: dict = {}  # the public context, parsed once for every node in this process
    nodes = {
        u: CKKSNode(
            params,
            identity=ids[u],
            roster=roster,
            ledger=SessionLedger(),
            release_grid=not integral,
            contexts=contexts,
        )
        for u in range(K)
    }
    holder = CKKSKeyHolder(params, identity=ids[KEY_HOLDER], roster=roster, ledger=nodes[KEY_HOLDER].ledger)
    server = CKKSServer(
        list(range(K)),
        key_holder=KEY_HOLDER,
        length=flat.shape[1],
        params=params,
        session=os.urandom(16),
        integral=integral,
    )

    def noisy(u: int) -> np.ndarray:
        return noise_share(flat[u], noise_std, rng, add_noise)

    clock: dict[str, float] = {}
    total = run_in_process(
        server,
        nodes,
        holder,
        inputs=noisy,
        aggregation=os.urandom(16),
        on_stage=lambda s: clock.__setitem__(s, time.perf_counter()),
    )
    total = total.reshape(shape)
    server.view.result = total
    add_s = holder.seconds.get("sum", 0.0)
    return CKKSSumResult(
        total=total,
        view=server.view,
        integral=integral,
        num_ciphertexts=params.num_ciphertexts(flat.shape[1]),
        upload_bytes=dict(server.bytes_up["ckks_encrypt"]),
        download_bytes=len(server.view.public_context),
        aggregate_bytes=sum(server.bytes_up["ckks_encrypt"].values())
        + sum(map(len, server.view.signatures.values())),
        seconds={
            "keygen": clock["ckks_keys"] - t_start,
            "encrypt": clock["ckks_encrypt"] - clock["ckks_keys"],
            "sum": add_s,
            "decrypt": clock["ckks_decrypt"] - clock["ckks_encrypt"] - add_s,
            "total": clock["ckks_decrypt"] - t_start,
        },
        threshold=roster.sum_threshold,
    )
