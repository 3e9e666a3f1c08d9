"""Pairwise masking with dropout recovery (Bonawitz et al., CCS 2017; Bell et al., CCS 2020).

The protocol of Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning" (Fig. 4, honest-but-curious version),
one run per summed statistic, with fresh keys each run:

Round 0 (AdvertiseKeys)
    Client u draws two X25519 key pairs: (c_u^PK, c_u^SK) for the channel that
    carries secret shares and (s_u^PK, s_u^SK) for mask agreement, and sends
    both public keys.  The server forwards them to u's neighbours.
Round 1 (ShareKeys)
    u draws a self-mask seed b_u and Shamir-shares b_u and s_u^SK (threshold
    t, :mod:`mechanisms.secagg.shamir`) among its neighbours and itself; the share
    for v is encrypted with AES-256-GCM under HKDF(X25519(c_u^SK, c_v^PK)),
    so the server relays ciphertexts it cannot read.
Round 2 (MaskedInputCollection)
    With s_uv = HKDF(X25519(s_u^SK, s_v^PK)) (= s_vu), u uploads
        y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)   (mod 2^64)
    where x_u is the fixed-point encoding (:mod:`mechanisms.secagg.fixed_point`)
    and PRG is the AES-256-CTR keystream read as uint64.
Round 3 (Unmasking)
    The server announces U3, the clients whose y_u arrived.  Each surviving
    client v sends, for every neighbour u, the share of b_u if u is in U3
    and the share of s_u^SK if u dropped before uploading -- never both for
    one u: the client picks the kind from U3 itself, and refuses to answer
    when U3 holds fewer than t members of its group.  The server rebuilds the seeds from t
    shares each, removes PRG(b_u) for u in U3 and the pair masks that
    survivors added with dropped clients, and decodes
        sum_{u in U3} x_u = sum_{u in U3} y_u - sum_{u in U3} PRG(b_u) -/+ (pair masks with U2 \\ U3).
    If fewer than t share holders of some client answer, the run aborts
    with :class:`ProtocolAbort`: it never releases a wrong sum.

SecAgg+ (Bell et al., "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020): with ``neighbours=k`` each client
masks with and shares to only its k neighbours in a k-regular graph (a
Harary graph under a random relabelling of the clients, their
practical construction; the relabelling is drawn from the key source, never from
the run's generator, so a server cannot predict it), cutting the per-client cost from O(K) to O(k).

The clients and the server are the state machines of
:mod:`mechanisms.secagg.masking.node` and :mod:`mechanisms.secagg.masking.server`, run here
by their in-process loop; the Flower app (:mod:`privfed.flower.secagg`) runs
the same classes over messages.

Threat model: an honest-but-curious server (and fewer than t colluding
clients) learns only the sum over U3 and which clients dropped.  With
``active=True`` the active-adversary version runs (signed keys checked
against a roster, a consistency round before any share is revealed; see
:mod:`mechanisms.secagg.masking.node`).  Key material comes from the operating
system's CSPRNG (``key_seed`` makes a run reproducible for tests only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from mechanisms.secagg import fixed_point
from mechanisms.secagg.crypto import (  # re-exported: the public names of this protocol
    ID_BYTES,
    PUBLIC_KEY_BYTES,
    SHARE_CIPHERTEXT_BYTES,
    UNMASK_ANSWER_BYTES,
    KeySource,
    ProtocolAbort,
    prg_buffer,
    prg_uint64,
)
from mechanisms.secagg.graph import group_size, ring_neighbours
from mechanisms.secagg.identity import make_roster
from mechanisms.secagg.masking.node import MaskingNode
from mechanisms.secagg.masking.server import MaskingServer, ServerView, run_in_process
from mechanisms.secagg.noise import check_add_noise, check_nonnegative, noise_rng, noise_share
from mechanisms.secagg.threat import DEFAULT_COLLUDERS, colluders_tolerated, default_threshold, survivor_parts
from privfed._linalg import one_blas_thread
from privfed._validation import check_memory, is_integer
from privfed._validation.seeds import check_seed
from privfed.errors import ConfigError, InputError

__all__ = [
    "ID_BYTES",
    "PUBLIC_KEY_BYTES",
    "SHARE_CIPHERTEXT_BYTES",
    "UNMASK_ANSWER_BYTES",
    "KeySource",
    "MaskedSumResult",
    "BYTES_PER_PAIR",
    "ProtocolAbort",
    "ServerView",
    "check_masking_size",
    "harary_graph",
    "harary_split_bound",
    "majority_threshold",
    "masked_sum",
    "prg_buffer",
    "prg_uint64",
]


# --------------------------------------------------------------------------- graph
def harary_graph(num_clients: int, k: int, rng: np.random.Generator) -> list[frozenset[int]]:
    """Neighbour sets of a k-regular Harary graph on randomly relabelled clients (SecAgg+).

    Clients are placed on a ring in the order of a random permutation and
    joined to the k/2 nearest on each side (k even; k >= K - 1 gives the
    complete graph).
    """
    K = int(num_clients)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2 or k % 2:
        raise ConfigError(
            f"neighbours must be an even integer >= 2 (the degree of the SecAgg+ graph), got {k!r}"
        )
    if k >= K - 1:
        return [frozenset(set(range(K)) - {u}) for u in range(K)]
    return ring_neighbours([int(v) for v in rng.permutation(K)], k)


def harary_split_bound(num_clients: int, k: int, removed_fraction: float) -> float:
    """Upper bound on the chance that the nodes left in a relabelled Harary graph fall apart (SecAgg+'s condition).

    Remove r = floor(removed_fraction * K) nodes (colluding with the server
    or dropped before uploading) chosen without regard to the relabelling,
    which is uniform and secret.  The others sit on the ring with their
    k/2 nearest on each side as neighbours, so they stay connected unless
    two disjoint runs of k/2 consecutive ring positions are both removed
    (one run leaves a path).  With K (K - 1) / 2 pairs of windows and
    k positions removed in both with probability
    prod_{i<k} (r - i) / (K - i):

        P(split) <= K (K - 1) / 2 * prod_{i<k} (r - i) / (K - i)   (capped at 1).

    While they stay connected, the server learns only the sum over every
    honest uploader (with colluders: minus nothing it could not compute);
    a split would give it the sum of each part separately.  Complete
    graphs (k >= K - 1) never split: 0.
    """
    K, k = int(num_clients), int(k)
    if not 0 <= removed_fraction < 1:
        raise ConfigError(f"removed_fraction must lie in [0, 1), got {removed_fraction!r}")
    if k < 2 or k % 2:
        raise ConfigError(f"k must be an even integer >= 2 (the degree of the SecAgg+ graph), got {k!r}")
    if k >= K - 1:
        return 0.0
    r = int(np.floor(removed_fraction * K))
    if r < k:
        return 0.0
    p = 1.0
    for i in range(k):
        p *= (r - i) / (K - i)
    return min(1.0, K * (K - 1) / 2 * p)


#: Memory one (node, share holder) pair costs an in-process run: the neighbour sets of the nodes and
#: the server, the key agreements and the relayed share messages (measured 0.7-1.1 KiB on 64-bit CPython).
BYTES_PER_PAIR = 1024


def check_masking_size(num_clients: int, neighbours: int | None, name: str = "statistic") -> None:
    """Refuse, before any neighbour set is built, an in-process run that cannot fit in memory.

    Every node holds its group (itself and its neighbours: all K on the complete graph), so
    the run needs about :data:`BYTES_PER_PAIR` x K x group bytes.
    """
    K = int(num_clients)
    size = group_size(K, None if neighbours is None or neighbours >= K - 1 else neighbours)
    graph = "the complete graph" if size == K else f"a {neighbours}-regular graph"
    check_memory(
        float(BYTES_PER_PAIR) * K * size,
        f"{name}: masking {K:,} clients in one process on {graph} ({K:,} x {size:,} node-holder pairs)",
        "mask with few neighbours each (PairwiseMasking(neighbours=k), SecAgg+, e.g. k = 2 log2 K) or run "
        "the clients as separate processes with the Flower app (python -m privfed.flower)",
    )


def majority_threshold(group_size: int) -> int:
    """Majority threshold floor(n/2) + 1 of a group of n share holders: the smallest :func:`masked_sum` takes
    (the default is :func:`mechanisms.secagg.threat.default_threshold`, which tolerates a colluding node)."""
    return int(group_size) // 2 + 1


# --------------------------------------------------------------------------- result
@dataclass
class MaskedSumResult:
    """Output of :func:`masked_sum`."""

    total: np.ndarray
    view: ServerView
    frac_bits: int
    threshold: int
    uploaded: tuple[int, ...]
    dropped_before_upload: tuple[int, ...]
    dropped_after_upload: tuple[int, ...]
    upload_bytes: dict[int, dict[str, int]]
    download_bytes: dict[int, int]
    seconds: dict[str, float]
    #: The parts the uploaders' graph falls into (each part's sum is decodable alone), smallest first.
    parts: tuple[tuple[int, ...], ...] = ()
    #: Every client's neighbours (the SecAgg+ graph, or everyone).
    graph: tuple[frozenset[int], ...] = ()
    #: Whether the statistic was summed as integers, exactly (no rounding); else within K 2^-(f+1), plus the
    #: float64 rounding of the result (2^-53 of it).
    exact: bool = False


# --------------------------------------------------------------------------- the run
def _as_sets(values: Iterable[int], K: int, name: str) -> frozenset[int]:
    # client indices only: the string "12" was clients 1 and 2, 1.7 client 1
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InputError(f"{name} must be a list of client indices, got {values!r}")
    values = list(values)
    if not all(is_integer(v) for v in values):
        raise InputError(f"{name} must hold client indices (integers), got {values[:5]!r}")
    s = frozenset(int(v) for v in values)
    bad = [v for v in s if not 0 <= v < K]
    if bad:
        raise InputError(f"{name} names client(s) {sorted(bad)[:5]} outside 0..{K - 1}")
    return s


#: Values of the stack read per block by :func:`stack_range` (1 MiB of float64: a block stays in a core's cache
#: between its min and its max).
RANGE_BLOCK = 1 << 17


def stack_range(flat: np.ndarray) -> tuple[float, float]:
    """The least and the largest value of ``flat`` (K, n), NaN if any value is NaN (min and max propagate it,
    and reach inf): a block of rows at a time, so that the max reads from the cache what the min just read
    (one pass over memory for rows of up to :data:`RANGE_BLOCK` values; a longer row is its own block, read
    twice), no temporary the size of the stack."""
    if not flat.size:
        return 0.0, 0.0
    rows = max(1, RANGE_BLOCK // max(1, flat.shape[1]))
    lo, hi = np.inf, -np.inf
    for a in range(0, flat.shape[0], rows):
        block = flat[a : a + rows]
        b_lo, b_hi = float(block.min()), float(block.max())
        if b_lo != b_lo or b_hi != b_hi:  # NaN (Python's min and max would pass it over)
            return np.nan, np.nan
        lo, hi = min(lo, b_lo), max(hi, b_hi)
    return lo, hi


def masked_sum(
    stack: np.ndarray,
    *,
    frac_bits: int = 32,
    integers: str | bool = "auto",
    threshold: int | None = None,
    neighbours: int | None = None,
    dropped_before_upload: Iterable[int] = (),
    dropped_after_upload: Iterable[int] = (),
    noise_std: float = 0.0,
    add_noise: Callable[[np.ndarray, float, np.random.Generator], np.ndarray] | None = None,
    rng: np.random.Generator | None = None,
    key_seed: int | bytes | None = None,
    value_bound: float | None = None,
    name: str = "statistic",
    active: bool = False,
    keep_view: bool = True,
) -> MaskedSumResult:
    """Sum the rows of ``stack`` (one per client) with pairwise masking; see the module docstring.

    Parameters
    ----------
    stack : array, shape (K, ...)
        Client k's statistic is ``stack[k]``.
    frac_bits : int
        Fractional bits f of the fixed-point encoding for real statistics;
        the sum is within K * 2^-(f+1) of the real sum per coordinate, plus the float64 rounding of the
        result (2^-53 of its magnitude, which passes K * 2^-(f+1) only at large f).
    integers : {"auto", True, False}
        ``True``: the statistic is integer (f = 0, exact; refused where K max|x|
        reaches 2^53, past which float64 holds no exact integers); ``"auto"``: f = 0
        when every value is a whole number, the sum stays below 2^53 and no noise
        is added (a public one-bit choice, true for counts and indicators), else
        ``frac_bits``.
    threshold : int, optional
        Shamir threshold t; defaults to :func:`mechanisms.secagg.threat.default_threshold` of each
        client's group (itself and its neighbours): the smallest that tolerates a colluding node; at
        least a majority.
    neighbours : int, optional
        Degree k of the SecAgg+ graph (even); ``None`` for the complete graph.
    dropped_before_upload, dropped_after_upload : iterables of int
        Clients that drop after sharing their keys but before uploading y_u
        (their input is not summed; their mask key is rebuilt) and clients
        that drop after uploading (their input is summed; their self-mask
        seed is rebuilt from the others' shares).
    noise_std : float
        Per-coordinate standard deviation of the Gaussian share each client
        adds to its input before encoding (distributed noise; 0 for none).
    add_noise : callable, optional
        ``add_noise(row, std, rng) -> noisy row`` draws a client's share (a
        noise backend's ``add_gaussian``); default: numpy normal draws.
    rng : numpy.random.Generator, optional
        Drives the graph relabelling and the noise shares.
    key_seed : int or bytes, optional
        Reproducible key material (tests only); ``None`` uses the OS CSPRNG.
    value_bound : float, optional
        Public bound on |x| per coordinate; defaults to the largest |x| in
        ``stack`` (what the clients would agree on).
    name : str
        What is being summed (error messages).
    active : bool
        Run the active-adversary version (signed keys from a roster made
        here, the consistency round); with ``neighbours`` the roster draws
        the SecAgg+ graph.
    keep_view : bool
        Keep what the server saw in the returned view (every masked
        upload, public key, relayed share message and signature: for the
        attacks and audits); ``False`` keeps none of it, as a deployed
        server does: each upload is folded into the sum as it arrives and
        dropped, each share message held only until it is relayed (the
        view then says only who uploaded).

    Returns
    -------
    MaskedSumResult

    Raises
    ------
    InputError
        If the statistic could overflow the ring.
    ProtocolAbort
        If fewer than t share holders of a client survive (no sum released).
    """
    t_start = time.perf_counter()
    rng = noise_rng(rng)
    add_noise = check_add_noise(add_noise)
    if key_seed is not None and not isinstance(key_seed, bytes):
        check_seed(key_seed, "key_seed")  # an integer in 0..2**64 - 1, or bytes, as every seed
    for flag, value in (("active", active), ("keep_view", keep_view)):
        if not isinstance(value, (bool, np.bool_)):  # "no" is a non-empty string: truthy
            raise ConfigError(f"{flag} must be True or False, got {value!r}")
    raw = fixed_point.as_stack(stack, name)
    X = raw.astype(np.float64, copy=False)
    if X.ndim < 1 or X.shape[0] < 2:
        raise InputError(
            f"{name}: secure aggregation needs a (K, ...) stack with K >= 2 clients, got {X.shape}"
        )
    K = X.shape[0]
    if neighbours is not None and (
        isinstance(neighbours, bool) or not isinstance(neighbours, (int, np.integer))
    ):
        raise ConfigError(f"neighbours must be an even integer >= 2 or None, got {neighbours!r}")
    check_masking_size(K, neighbours, name)
    shape = X.shape[1:]
    flat = X.reshape(K, -1)
    lo, hi = stack_range(flat)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InputError(f"{name} contains NaN/inf values; secure aggregation needs finite statistics")
    noise_std = check_nonnegative(noise_std, "noise_std")
    if value_bound is None:
        max_abs = max(-lo, hi)
    else:
        max_abs = check_nonnegative(value_bound, "value_bound")
        over = np.flatnonzero(np.abs(flat).max(axis=1) > max_abs) if flat.size else np.zeros(0, int)
        if over.size:
            # Each client checks its own input against the agreed bound before encoding it.
            raise InputError(
                f"{name}: client(s) {over[:5].tolist()} hold values outside the agreed bound "
                f"|x| <= {max_abs:g}; they refuse to encode them (the sum would wrap around the ring)"
            )
    integral = fixed_point.integer_encoding(flat, integers, noise_std, max(-lo, hi), name)
    f = 0 if integral else fixed_point.check_frac_bits(frac_bits)
    # Gaussian shares exceed 40 standard deviations with probability < 1e-340: a safe public bound.
    # the noise shares' bound, past float64 for a huge noise_std: refused as a ring overflow, naming noise_std
    noise_bound = min(K * 40.0 * noise_std * 2.0**f, 2.0**1023)
    fixed_point.check_ring_bound(max_abs, K, f, noise_bound=noise_bound, name=name)
    keys = KeySource(key_seed)
    if active and neighbours is not None:
        # The operator's roster draws the graph (make_roster below); here the degree is checked and sized.
        harary_graph(K, neighbours, np.random.default_rng(0))
        group_sizes = [group_size(K, neighbours)]
    else:
        # The SecAgg+ relabelling is key material: from the key source (OS entropy), never from ``rng``.
        graph = (
            harary_graph(K, neighbours, np.random.default_rng(int.from_bytes(keys(32), "little")))
            if neighbours is not None
            else [frozenset(set(range(K)) - {u}) for u in range(K)]
        )
        group_sizes = [len(g) + 1 for g in graph]
    low = majority_threshold(min(group_sizes))
    if threshold is not None and not is_integer(threshold):  # 3.7 was t = 3
        raise ConfigError(f"threshold must be an integer or None, got {threshold!r}")
    t = default_threshold(min(group_sizes)) if threshold is None else int(threshold)
    if not low <= t <= min(group_sizes):
        raise ConfigError(
            f"threshold must lie in [{low}, {min(group_sizes)}]: more than half of each client's share group "
            f"(so the server never holds t shares of both kinds for one client) and at most its size; got {threshold}"
        )
    before = _as_sets(dropped_before_upload, K, "dropped_before_upload")
    after = _as_sets(dropped_after_upload, K, "dropped_after_upload")
    if before & after:
        raise InputError(f"client(s) {sorted(before & after)} cannot drop both before and after uploading")

    session = keys(16)
    roster, ids = (None, [None] * K)
    if active:
        id_seed = (
            None
            if key_seed is None
            else b"identities"
            + (key_seed if isinstance(key_seed, bytes) else int(key_seed).to_bytes(16, "little"))
        )
        degree = None if neighbours is None or int(neighbours) >= K - 1 else int(neighbours)
        # The caller's threshold declares the colluders it tolerates (an explicit choice; the report says it).
        n = group_size(K, degree)
        roster, ids = make_roster(
            K, t, min(DEFAULT_COLLUDERS, colluders_tolerated(n, t)), seed=id_seed, degree=degree
        )
        graph = roster.graph
    server = MaskingServer(
        num_nodes=K,
        threshold=t,
        length=flat.shape[1],
        session=session,
        active=active,
        graph=graph,
        degree=roster.degree if active else None,
        frac_bits=f,
        name=name,
        keep_view=keep_view,
    )
    nodes = {
        u: MaskingNode(
            u,
            num_nodes=K,
            threshold=t,
            neighbours=graph[u],
            keys=keys,
            identity=ids[u],
            roster=roster,
        )
        for u in range(K)
    }

    def encoded(u: int) -> np.ndarray:
        return fixed_point.encode(noise_share(flat[u], noise_std, rng, add_noise), f)

    def silent(stage: str, u: int) -> bool:
        return (stage == "masked" and u in before) or (stage in ("consistency", "unmask") and u in after)

    clock = {"keys": time.perf_counter()}
    # Every node computes as a node on its own machine would, on one BLAS thread: a multithreaded
    # BLAS only spins on the small products of Shamir sharing (100 times a node's own work on a
    # loaded machine).
    with one_blas_thread():
        run_in_process(
            server,
            nodes,
            inputs=encoded,
            silent=silent,
            on_stage=lambda s: clock.__setitem__(s, time.perf_counter()),
        )
    view = server.view
    result = fixed_point.decode(server.total, f).reshape(shape)
    view.result = result
    t3 = time.perf_counter()
    names = {"keys": "public_keys", "shares": "shares", "masked": "masked_input", "unmask": "unmask"}
    if active:
        names["consistency"] = "consistency"
    up = {u: {v: int(server.bytes_up[u].get(k, 0)) for k, v in names.items()} for u in range(K)}
    t_setup = clock["keys"]
    return MaskedSumResult(
        total=result,
        view=view,
        frac_bits=f,
        threshold=t,
        uploaded=tuple(server.U3),
        dropped_before_upload=tuple(sorted(before)),
        dropped_after_upload=tuple(sorted(after)),
        upload_bytes=up,
        download_bytes=dict(server.bytes_down),
        parts=tuple(survivor_parts(graph, server.U3)),
        graph=tuple(frozenset(g) for g in graph),
        exact=bool(integral),
        seconds={
            "encode_checks": t_setup - t_start,
            "key_setup": clock["shares"] - t_setup,
            "masking": clock["masked"] - clock["shares"],
            "consistency": clock.get("consistency", clock["masked"]) - clock["masked"],
            "unmasking": t3 - clock.get("consistency", clock["masked"]),
            "total": t3 - t_start,
        },
    )
