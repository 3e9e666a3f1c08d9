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
    t, :mod:`mechanisms.shamir`) among its neighbours and itself; the share
    for v is encrypted with AES-256-GCM under HKDF(X25519(c_u^SK, c_v^PK)),
    so the server relays ciphertexts it cannot read.
Round 2 (MaskedInputCollection)
    With s_uv = HKDF(X25519(s_u^SK, s_v^PK)) (= s_vu), u uploads
        y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)   (mod 2^64)
    where x_u is the fixed-point encoding (:mod:`mechanisms.fixed_point`)
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

Threat model: an honest-but-curious server (and fewer than t colluding
clients) learns only the sum over U3 and which clients dropped.  Key
material comes from the operating system's CSPRNG (``key_seed`` makes a
run reproducible for tests only).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mechanisms import fixed_point, shamir
from mechanisms.secagg_crypto import ProtocolAbort
from mechanisms.secagg_identity import make_roster
from mechanisms.secagg_node import MaskingNode
from mechanisms.secagg_server import MaskingServer, run_in_process
from privfed.errors import ConfigError, InputError, PrivfedError

__all__ = [
    "KeySource",
    "MaskedSumResult",
    "ProtocolAbort",
    "ServerView",
    "default_threshold",
    "harary_graph",
    "masked_sum",
    "prg_buffer",
    "prg_uint64",
]

PUBLIC_KEY_BYTES = 32
ID_BYTES = 4
GCM_NONCE_BYTES = 12
GCM_TAG_BYTES = 16
#: Plaintext of one encrypted share message: sender id, receiver id, share of s^SK, share of b.
SHARE_PLAINTEXT_BYTES = 2 * ID_BYTES + 2 * shamir.SHARE_BYTES
SHARE_CIPHERTEXT_BYTES = GCM_NONCE_BYTES + SHARE_PLAINTEXT_BYTES + GCM_TAG_BYTES
#: One unmasking answer: the client id it is about, a one-byte kind, the share.
UNMASK_ANSWER_BYTES = ID_BYTES + 1 + shamir.SHARE_BYTES

_INFO_PAIR = b"privfed secagg pair mask"
_INFO_SELF = b"privfed secagg self mask"
_INFO_CHANNEL = b"privfed secagg share channel"


# --------------------------------------------------------------------------- randomness
class KeySource:
    """Cryptographic random bytes for key material.

    ``seed=None`` (the default) reads the operating system's CSPRNG.  A seed
    gives a ChaCha20 keystream keyed by SHA-256(seed): reproducible runs for
    tests only; never deploy with a seed.
    """

    def __init__(self, seed: int | bytes | None = None) -> None:
        self.seeded = seed is not None
        if seed is None:
            self._enc = None
        else:
            raw = seed if isinstance(seed, bytes) else int(seed).to_bytes(16, "little", signed=False)
            key = hashlib.sha256(b"privfed key source" + raw).digest()
            self._enc = Cipher(algorithms.ChaCha20(key, b"\x00" * 16), mode=None).encryptor()

    def __call__(self, n: int) -> bytes:
        if self._enc is None:
            return os.urandom(n)
        return self._enc.update(b"\x00" * n)

    def field_element(self) -> int:
        """A uniform 32-byte integer below :data:`shamir.PRIME` (rejection sampling)."""
        while True:
            v = int.from_bytes(self(32), "little")
            if v < shamir.PRIME:
                return v


def prg_uint64(key: bytes, n: int, buffer: bytearray | None = None) -> np.ndarray:
    """n pseudorandom uint64 from the AES-256-CTR keystream under ``key`` (32 bytes), zero IV.

    Each key is used for one expansion only (fresh per pair and run).  With
    ``buffer`` (from :func:`prg_buffer`) the keystream is written there and
    the returned array is a view of it, valid until the next call.
    """
    if n == 0:
        return np.zeros(0, np.uint64)
    enc = Cipher(algorithms.AES(key), modes.CTR(b"\x00" * 16)).encryptor()
    buf = prg_buffer(n) if buffer is None else buffer
    enc.update_into(_zeros(8 * n), buf)
    return np.frombuffer(buf, dtype=np.uint64, count=n)


def prg_buffer(n: int) -> bytearray:
    """A reusable output buffer for :func:`prg_uint64` of ``n`` values (one AES block of slack)."""
    return bytearray(8 * n + 16)


_ZEROS = bytes(0)


def _zeros(nbytes: int) -> memoryview:
    """A shared read-only buffer of ``nbytes`` zero bytes (the CTR plaintext)."""
    global _ZEROS
    if len(_ZEROS) < nbytes:
        _ZEROS = bytes(nbytes)
    return memoryview(_ZEROS)[:nbytes]


#: Values per keystream block in :func:`_add_masks` (256 KiB of scratch whatever the vector length).
_MASK_BLOCK = 32_768
#: Cipher contexts held at once by :func:`_add_masks`.
_KEY_GROUP = 256


def _add_masks(y: np.ndarray, keys: list[bytes], signs: list[bool]) -> None:
    """In place, y += PRG(key) where the sign is True and y -= PRG(key) where False (mod 2^64).

    PRG(key) is :func:`prg_uint64`'s keystream (AES-256-CTR, zero IV), produced
    block by block from one cipher context per key (CTR continues across
    blocks), so the scratch buffer stays small for long vectors.  ``y`` is a
    contiguous uint64 vector.
    """
    n = y.size
    if n == 0 or not keys:
        return
    block = min(n, _MASK_BLOCK)
    buf = prg_buffer(block)
    stream = np.frombuffer(buf, dtype=np.uint64, count=block)
    zeros = _zeros(8 * block)
    iv = b"\x00" * 16
    for g in range(0, len(keys), _KEY_GROUP):
        contexts = []
        for k, plus in zip(keys[g : g + _KEY_GROUP], signs[g : g + _KEY_GROUP]):
            update = Cipher(algorithms.AES(k), modes.CTR(iv)).encryptor().update_into
            contexts.append((update, np.add if plus else np.subtract))
        for start in range(0, n, block):
            part = y[start : start + block]
            m = part.size
            plain, mask = (zeros, stream) if m == block else (zeros[: 8 * m], stream[:m])
            for update, op in contexts:
                update(plain, buf)
                op(part, mask, out=part)


def _hkdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def _pub_bytes(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _private_key(k: int) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(k.to_bytes(32, "little"))


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
    perm = rng.permutation(K)
    pos = np.empty(K, dtype=np.int64)
    pos[perm] = np.arange(K)
    out = []
    for u in range(K):
        p = pos[u]
        out.append(frozenset(int(perm[(p + j) % K]) for j in range(-(k // 2), k // 2 + 1) if j != 0))
    return out


def default_threshold(group_size: int) -> int:
    """Majority threshold floor(n/2) + 1 of a group of n share holders."""
    return int(group_size) // 2 + 1


# --------------------------------------------------------------------------- server view
@dataclass
class ServerView:
    """Everything the server received during one run, and the sum it output.

    No field holds an individual client's statistic: uploads are masked ring
    elements, shares arrive encrypted, and the unmasking answers are shares
    of seeds (self-mask seeds of uploaders, mask keys of dropped clients).
    """

    num_clients: int
    frac_bits: int
    public_keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    encrypted_shares: dict[tuple[int, int], bytes] = field(default_factory=dict)
    masked_uploads: dict[int, np.ndarray] = field(default_factory=dict)
    uploaded: tuple[int, ...] = ()
    answered: tuple[int, ...] = ()
    self_seed_shares: dict[int, dict[int, int]] = field(default_factory=dict)
    key_shares: dict[int, dict[int, int]] = field(default_factory=dict)
    result: np.ndarray | None = None

    def arrays(self) -> Iterator[np.ndarray]:
        """Every numeric array in the view (masked uploads and the result)."""
        yield from self.masked_uploads.values()
        if self.result is not None:
            yield self.result


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


# --------------------------------------------------------------------------- client
class _Client:
    """One client's state in a run (keys, received shares, masked input)."""

    def __init__(self, index: int, neighbours: frozenset[int], keys: KeySource, session: bytes) -> None:
        self.u = index
        self.nbrs = neighbours
        self.keys = keys
        self.session = session
        self.c_sk_int = keys.field_element()
        self.s_sk_int = keys.field_element()
        self.b = keys.field_element()
        self.c_sk = _private_key(self.c_sk_int)
        self.s_sk = _private_key(self.s_sk_int)
        self.received: dict[int, bytes] = {}
        # Which kind of share this client revealed for each peer: never both kinds for one peer.
        self.revealed: dict[int, str] = {}
        self.peer_keys: dict[int, tuple[X25519PublicKey, X25519PublicKey]] = {}
        self._channels: dict[int, AESGCM] = {}

    # Round 0
    def advertise(self) -> tuple[X25519PublicKey, X25519PublicKey]:
        """The public keys (c_u^PK, s_u^PK); the server relays them (32 bytes each on the wire)."""
        return self.c_sk.public_key(), self.s_sk.public_key()

    def _channel(self, v: int) -> AESGCM:
        if v not in self._channels:
            secret = self.c_sk.exchange(self.peer_keys[v][0])
            self._channels[v] = AESGCM(_hkdf(secret, _INFO_CHANNEL + self.session))
        return self._channels[v]

    # Round 1
    def share_keys(
        self, peer_keys: dict[int, tuple[X25519PublicKey, X25519PublicKey]], threshold: int
    ) -> dict[int, bytes]:
        self.peer_keys = dict(peer_keys)
        holders = sorted(self.nbrs | {self.u})
        xs = [v + 1 for v in holders]
        s_shares, b_shares = shamir.split_many([self.s_sk_int, self.b], xs, threshold, self.keys)
        out = {}
        for v in holders:
            msg = (
                self.u.to_bytes(ID_BYTES, "little")
                + v.to_bytes(ID_BYTES, "little")
                + s_shares[v + 1].to_bytes(32, "little")
                + b_shares[v + 1].to_bytes(32, "little")
            )
            if v == self.u:
                self.own_share = msg
                continue
            nonce = self.keys(GCM_NONCE_BYTES)
            out[v] = nonce + self._channel(v).encrypt(nonce, msg, self.session)
        return out

    def receive(self, ciphertexts: dict[int, bytes]) -> None:
        self.received = dict(ciphertexts)

    # Round 2
    def masked_input(self, x: np.ndarray, alive: frozenset[int]) -> np.ndarray:
        mask_keys = [_hkdf(self.b.to_bytes(32, "little"), _INFO_SELF + self.session)]
        signs = [True]
        info = _INFO_PAIR + self.session
        for v in sorted(self.nbrs & alive):
            mask_keys.append(_hkdf(self.s_sk.exchange(self.peer_keys[v][1]), info))
            signs.append(v > self.u)
        y = np.array(x, dtype=np.uint64, order="C")
        _add_masks(y, mask_keys, signs)
        return y

    # Round 3
    def unmask(
        self, uploaded: frozenset[int], shared: frozenset[int], threshold: int
    ) -> dict[int, tuple[str, int]]:
        group = self.nbrs | {self.u}
        if len(uploaded & group) < threshold:
            raise ProtocolAbort(
                f"client {self.u} refuses to unmask: only {len(uploaded & group)} of its {len(group)} "
                f"group members uploaded, below the threshold t={threshold}; the sum is not released"
            )
        answers = {}
        for u in sorted(group & shared):
            if u == self.u:
                msg = self.own_share
            else:
                ct = self.received[u]
                peer = self._channel(u)
                try:
                    msg = peer.decrypt(ct[:GCM_NONCE_BYTES], ct[GCM_NONCE_BYTES:], self.session)
                except InvalidTag:
                    raise ProtocolAbort(
                        f"client {self.u} got a share message from client {u} that fails authentication "
                        "(tampered or corrupted); aborting, no sum is released"
                    ) from None
            sender, receiver = int.from_bytes(msg[:4], "little"), int.from_bytes(msg[4:8], "little")
            if sender != u or receiver != self.u:
                raise ProtocolAbort(f"client {self.u} got a share message with wrong ids; aborting")
            s_share = int.from_bytes(msg[8:40], "little")
            b_share = int.from_bytes(msg[40:72], "little")
            # Exactly one kind per client: b for uploaders, s^SK for those who dropped before uploading,
            # and never the other kind later (a server asking twice with different uploader lists).
            kind = "b" if u in uploaded else "s"
            if self.revealed.setdefault(u, kind) != kind:
                raise ProtocolAbort(
                    f"client {self.u} already revealed its {self.revealed[u]!r} share of client {u}; revealing "
                    f"the {kind!r} share too would unmask client {u}'s input: refused"
                )
            answers[u] = (kind, b_share if kind == "b" else s_share)
        return answers


# --------------------------------------------------------------------------- the run
def _as_sets(values: Iterable[int], K: int, name: str) -> frozenset[int]:
    s = frozenset(int(v) for v in values)
    bad = [v for v in s if not 0 <= v < K]
    if bad:
        raise InputError(f"{name} names client(s) {sorted(bad)[:5]} outside 0..{K - 1}")
    return s


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
) -> MaskedSumResult:
    """Sum the rows of ``stack`` (one per client) with pairwise masking; see the module docstring.

    Parameters
    ----------
    stack : array, shape (K, ...)
        Client k's statistic is ``stack[k]``.
    frac_bits : int
        Fractional bits f of the fixed-point encoding for real statistics;
        the sum is within K * 2^-(f+1) of the real sum per coordinate.
    integers : {"auto", True, False}
        ``True``: the statistic is integer (f = 0, exact); ``"auto"``: f = 0
        when every value is a whole number and no noise is added (a public
        one-bit choice, true for counts and indicators), else ``frac_bits``.
    threshold : int, optional
        Shamir threshold t; defaults to a majority of each client's group
        (itself and its neighbours).
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
        here, the consistency round); complete graph only.

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
    rng = rng if rng is not None else np.random.default_rng()
    X = np.asarray(stack, dtype=np.float64)
    if X.ndim < 1 or X.shape[0] < 2:
        raise InputError(
            f"{name}: secure aggregation needs a (K, ...) stack with K >= 2 clients, got {X.shape}"
        )
    K = X.shape[0]
    shape = X.shape[1:]
    flat = X.reshape(K, -1)
    # min and max propagate NaN and reach inf: one pass each, no temporary the size of the stack.
    lo, hi = (float(flat.min()), float(flat.max())) if flat.size else (0.0, 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InputError(f"{name} contains NaN/inf values; secure aggregation needs finite statistics")
    if not (np.isfinite(noise_std) and noise_std >= 0):
        raise ConfigError(f"noise_std must be finite and >= 0, got {noise_std}")
    if integers not in ("auto", True, False):
        raise ConfigError(f"integers must be 'auto', True or False, got {integers!r}")
    if integers is True and not fixed_point.is_integral(flat):
        raise InputError(f"{name} was declared integer but holds fractional values; pass integers='auto'")
    integral = integers is True or (integers == "auto" and noise_std == 0 and fixed_point.is_integral(flat))
    f = 0 if integral else fixed_point.check_frac_bits(frac_bits)
    if value_bound is None:
        max_abs = max(-lo, hi)
    else:
        max_abs = float(value_bound)
        if not (max_abs >= 0 and np.isfinite(max_abs)):
            raise ConfigError(f"value_bound must be finite and >= 0, got {value_bound!r}")
        over = np.flatnonzero(np.abs(flat).max(axis=1) > max_abs) if flat.size else np.zeros(0, int)
        if over.size:
            # Each client checks its own input against the agreed bound before encoding it.
            raise InputError(
                f"{name}: client(s) {over[:5].tolist()} hold values outside the agreed bound "
                f"|x| <= {max_abs:g}; they refuse to encode them (the sum would wrap around the ring)"
            )
    # Gaussian shares exceed 40 standard deviations with probability < 1e-340: a safe public bound.
    fixed_point.check_ring_bound(max_abs, K, f, noise_bound=K * 40.0 * noise_std * 2.0**f, name=name)
    if active and neighbours is not None:
        raise ConfigError("the active-adversary version runs on the complete graph: drop neighbours or active")

    keys = KeySource(key_seed)
    # The SecAgg+ relabelling is key material: from the key source (OS entropy), never from ``rng``.
    graph = (
        harary_graph(K, neighbours, np.random.default_rng(int.from_bytes(keys(32), "little")))
        if neighbours is not None
        else [frozenset(set(range(K)) - {u}) for u in range(K)]
    )
    group_sizes = [len(g) + 1 for g in graph]
    low = default_threshold(min(group_sizes))
    t = low if threshold is None else int(threshold)
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
        id_seed = None if key_seed is None else b"identities" + (
            key_seed if isinstance(key_seed, bytes) else int(key_seed).to_bytes(16, "little"))
        roster, ids = make_roster(K, t, seed=id_seed)
    server = MaskingServer(num_nodes=K, threshold=t, length=flat.shape[1], session=session, active=active,
                           graph=None if active else graph, frac_bits=f, name=name)
    nodes = {u: MaskingNode(u, num_nodes=K, threshold=t, neighbours=None if active else graph[u], keys=keys,
                            identity=ids[u], roster=roster) for u in range(K)}

    def encoded(u: int) -> np.ndarray:
        row = flat[u]
        if noise_std > 0:
            row = add_noise(row, noise_std, rng) if add_noise is not None else row + rng.normal(0.0, noise_std, row.shape)
        return fixed_point.encode(row, f)

    def silent(stage: str, u: int) -> bool:
        return (stage == "masked" and u in before) or (stage in ("consistency", "unmask") and u in after)

    clock = {"keys": time.perf_counter()}
    run_in_process(server, nodes, inputs=encoded, silent=silent,
                   on_stage=lambda s: clock.__setitem__(s, time.perf_counter()))
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
        seconds={
            "encode_checks": t_setup - t_start,
            "key_setup": clock["shares"] - t_setup,
            "masking": clock["masked"] - clock["shares"],
            "consistency": clock.get("consistency", clock["masked"]) - clock["masked"],
            "unmasking": t3 - clock.get("consistency", clock["masked"]),
            "total": t3 - t_start,
        },
    )


def _legacy_masked_sum(
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
) -> MaskedSumResult:
    """Sum the rows of ``stack`` (one per client) with pairwise masking; see the module docstring.

    Parameters
    ----------
    stack : array, shape (K, ...)
        Client k's statistic is ``stack[k]``.
    frac_bits : int
        Fractional bits f of the fixed-point encoding for real statistics;
        the sum is within K * 2^-(f+1) of the real sum per coordinate.
    integers : {"auto", True, False}
        ``True``: the statistic is integer (f = 0, exact); ``"auto"``: f = 0
        when every value is a whole number and no noise is added (a public
        one-bit choice, true for counts and indicators), else ``frac_bits``.
    threshold : int, optional
        Shamir threshold t; defaults to a majority of each client's group
        (itself and its neighbours).
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
    rng = rng if rng is not None else np.random.default_rng()
    X = np.asarray(stack, dtype=np.float64)
    if X.ndim < 1 or X.shape[0] < 2:
        raise InputError(
            f"{name}: secure aggregation needs a (K, ...) stack with K >= 2 clients, got {X.shape}"
        )
    K = X.shape[0]
    shape = X.shape[1:]
    flat = X.reshape(K, -1)
    # min and max propagate NaN and reach inf: one pass each, no temporary the size of the stack.
    lo, hi = (float(flat.min()), float(flat.max())) if flat.size else (0.0, 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InputError(f"{name} contains NaN/inf values; secure aggregation needs finite statistics")
    if not (np.isfinite(noise_std) and noise_std >= 0):
        raise ConfigError(f"noise_std must be finite and >= 0, got {noise_std}")
    if integers not in ("auto", True, False):
        raise ConfigError(f"integers must be 'auto', True or False, got {integers!r}")
    if integers is True and not fixed_point.is_integral(flat):
        raise InputError(f"{name} was declared integer but holds fractional values; pass integers='auto'")
    integral = integers is True or (integers == "auto" and noise_std == 0 and fixed_point.is_integral(flat))
    f = 0 if integral else fixed_point.check_frac_bits(frac_bits)
    if value_bound is None:
        max_abs = max(-lo, hi)
    else:
        max_abs = float(value_bound)
        if not (max_abs >= 0 and np.isfinite(max_abs)):
            raise ConfigError(f"value_bound must be finite and >= 0, got {value_bound!r}")
        over = np.flatnonzero(np.abs(flat).max(axis=1) > max_abs) if flat.size else np.zeros(0, int)
        if over.size:
            # Each client checks its own input against the agreed bound before encoding it.
            raise InputError(
                f"{name}: client(s) {over[:5].tolist()} hold values outside the agreed bound "
                f"|x| <= {max_abs:g}; they refuse to encode them (the sum would wrap around the ring)"
            )
    # Gaussian shares exceed 40 standard deviations with probability < 1e-340: a safe public bound.
    fixed_point.check_ring_bound(max_abs, K, f, noise_bound=K * 40.0 * noise_std * 2.0**f, name=name)

    keys = KeySource(key_seed)
    # The SecAgg+ relabelling is key material: from the key source (OS entropy), never from ``rng``.
    graph = (
        harary_graph(K, neighbours, np.random.default_rng(int.from_bytes(keys(32), "little")))
        if neighbours is not None
        else [frozenset(set(range(K)) - {u}) for u in range(K)]
    )
    group_sizes = [len(g) + 1 for g in graph]
    low = default_threshold(min(group_sizes))
    t = low if threshold is None else int(threshold)
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
    view = ServerView(num_clients=K, frac_bits=f)
    up = {u: {"public_keys": 0, "shares": 0, "masked_input": 0, "unmask": 0} for u in range(K)}
    down = {u: 0 for u in range(K)}

    # Round 0: advertise keys.
    t0 = time.perf_counter()
    clients = [_Client(u, graph[u], keys, session) for u in range(K)]
    advertised = {c.u: c.advertise() for c in clients}
    for u, (c_pk, s_pk) in advertised.items():
        view.public_keys[u] = (_pub_bytes(c_pk), _pub_bytes(s_pk))
        up[u]["public_keys"] = 2 * PUBLIC_KEY_BYTES
    # Round 1: share keys (the server relays ciphertexts).
    inbox: dict[int, dict[int, bytes]] = {u: {} for u in range(K)}
    for c in clients:
        peers = {v: advertised[v] for v in c.nbrs}
        down[c.u] += len(peers) * (ID_BYTES + 2 * PUBLIC_KEY_BYTES)
        for v, ct in c.share_keys(peers, t).items():
            view.encrypted_shares[(c.u, v)] = ct
            inbox[v][c.u] = ct
            up[c.u]["shares"] += ID_BYTES + len(ct)
            down[v] += ID_BYTES + len(ct)
    for c in clients:
        c.receive(inbox[c.u])
    shared = frozenset(range(K))  # U2: everyone completed ShareKeys
    t1 = time.perf_counter()

    # Round 2: masked inputs (each client encodes its own row, plus its noise share).
    uploaded = frozenset(shared - before)
    for c in clients:
        if c.u in before:
            continue
        row = flat[c.u]
        if noise_std > 0:
            row = (
                add_noise(row, noise_std, rng)
                if add_noise is not None
                else row + rng.normal(0.0, noise_std, row.shape)
            )
        y = c.masked_input(fixed_point.encode(row, f), shared)
        view.masked_uploads[c.u] = y
        up[c.u]["masked_input"] = 8 * y.size
    t2 = time.perf_counter()
    view.uploaded = tuple(sorted(uploaded))

    if len(uploaded) < 2:
        raise ProtocolAbort(
            f"{name}: only {len(uploaded)} input(s) uploaded; a sum of fewer than 2 inputs reveals them, "
            "so no sum is released"
        )
    # Round 3: unmasking.
    answered = frozenset(uploaded - after)
    view.answered = tuple(sorted(answered))
    b_shares: dict[int, dict[int, int]] = {u: {} for u in uploaded}
    s_shares: dict[int, dict[int, int]] = {u: {} for u in shared - uploaded}
    for c in clients:
        if c.u not in answered:
            continue
        down[c.u] += ID_BYTES * len(uploaded)
        for u, (kind, share) in c.unmask(uploaded, shared, t).items():
            (b_shares if kind == "b" else s_shares)[u][c.u + 1] = share
            up[c.u]["unmask"] += UNMASK_ANSWER_BYTES
    view.self_seed_shares = b_shares
    view.key_shares = s_shares

    total = np.zeros(flat.shape[1], dtype=np.uint64)
    for u in sorted(uploaded):
        total += view.masked_uploads[u]
    coeff_cache: dict[tuple[int, ...], list[int]] = {}

    def recover(shares: dict[int, int], u: int, what: str) -> int:
        if len(shares) < t:
            raise ProtocolAbort(
                f"{name}: the {what} of client {u} cannot be rebuilt: {len(shares)} of its share holders "
                f"answered, below the threshold t={t} (too many dropouts); no sum is released"
            )
        xs = tuple(list(shares)[:t])
        if xs not in coeff_cache:
            coeff_cache[xs] = shamir.lagrange_at_zero(xs)
        return shamir.combine(shares, t, coeff_cache[xs])

    mask_keys, signs = [], []
    for u in sorted(uploaded):
        b = recover(b_shares[u], u, "self-mask seed")
        mask_keys.append(_hkdf(b.to_bytes(32, "little"), _INFO_SELF + session))
        signs.append(False)
    for u in sorted(shared - uploaded):
        s_sk = _private_key(recover(s_shares[u], u, "mask key"))
        for v in sorted(graph[u] & uploaded):
            mask_keys.append(_hkdf(s_sk.exchange(advertised[v][1]), _INFO_PAIR + session))
            # v added +m if u > v, -m if u < v: undo it.
            signs.append(u < v)
    _add_masks(total, mask_keys, signs)
    result = fixed_point.decode(total, f).reshape(shape)
    view.result = result
    t3 = time.perf_counter()
    return MaskedSumResult(
        total=result,
        view=view,
        frac_bits=f,
        threshold=t,
        uploaded=tuple(sorted(uploaded)),
        dropped_before_upload=tuple(sorted(before)),
        dropped_after_upload=tuple(sorted(after)),
        upload_bytes=up,
        download_bytes=down,
        seconds={
            "encode_checks": t0 - t_start,
            "key_setup": t1 - t0,
            "masking": t2 - t1,
            "unmasking": t3 - t2,
            "total": t3 - t_start,
        },
    )
