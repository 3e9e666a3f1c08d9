"""The multi-round FedLog protocol itself (Yu et al., Algorithm 1): clients, their bodies, one round, R rounds.

Every round each client trains its own body against the broadcast head and computes its augmented
statistic; the round's release (:class:`privfed.rounds.release.RoundRelease`: the release plan of
that statistic, one trace a round) gives the server's MAP head.  The pieces (:func:`client_update`,
:func:`client_statistic`, :func:`server_step`, :func:`initial_head`) also run the protocol in
another loop (the Flower app).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from mechanisms.dp.calibration import check_count, check_nonnegative
from privfed.errors import ConfigError, InputError
from privfed.rounds.bodies import (
    FAMILIES,
    FEATURE_DIM,
    augment,
    client_features,
    features,
    make_body,
    public_body,
)
from privfed.rounds.release import RoundRelease, RoundsDP, released_statistic

if TYPE_CHECKING:
    from privfed.rounds.config import RoundsConfig

__all__ = [
    "RoundsClient",
    "RoundsSetup",
    "accuracy",
    "assign_families",
    "client_statistic",
    "client_update",
    "evaluate",
    "head_eta",
    "init_body",
    "initial_head",
    "personal_test_split",
    "run_fedlog",
    "server_step",
    "train_body",
]


# ---------------------------------------------------------------- clients and their bodies
def assign_families(num_clients: int, families: Sequence[str], seed: int) -> list[str]:
    """Seeded balanced assignment: client k gets ``families[perm[k] mod F]``."""
    families = tuple(families)
    for f in families:
        if f not in FAMILIES:
            raise ConfigError(f"unknown body family {f!r}; choose from {list(FAMILIES)}")
    if not families:
        raise ConfigError("families must name at least one body family")
    num_clients, seed = check_count(num_clients, "num_clients"), check_count(seed, "seed", low=0)
    perm = np.random.default_rng([seed, 0xA5]).permutation(num_clients)
    return [families[int(p) % len(families)] for p in perm]


# ---------------------------------------------------------------- data
def personal_test_split(
    train_counts: np.ndarray, test_labels: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Client of every test sample, distributed like the training data (the paper's personalised test).

    For each class c the test samples of class c are shuffled and cut over the
    clients holding class c, in proportion to their training counts n_kc.
    Returns an int array (N_test,), -1 for a class no client holds.
    """
    K, C = train_counts.shape
    out = np.full(test_labels.shape[0], -1, dtype=np.int64)
    for c in range(C):
        idx = rng.permutation(np.flatnonzero(test_labels == c))
        w = train_counts[:, c].astype(np.float64)
        if w.sum() <= 0 or idx.size == 0:
            continue
        cuts = np.rint(np.cumsum(w) / w.sum() * idx.size).astype(np.int64)
        start = 0
        for k in range(K):
            out[idx[start : cuts[k]]] = k
            start = cuts[k]
    return out


# ---------------------------------------------------------------- training pieces
class RoundsClient:
    """One client's private state: images, labels, body, optimiser, data-order generator."""

    def __init__(self, k, x, y, xt, yt, body, lr, seed):
        self.k = k
        self.x, self.y, self.xt, self.yt = x, y, xt, yt
        self.body = body
        self.opt = torch.optim.Adam(body.parameters(), lr=lr)
        self.gen = torch.Generator().manual_seed(
            int(np.random.default_rng([seed, 0xB0D7, k]).integers(2**62))
        )


def train_body(client: RoundsClient, head_eta: torch.Tensor, epochs: int, batch_size: int, clip_fn) -> None:
    """E epochs of cross-entropy of softmax(eta phi) with the head fixed (Eq. 13)."""
    F = torch.nn.functional
    body = client.body
    body.train()
    n = client.y.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=client.gen)
        for start in range(0, n, batch_size):
            b = perm[start : start + batch_size]
            logits = augment(features(body, client.x[b], clip_fn)) @ head_eta.T
            loss = F.cross_entropy(logits, client.y[b])
            client.opt.zero_grad()
            loss.backward()
            client.opt.step()


def _images(x) -> torch.Tensor:
    """A client's images as the float32 tensor the bodies take (a numpy array is converted; else an InputError)."""
    if isinstance(x, np.ndarray) and x.dtype.kind in "iuf":
        x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise InputError(
            f"x must be the client's images as a float tensor (or numpy array), got {type(x).__name__}"
        )
    bad = int((~torch.isfinite(x)).sum()) if x.numel() else 0
    if bad:  # else NaN runs through the body into the statistic (and the model) without a word
        raise InputError(
            f"x holds {bad} NaN or infinite value(s) among the client's images; drop or repair those images"
        )
    return x


def client_statistic(
    body: nn.Module, x: torch.Tensor, y: torch.Tensor, *, num_classes: int = 10, clip_fn=None
) -> np.ndarray:
    """One client's upload: the per-class sums of its augmented features [1, f] (C, m), counts in column 0.

    ``clip_fn`` is the clipping the mechanism requires (``RoundsDP.clip_tensor``), None without DP.
    """
    C = check_count(num_classes, "num_classes")
    yk = np.asarray(y.numpy() if isinstance(y, torch.Tensor) else y)
    if (
        yk.ndim != 1
        or yk.size != len(x)
        or (yk.size and (yk.dtype.kind not in "iu" or yk.min() < 0 or yk.max() >= C))
    ):
        raise InputError(
            f"y must hold one label in 0..{C - 1} per sample of x ({len(x)}), got {yk.size} of dtype {yk.dtype}"
        )
    yk = yk.astype(np.int64)
    Fk = client_features(body, _images(x), clip_fn)
    if not np.isfinite(Fk).all():
        raise InputError(
            "the body's features of this client's images are not finite (NaN or inf): the body's weights "
            "or the images' scale overflowed; nothing was computed for the upload"
        )
    A = np.zeros((num_classes, Fk.shape[1] + 1))
    A[:, 0] = np.bincount(yk, minlength=num_classes)
    for cls in np.unique(yk):
        A[cls, 1:] = Fk[yk == cls].sum(axis=0)
    return A


def client_update(
    body: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    head_eta: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    num_classes: int = 10,
    clip_fn=None,
) -> np.ndarray:
    """One client's round: train ``body`` for ``epochs`` against the broadcast head, then its statistic.

    ``head_eta`` (C, m) is the head [bias, weight] the server broadcast; ``body``,
    ``optimizer`` and ``generator`` (the data order) are the client's private state and
    are updated in place.  Returns :func:`client_statistic` of the trained body.
    """
    epochs, batch_size = check_count(epochs, "epochs", low=0), check_count(batch_size, "batch_size")
    x, C = _images(x), check_count(num_classes, "num_classes")
    try:
        eta = np.asarray(head_eta, dtype=np.float64)
    except (TypeError, ValueError):
        eta = np.empty(0)
    m = 1 + client_features(body, x[:1], None).shape[1] if len(x) else None
    if (
        eta.ndim != 2
        or eta.shape[0] != C
        or (m is not None and eta.shape[1] != m)
        or not np.isfinite(eta).all()
    ):
        raise InputError(
            f"head_eta must be the server's finite (C, d + 1) = ({C}, {m}) broadcast head, got shape {eta.shape}"
            + ("" if eta.size == 0 or np.isfinite(eta).all() else " holding NaN or inf")
        )
    client = RoundsClient.__new__(RoundsClient)
    client.body, client.opt, client.gen, client.x, client.y = body, optimizer, generator, x, y
    if epochs > 0:
        train_body(
            client, torch.from_numpy(np.asarray(head_eta, dtype=np.float32)), epochs, batch_size, clip_fn
        )
    return client_statistic(body, x, y, num_classes=num_classes, clip_fn=clip_fn)


def server_step(total: np.ndarray, *, nu: float = 1.0):
    """The server's step: the MAP head of Eq. 15 from the released sum (C, m) of the clients' statistics.

    Returns ``(head, eta)``: the :class:`privfed.head.LinearHead` and the (C, m) array to broadcast.
    """
    from privfed.methods.fedlog import FedLog
    from privfed.stats import ClientStats

    try:
        total = np.asarray(total, dtype=np.float64)
    except (TypeError, ValueError):
        total = np.empty(0)
    if total.ndim != 2 or total.shape[1] < 2 or not np.isfinite(total).all():
        raise InputError(
            f"total must be the (C, d + 1) released sum of finite numbers, got shape {total.shape}"
        )
    head = FedLog(nu=nu).aggregate(ClientStats(counts=total[None, :, 0], sums=total[None, :, 1:]))
    return head, head_eta(head)


def initial_head(
    num_classes: int, seed: int, *, dim: int = FEATURE_DIM, scale: float | None = None
) -> np.ndarray:
    """The server's seeded random initial head (C, d + 1), uniform in [-scale, scale] (1/sqrt(m) by default)."""
    C, seed, m = (
        check_count(num_classes, "num_classes"),
        check_count(seed, "seed", low=0),
        check_count(dim, "dim") + 1,
    )
    s = 1.0 / math.sqrt(m) if scale is None else check_nonnegative(scale, "scale")  # the head's range
    return np.random.default_rng([seed, 0x4EAD]).uniform(-s, s, size=(C, m))


def accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(pred == y)) if y.size else math.nan


def head_eta(head) -> np.ndarray:
    return np.concatenate([head.bias[:, None], head.weight], axis=1)


class RoundsSetup:
    """Data, partition, personalised test split and client families of one seeded run."""

    def __init__(self, cfg: RoundsConfig):
        from privfed.data.digits import digits_splits
        from privfed.federation import partition

        self.splits = digits_splits(cfg.seed)
        y = np.asarray(self.splits.private_labels)
        self.C = 10
        part = partition(
            y,
            cfg.clients,
            cfg.partition,
            alpha=cfg.alpha,
            rng=cfg.seed,
            classes_per_client=cfg.classes_per_client,
        )
        self.part = part
        self.clients = np.asarray(part.clients)
        sizes = part.sizes()
        if (sizes == 0).any():
            raise ConfigError(
                f"partition {cfg.partition!r} left client(s) {np.flatnonzero(sizes == 0).tolist()} "
                "empty; use fewer clients or another scheme"
            )
        self.train_counts = part.class_counts(y, self.C)
        yt = np.asarray(self.splits.test_labels)
        self.test_clients = personal_test_split(
            self.train_counts, yt, np.random.default_rng([cfg.seed, 0x7E57])
        )
        self.families = assign_families(cfg.clients, cfg.families, cfg.seed)
        self.x_all = torch.from_numpy(np.array(self.splits.private_images, dtype=np.float32))[:, None]
        self.y_all = torch.from_numpy(y.copy())
        self.xt_all = torch.from_numpy(np.array(self.splits.test_images, dtype=np.float32))[:, None]
        self.yt_all = yt

    def client_data(self, k):
        idx = np.flatnonzero(self.clients == k)
        tidx = np.flatnonzero(self.test_clients == k)
        return (self.x_all[idx], self.y_all[idx], self.xt_all[tidx], self.yt_all[tidx])


def init_body(family: str, init: str, seed: int, k: int) -> nn.Module:
    if init == "public":
        return public_body(family, seed)
    torch.manual_seed(int(np.random.default_rng([seed, 0x1417, k]).integers(2**62)))
    return make_body(family)


# ---------------------------------------------------------------- FedLog rounds
def run_fedlog(
    cfg: RoundsConfig,
    setup: RoundsSetup,
    families: list[str],
    *,
    rounds: int,
    epochs: int,
    dp: RoundsDP | None,
    noise_rng,
    bar=None,
    label="fedlog",
    release: RoundRelease | None = None,
    observer=None,
) -> dict:
    """The multi-round protocol; returns accuracies, the last head and the per-round history."""
    from privfed.methods.fedlog import fedlog_gradient

    K, C, d = cfg.clients, setup.C, FEATURE_DIM
    m = d + 1
    clip_fn = dp.clip_tensor if dp is not None else None
    clients = []
    for k in range(K):
        x, y, xt, yt = setup.client_data(k)
        clients.append(
            RoundsClient(k, x, y, xt, yt, init_body(families[k], cfg.init, cfg.seed, k), cfg.lr, cfg.seed)
        )
    if epochs == 0:
        for c in clients:
            for p in c.body.parameters():
                p.requires_grad_(False)
    # Server: random initial head (Algorithm 1), seeded.
    eta = initial_head(C, cfg.seed, dim=d, scale=cfg.head_init_scale)
    history = []
    head = None
    for r in range(rounds):
        eta_t = torch.from_numpy(eta.astype(np.float32))
        A = np.zeros((K, C, m))
        for c in clients:
            if epochs > 0:
                train_body(c, eta_t, epochs, cfg.batch_size, clip_fn)
            A[c.k] = client_statistic(c.body, c.x, c.y, num_classes=C, clip_fn=clip_fn)
        if release is None:
            release = RoundRelease(dp, "none", num_clients=K, nu=cfg.nu)
        head = release.release(A, noise_rng)  # the round's plan: bound, noise, (secure) sum, MAP head
        Phi = released_statistic(head.trace)
        if observer is not None:
            observer(r, clients, A, head.trace)
        eta = head_eta(head)
        nu_n = float(head.extras["nu_plus_n"])
        grad = fedlog_gradient(eta, Phi + release.method.params["chi"], nu_n)
        pers, common = evaluate(clients, head, clip_fn, setup)
        history.append(
            {
                "round": r + 1,
                "personalised": pers,
                "common": common,
                "gradient_norm": float(np.linalg.norm(grad)),
                "head_norm": float(np.linalg.norm(eta)),
                "eta": eta,
                "statistic": Phi,
                "nu_plus_n": nu_n,
                "epsilon": (dp.composed_epsilon() if dp is not None else math.inf),
            }
        )
        if bar is not None:
            bar.set_postfix_str(f"{label} r{r + 1} pers {pers:.3f}")
            bar.update(1)
    return {
        "history": history,
        "head": head,
        "personalised": history[-1]["personalised"],
        "common": history[-1]["common"],
        "clients": clients,
    }


def evaluate(clients, head, clip_fn, setup) -> tuple[float, float]:
    pers, common = [], []
    for c in clients:
        if c.yt.size:
            pers.append(accuracy(head.predict(client_features(c.body, c.xt, clip_fn)), c.yt))
        common.append(accuracy(head.predict(client_features(c.body, setup.xt_all, clip_fn)), setup.yt_all))
    return float(np.mean(pers)), float(np.mean(common))
