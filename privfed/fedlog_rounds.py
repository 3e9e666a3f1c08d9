"""Multi-round FedLog with local bodies (Yu et al., Algorithm 1), on the digits default.

The one-shot ``fedlog`` method fits the MAP head of Eq. 15 once, on frozen
features.  The paper's algorithm is multi-round:

1. the server initialises the head eta (C, m) at random, m = d + 1 (the
   augmented feature phi = [1, f] with the constant first);
2. every round each client trains its own *body* f_k (any architecture, never
   uploaded; its optimiser state stays on the client too) for E local epochs
   with cross-entropy against the fixed head, logits eta phi;
3. each client computes the sufficient statistic of its current features,
   S_k = sum_i phi_i (x) e_{y_i} (per-class sums of phi: the class counts
   ride in the constant coordinate), clipped as the mechanism requires, and
   uploads it (m C floats) with its count n_k (1 float);
4. the server solves the MAP head of Eq. 15 with the same solver as the
   one-shot method (:class:`privfed.methods.fedlog.FedLog`) and sends it back.

Accuracy is the paper's personalised evaluation (the mean over clients of
body_k + head on the client's own test split, distributed like its training
data) and the same bodies on the common test set.

Bodies (``FAMILIES``) share the feature width d = 64: ``cnn`` (the digits
backbone's architecture), ``cnn-narrow`` (half the channels) and ``mlp`` (on
raw pixels).  They start from scratch or from a network trained on the
*public* split only (the attacker-knowledge split of
:mod:`privfed.data.digits`; for ``cnn`` that is the digits backbone itself).

Differential privacy over rounds
--------------------------------
Every round releases a new statistic, so R rounds are R releases.  Noise is
added to the augmented statistic (counts and sums together, one sigma: the
Gaussian mechanism on phi (x) e_y of Theorem 3.1), centrally (a trusted
server noises the sum), distributed (each client adds N(0, sigma^2/(K - t)) and
secure aggregation reveals only the sum) or locally (each client noises its
own upload with the full sigma).  ``calibration="total"`` (default)
calibrates sigma so that the R releases *together* are (eps, delta)-DP:
mu_round = mu(eps, delta) / sqrt(R), exact in GDP
(:func:`mechanisms.accounting.calibrate_round_mu`).  ``calibration="paper"``
reproduces the paper: the classic sigma of Theorem 3.1 for eps, the same eps
every round, no composition; the report then states both that per-round eps
and what the R releases compose to (GDP exactly, PLD as a cross-check), from
the ledger of the releases the run made.

The sensitivity needs care.  Theorem 3.1's bound Delta = sqrt(1 + (m - 1) b^2)
(one record adds one phi (x) e_y) holds when the features come from a body
that does not depend on the private records (frozen bodies).  A body trained
on the client's records depends on every one of them, so adding one record
can move *every* feature of its client: the release is then bounded only by
the size of the client's whole upload.  ``record_bound="upload"`` (the
default whenever bodies are trained) bounds each client's upload to
``max_records`` records' worth (n_max; larger clients are scaled down) and
calibrates for the diameter 2 n_max Delta, a valid record-level guarantee
under adaptive composition.  ``record_bound="theorem"`` uses Delta itself;
with trained bodies the report says that no formal guarantee holds.  At
client level the sensitivity is n_max Delta (add or remove one client).

Secure aggregation
------------------
Each round's release can run through privfed's secure aggregation
(:class:`RoundRelease`, ``secure_agg``): pairwise masking
(:class:`mechanisms.secagg.PairwiseMasking`: fresh X25519 keys from the OS
CSPRNG every round, fixed point in Z_2^64, Shamir-shared seeds for dropouts)
or CKKS (:class:`mechanisms.secagg.CKKSAggregation`).  ``placement=
"distributed"`` needs one (masking by default): every client adds its share
N(0, sigma^2/(K - t)) before masking, and the release is charged the noise
its sum really carries (U present shares: U sigma^2/(K - t)); ``dropouts``
simulates clients leaving each round.  The server's view of every round
(masked ring elements only) is kept in ``RoundsResult.server_views``.

Per-round API (for running the protocol in another loop, e.g. Flower)
--------------------------------------------------------------------
:func:`initial_head` (the server's seeded random head), :func:`client_update`
(one client's round: train its body against the broadcast head, return its
(C, m) statistic), :func:`client_statistic` (the statistic alone) and
:func:`server_step` (the MAP head and the array to broadcast from the
released sum).  :class:`RoundRelease` turns the clients' statistics into one
release (bound, noise, secure sum) and charges it to a :class:`RoundsDP` ledger.

Training, partition and initial heads are seeded and bit-reproducible on
CPU (deterministic algorithms, one thread).  The noise of every release (and
the secure sum's dropouts and noise shares) comes from fresh OS entropy
unless ``noise_seed`` is given; a run with a ``noise_seed`` is a reproducible
*seeded simulation*, not a secret release, and its guarantee, ``describe()``,
table, CSV and JSON say so.  ``max_records`` is given by the caller or is the
public default :data:`DEFAULT_MAX_RECORDS`, never read from the data.
Masking keys are fresh OS entropy, but the masks cancel exactly, so the
released sums do not depend on them.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from mechanisms.ledger import format_up
from privfed.data.digits import deterministic_torch
from privfed.errors import ConfigError
from privfed.fedlog_bodies import (
    FAMILIES,
    FEATURE_DIM,
    augment,
    client_features,
    features,
    make_body,
    num_parameters,
    public_body,
)
from privfed.fedlog_release import (
    SECURE_CHOICES,
    RoundRelease,
    RoundsDP,
    RoundsPrivacyReport,
    noise_generator,
    released_statistic,
)

__all__ = [
    "DEFAULT_MAX_RECORDS",
    "FAMILIES",
    "RoundsConfig",
    "RoundsDP",
    "RoundsPrivacyReport",
    "RoundRelease",
    "RoundsResult",
    "assign_families",
    "client_statistic",
    "client_update",
    "initial_head",
    "make_body",
    "personal_test_split",
    "run_rounds",
    "server_step",
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
    perm = np.random.default_rng([int(seed), 0xA5]).permutation(num_clients)
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


# ---------------------------------------------------------------- config / result
@dataclass(frozen=True)
class RoundsConfig:
    """Every setting of a multi-round FedLog run (defaults: the paper's MNIST recipe on digits)."""

    clients: int = 20
    rounds: int = 10
    local_epochs: int = 5
    batch_size: int = 10
    lr: float = 1e-3
    families: tuple[str, ...] = FAMILIES
    init: str = "public"
    partition: str = "shards"
    classes_per_client: int = 2
    alpha: float = 0.1
    seed: int = 0
    nu: float = 1.0
    head_init_scale: float | None = None
    #: baselines run beside FedLog only when asked (each costs a run of its own: timing["<name>_s"])
    baselines: tuple[str, ...] = ()
    fedavg_family: str = "cnn"
    # privacy (epsilon = inf: none)
    epsilon: float = math.inf
    delta: float = 1e-5
    level: str = "record"
    placement: str = "central"
    calibration: str = "total"
    record_bound: str = "auto"
    clip: float = 2.0
    clip_norm: str = "coordinate"
    #: n_max of the client bound; None: the public default DEFAULT_MAX_RECORDS (never the data's largest client)
    max_records: int | None = None
    #: None: every release's noise from fresh OS entropy; an int: a reproducible seeded simulation
    noise_seed: int | None = None
    # secure aggregation of every round's release ("auto": masking when placement is distributed)
    secure_agg: str = "auto"
    dropouts: int = 0
    dropout_phase: str = "before_upload"
    tolerate: int = 0
    # membership attacks across the rounds (attacks.rounds): member / holdout pairs tested, 0 for none
    attack_pairs: int = 0

    def validate(self) -> RoundsConfig:
        def pos_int(name, low=1):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {name}={v!r}")

        for name in ("clients", "rounds", "batch_size", "classes_per_client"):
            pos_int(name)
        pos_int("local_epochs", 0)
        pos_int("seed", 0)
        if self.noise_seed is not None:
            pos_int("noise_seed", 0)
        if self.max_records is not None:
            pos_int("max_records")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"lr must be a finite number > 0, got lr={self.lr!r}")
        if self.init not in ("public", "scratch"):
            raise ConfigError(
                f"init must be 'public' (trained on the public split) or 'scratch', got {self.init!r}"
            )
        fams = tuple(self.families)
        if not fams or any(f not in FAMILIES for f in fams):
            raise ConfigError(f"families must be a non-empty list from {list(FAMILIES)}, got {list(fams)}")
        if self.fedavg_family not in FAMILIES:
            raise ConfigError(f"fedavg_family must be one of {list(FAMILIES)}, got {self.fedavg_family!r}")
        bad = [b for b in self.baselines if b not in ("oneshot", "local", "fedavg")]
        if bad:
            raise ConfigError(f"unknown baseline(s) {bad}; choose from ['oneshot', 'local', 'fedavg']")
        if not (self.nu >= 0):
            raise ConfigError(f"nu must be >= 0, got nu={self.nu!r}")
        if self.secure_agg not in SECURE_CHOICES:
            raise ConfigError(
                f"secure_agg must be one of {list(SECURE_CHOICES)}, got secure_agg={self.secure_agg!r}"
            )
        pos_int("dropouts", 0)
        pos_int("tolerate", 0)
        pos_int("attack_pairs", 0)
        if self.dropout_phase not in ("before_upload", "after_upload"):
            raise ConfigError(
                f"dropout_phase must be 'before_upload' or 'after_upload', got {self.dropout_phase!r}"
            )
        if self.dropouts >= self.clients:
            raise ConfigError(f"dropouts={self.dropouts} must be fewer than clients={self.clients}")
        return replace(self, families=fams, baselines=tuple(self.baselines))

    @property
    def secure_kind(self) -> str:
        """The secure aggregation protocol run each round ("auto" resolved)."""
        if self.secure_agg != "auto":
            return self.secure_agg
        return (
            "mask"
            if (self.placement == "distributed" and not math.isinf(self.epsilon)) or self.dropouts
            else "none"
        )


@dataclass
class RoundsResult:
    """Outcome of :func:`run_rounds`."""

    config: RoundsConfig
    history: list[dict]
    personalised_accuracy: float
    common_accuracy: float
    head: Any
    families: list[str]
    bytes: dict
    privacy: RoundsPrivacyReport | None
    baselines: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    #: the secure aggregation protocol's report (None when the server summed plain uploads)
    secure_aggregation: dict | None = None
    #: what the server received each round under the protocol (mechanisms.masking.ServerView per round)
    server_views: list = field(default_factory=list, repr=False)
    #: membership attacks across the rounds (attacks.rounds), when ``attack_pairs`` > 0
    attacks: dict | None = None

    def summary(self) -> dict:
        out = {
            "fedlog": {
                "personalised": self.personalised_accuracy,
                "common": self.common_accuracy,
                "upload_bytes_per_round": self.bytes["upload_per_round"],
                "upload_bytes_total": self.bytes["upload_total"],
            },
        }
        for name, b in self.baselines.items():
            out[name] = {
                k: b[k]
                for k in ("personalised", "common", "upload_bytes_per_round", "upload_bytes_total")
                if k in b
            }
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


def client_statistic(
    body: nn.Module, x: torch.Tensor, y: torch.Tensor, *, num_classes: int = 10, clip_fn=None
) -> np.ndarray:
    """One client's upload: the per-class sums of its augmented features [1, f] (C, m), counts in column 0.

    ``clip_fn`` is the clipping the mechanism requires (``RoundsDP.clip_tensor``), None without DP.
    """
    Fk = client_features(body, x, clip_fn)
    yk = np.asarray(y.numpy() if isinstance(y, torch.Tensor) else y, dtype=np.int64)
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

    total = np.asarray(total, dtype=np.float64)
    head = FedLog(nu=nu).aggregate(ClientStats(counts=total[None, :, 0], sums=total[None, :, 1:]))
    return head, head_eta(head)


def initial_head(
    num_classes: int, seed: int, *, dim: int = FEATURE_DIM, scale: float | None = None
) -> np.ndarray:
    """The server's seeded random initial head (C, d + 1), uniform in [-scale, scale] (1/sqrt(m) by default)."""
    m = dim + 1
    s = scale if scale is not None else 1.0 / math.sqrt(m)
    return np.random.default_rng([seed, 0x4EAD]).uniform(-s, s, size=(num_classes, m))


def _accuracy(pred: np.ndarray, y: np.ndarray) -> float:
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
def _fedlog(
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
        pers, common = _evaluate(clients, head, clip_fn, setup)
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


def _evaluate(clients, head, clip_fn, setup) -> tuple[float, float]:
    pers, common = [], []
    for c in clients:
        if c.yt.size:
            pers.append(_accuracy(head.predict(client_features(c.body, c.xt, clip_fn)), c.yt))
        common.append(_accuracy(head.predict(client_features(c.body, setup.xt_all, clip_fn)), setup.yt_all))
    return float(np.mean(pers)), float(np.mean(common))


# ---------------------------------------------------------------- baselines
class _Classifier(nn.Module):
    def __init__(self, body: nn.Module, C: int = 10):
        super().__init__()
        self.body = body
        self.head = nn.Linear(FEATURE_DIM, C)

    def forward(self, x):
        return self.head(self.body(x))


def _train_classifier(model, opt, x, y, epochs, batch_size, gen) -> None:
    F = torch.nn.functional
    model.train()
    n = y.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            b = perm[start : start + batch_size]
            loss = F.cross_entropy(model(x[b]), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()


def _predict(model, x) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return model(x).argmax(dim=1).numpy()


def _fedavg(cfg: RoundsConfig, setup: RoundsSetup, bar=None) -> dict:
    """FedAvg of the whole model (body + linear head), every client the same family."""
    K = cfg.clients
    fam = cfg.fedavg_family
    torch.manual_seed(int(np.random.default_rng([cfg.seed, 0xFEDA]).integers(2**62)))
    glob = _Classifier(init_body(fam, cfg.init, cfg.seed, 0))
    data = [setup.client_data(k) for k in range(K)]
    gens = [
        torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, 0xB0D7, k]).integers(2**62)))
        for k in range(K)
    ]
    n = np.array([d[1].shape[0] for d in data], dtype=np.float64)
    w = n / n.sum()
    history = []
    for r in range(cfg.rounds):
        states = []
        for k in range(K):
            local = copy.deepcopy(glob)
            opt = torch.optim.Adam(local.parameters(), lr=cfg.lr)
            _train_classifier(local, opt, data[k][0], data[k][1], cfg.local_epochs, cfg.batch_size, gens[k])
            states.append(local.state_dict())
        avg = {key: sum(float(w[k]) * states[k][key] for k in range(K)) for key in states[0]}
        glob.load_state_dict(avg)
        pers = float(np.mean([_accuracy(_predict(glob, d[2]), d[3]) for d in data if d[3].size]))
        common = _accuracy(_predict(glob, setup.xt_all), setup.yt_all)
        history.append({"round": r + 1, "personalised": pers, "common": common})
        if bar is not None:
            bar.set_postfix_str(f"fedavg r{r + 1} pers {pers:.3f}")
            bar.update(1)
    P = num_parameters(glob)
    return {
        "history": history,
        "personalised": history[-1]["personalised"],
        "common": history[-1]["common"],
        "family": fam,
        "parameters": P,
        "upload_bytes_per_round": 4 * P * K,
        "upload_bytes_total": 4 * P * K * cfg.rounds,
        "download_bytes_per_round": 4 * P * K,
    }


def _local_only(cfg: RoundsConfig, setup: RoundsSetup, families, bar=None) -> dict:
    """Each client trains body + its own linear head for R x E epochs; nothing is shared."""
    pers, common = [], []
    for k in range(cfg.clients):
        x, y, xt, yt = setup.client_data(k)
        torch.manual_seed(int(np.random.default_rng([cfg.seed, 0x10CA, k]).integers(2**62)))
        model = _Classifier(init_body(families[k], cfg.init, cfg.seed, k))
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        gen = torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, 0xB0D7, k]).integers(2**62)))
        _train_classifier(model, opt, x, y, cfg.rounds * cfg.local_epochs, cfg.batch_size, gen)
        if yt.size:
            pers.append(_accuracy(_predict(model, xt), yt))
        common.append(_accuracy(_predict(model, setup.xt_all), setup.yt_all))
        if bar is not None:
            bar.update(1)
    return {
        "personalised": float(np.mean(pers)),
        "common": float(np.mean(common)),
        "upload_bytes_per_round": 0,
        "upload_bytes_total": 0,
    }


# ---------------------------------------------------------------- entry point
#: Public default of n_max (``max_records``) when the caller gives none: a fixed number, never read from the data
#: (clients holding more records are scaled down to DEFAULT_MAX_RECORDS records' worth).
DEFAULT_MAX_RECORDS = 100


def make_dp(cfg: RoundsConfig, *, rounds: int, bodies_trained: bool) -> RoundsDP | None:
    """The run's noise, with its randomness declared: seeded from ``cfg.noise_seed``, or OS entropy."""
    if math.isinf(cfg.epsilon):
        return None
    dp = RoundsDP(
        epsilon=cfg.epsilon,
        delta=cfg.delta,
        clip=cfg.clip,
        clip_norm=cfg.clip_norm,
        rounds=rounds,
        level=cfg.level,
        placement=cfg.placement,
        calibration=cfg.calibration,
        record_bound=cfg.record_bound,
        max_records=cfg.max_records if cfg.max_records is not None else DEFAULT_MAX_RECORDS,
        dim=FEATURE_DIM,
        bodies_trained=bodies_trained,
        tolerate=cfg.tolerate,
    )
    if cfg.max_records is None and dp.record_bound != "theorem":
        dp.extra_notes.append(
            f"max_records is the public default {DEFAULT_MAX_RECORDS} (not read from the data; "
            "pass max_records to choose it)"
        )
    dp.declare_randomness(seeded=cfg.noise_seed is not None, noise_seed=cfg.noise_seed)
    return dp


def run_rounds(cfg: RoundsConfig | None = None, *, progress: bool = False, **overrides) -> RoundsResult:
    """Run multi-round FedLog (and only the baselines named in ``cfg.baselines``) on the digits default.

    Baselines are opt-in (``baselines=("oneshot", "local", "fedavg")`` runs all three): each is a run
    of its own, timed apart from FedLog in ``timing`` (``fedlog_s``, ``oneshot_s``, ``local_s``,
    ``fedavg_s``).

    Parameters
    ----------
    cfg : RoundsConfig, optional
        Settings; keyword ``overrides`` replace single fields.
    progress : bool
        Show a tqdm bar over rounds (FedLog, FedAvg) and clients (local-only).

    Returns
    -------
    RoundsResult
    """
    cfg = replace(cfg or RoundsConfig(), **overrides).validate()
    t0, c0 = time.perf_counter(), time.process_time()
    from tqdm.auto import tqdm

    notes: list[str] = []
    with deterministic_torch(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="noise backend 'numpy'")
        setup = RoundsSetup(cfg)
        families = setup.families
        noise_rng = noise_generator(cfg.noise_seed, 0x0153)
        if not math.isinf(cfg.epsilon):
            notes.append(
                f"noise drawn from a generator seeded with noise_seed={cfg.noise_seed}: a seeded "
                "simulation, not a secret release"
                if cfg.noise_seed is not None
                else "noise drawn from fresh OS entropy every run"
            )
        dp = make_dp(cfg, rounds=cfg.rounds, bodies_trained=cfg.local_epochs > 0)
        steps = cfg.rounds
        if "fedavg" in cfg.baselines:
            steps += cfg.rounds
        if "local" in cfg.baselines:
            steps += cfg.clients
        if "oneshot" in cfg.baselines:
            steps += 1
        bar = tqdm(total=steps, desc="fedlog rounds", unit="step", disable=not progress, leave=False)
        t1 = time.perf_counter()
        release = RoundRelease(
            dp,
            cfg.secure_kind,
            num_clients=cfg.clients,
            dropouts=cfg.dropouts,
            dropout_phase=cfg.dropout_phase,
            nu=cfg.nu,
        )
        observer = None
        if cfg.attack_pairs:
            from attacks.rounds import RoundsObserver

            observer = RoundsObserver(setup, cfg, dp, release)
        main = _fedlog(
            cfg,
            setup,
            families,
            rounds=cfg.rounds,
            epochs=cfg.local_epochs,
            dp=dp,
            noise_rng=noise_rng,
            bar=bar,
            release=release,
            observer=observer,
        )
        timing = {"fedlog_s": time.perf_counter() - t1}
        attacks = None
        if observer is not None:
            t1 = time.perf_counter()
            attacks = observer.evaluate(np.random.default_rng([cfg.seed, 0xA77C]))
            timing["attacks_s"] = time.perf_counter() - t1
        m = FEATURE_DIM + 1
        per_client = 4 * (m * setup.C + 1)
        bytes_ = {
            "upload_per_client_round": per_client,
            "upload_per_round": per_client * cfg.clients,
            "upload_total": per_client * cfg.clients * cfg.rounds,
            "download_per_round": 4 * m * setup.C * cfg.clients,
        }
        secure = release.report()
        if secure is not None:
            # what a client really uploads per round under the protocol (keys, shares, masked ring elements)
            bytes_["secure_upload_per_client_round"] = secure["upload_bytes_per_client_round"]
            bytes_["secure_upload_total"] = secure["upload_bytes_per_client_round"] * cfg.clients * cfg.rounds
        baselines: dict[str, dict] = {}
        if "oneshot" in cfg.baselines:
            t1 = time.perf_counter()
            ocfg = replace(cfg, init="public")
            odp = make_dp(ocfg, rounds=1, bodies_trained=False)
            one = _fedlog(
                ocfg,
                setup,
                families,
                rounds=1,
                epochs=0,
                dp=odp,
                noise_rng=noise_generator(cfg.noise_seed, 0x0E5),
                bar=bar,
                label="one-shot",
            )
            baselines["oneshot"] = {
                "personalised": one["personalised"],
                "common": one["common"],
                "upload_bytes_per_round": per_client * cfg.clients,
                "upload_bytes_total": per_client * cfg.clients,
                "privacy": None if odp is None else odp.report(),
            }
            timing["oneshot_s"] = time.perf_counter() - t1
        if "local" in cfg.baselines:
            t1 = time.perf_counter()
            baselines["local"] = _local_only(cfg, setup, families, bar=bar)
            timing["local_s"] = time.perf_counter() - t1
        if "fedavg" in cfg.baselines:
            t1 = time.perf_counter()
            baselines["fedavg"] = _fedavg(cfg, setup, bar=bar)
            if len(set(families)) > 1:
                notes.append(
                    f"FedAvg needs one architecture: it ran with family {cfg.fedavg_family!r} on every "
                    "client (FedLog's clients are heterogeneous)"
                )
            if dp is not None:
                notes.append("FedAvg and local-only baselines are not private (no noise)")
            timing["fedavg_s"] = time.perf_counter() - t1
        bar.close()
    timing["total_s"] = time.perf_counter() - t0
    timing["cpu_s"] = (
        time.process_time() - c0
    )  # CPU time of this process (one torch thread): load-independent
    return RoundsResult(
        config=cfg,
        history=main["history"],
        personalised_accuracy=main["personalised"],
        common_accuracy=main["common"],
        head=main["head"],
        families=families,
        bytes=bytes_,
        privacy=None if dp is None else dp.report(),
        baselines=baselines,
        timing=timing,
        notes=notes,
        secure_aggregation=secure,
        server_views=release.views,
        attacks=attacks,
    )


# ---------------------------------------------------------------- trade-off command
def tradeoff_rounds(
    cfg,
    *,
    local_epochs: int | None = None,
    families: Sequence[str] | None = None,
    init: str | None = None,
    progress: bool = True,
    records: list | None = None,
    on_record=None,
) -> list[dict]:
    """Rows of ``python -m privfed.tradeoff --method fedlog --rounds R`` (R > 1): multi-round FedLog
    and one-shot frozen FedLog for every (epsilon, seed) of a :class:`privfed.tradeoff.TradeoffConfig`.

    ``records`` (a list) receives the rows as each (epsilon, seed) finishes, and ``on_record(rows)`` is
    called then, so an interrupted sweep keeps what finished."""
    if cfg.dataset != "digits":
        raise ConfigError(
            f"multi-round FedLog (--rounds > 1) trains bodies on images: it runs on the digits "
            f"default only, got --dataset {cfg.dataset!r}"
        )
    if cfg.count_noise is not None:
        raise ConfigError(
            "--count-noise does not apply to multi-round FedLog (the counts ride in the statistic)"
        )
    placement = (
        "distributed" if cfg.secure_agg != "none" else ("central" if cfg.trusted_aggregator else "local")
    )
    base = dict(
        clients=cfg.clients,
        rounds=cfg.rounds,
        partition=cfg.partition,
        alpha=cfg.alpha,
        baselines=("oneshot",),
        delta=cfg.delta,
        level=cfg.level,
        placement=placement,
        calibration="paper" if cfg.calibration == "classic" else "total",
        record_bound="theorem" if cfg.calibration == "classic" else "auto",
        clip=cfg.clip if cfg.clip is not None else 2.0,
        clip_norm=cfg.clip_norm if cfg.clip is not None else "coordinate",
        max_records=cfg.max_records,
        secure_agg=cfg.secure_agg if cfg.secure_agg in ("mask", "ckks") else "none",
        attack_pairs=TRADEOFF_ATTACK_PAIRS,
    )
    if local_epochs is not None:
        base["local_epochs"] = local_epochs
    if families:
        base["families"] = tuple(families)
    if init is not None:
        base["init"] = init
    RoundsConfig(**dict(base, epsilon=min(cfg.epsilons))).validate()  # refuse bad settings before any work
    rows = [] if records is None else records
    for eps in cfg.epsilons:
        for seed in cfg.seeds:
            # the sweep draws every noise from its seeds (a seeded simulation, as its one-shot rows)
            r = run_rounds(RoundsConfig(**base), seed=seed, noise_seed=seed, epsilon=eps, progress=progress)
            att = attack_summary(r.attacks)
            for name, acc, rep, up in (
                (
                    f"fedlog x{cfg.rounds} rounds",
                    (r.personalised_accuracy, r.common_accuracy),
                    r.privacy,
                    r.bytes["upload_total"],
                ),
                (
                    "fedlog one-shot (frozen)",
                    (r.baselines["oneshot"]["personalised"], r.baselines["oneshot"]["common"]),
                    r.baselines["oneshot"]["privacy"],
                    r.baselines["oneshot"]["upload_bytes_total"],
                ),
            ):
                rows.append(
                    {
                        "method": name,
                        "epsilon": eps,
                        "seed": seed,
                        "rounds": cfg.rounds if "rounds" in name else 1,
                        "accuracy": acc[0],
                        "common_accuracy": acc[1],
                        "epsilon_composed": rep.epsilon if rep else math.inf,
                        "epsilon_per_round": rep.per_round_epsilon if rep else math.inf,
                        "delta": cfg.delta,
                        "sigma": rep.sigma if rep else 0.0,
                        "sensitivity": rep.sensitivity if rep else 0.0,
                        "upload_bytes": up,
                        "formal": bool(rep.formal) if rep else False,
                        "simulation": bool(rep.simulation) if rep else False,
                        "guarantee": rep.guarantee if rep else "NO DP GUARANTEE: no noise",
                        "describe": rep.describe() if rep else "",
                        **(att if "rounds" in name else {k: math.nan for k in att}),
                    }
                )
            if on_record is not None:
                on_record(rows)
    return rows


#: Seconds between checkpoints of the finished (epsilon, seed) pairs to results.partial.* during a sweep.
CHECKPOINT_S = 30.0

#: Member / holdout pairs the trade-off command attacks in every multi-round run.
TRADEOFF_ATTACK_PAIRS = 200


def attack_summary(attacks: dict | None) -> dict:
    """The headline numbers of :mod:`attacks.rounds` for a table: the strongest sequence attack and one round.

    With noise: the differencing attack replayed with fresh noise (independent trials); without: the
    tracing likelihood ratio over the rounds' changes.  ``attack_auc_bound`` is Phi(mu_total / sqrt 2)
    (NaN without DP).
    """
    keys = (
        "attack",
        "attack_auc_sequence",
        "attack_auc_first_round",
        "attack_tpr_1pct_sequence",
        "attack_auc_bound",
        "attack_pairs",
    )
    if not attacks:
        return {k: math.nan for k in keys}
    if attacks.get("differencing_replay"):
        name, res = "differencing (replay)", attacks["differencing_replay"]
        seq = res["sequence"]
    else:
        name, res = "tracing", attacks["tracing"]
        seq = res.get("increments", res["sequence"])
    return {
        "attack": name,
        "attack_auc_sequence": seq["auc"],
        "attack_auc_first_round": res["first_round"]["auc"],
        "attack_tpr_1pct_sequence": seq["tpr_at_1pct_fpr"],
        "attack_auc_bound": attacks.get("auc_bound", math.nan) if attacks.get("bound_formal") else math.nan,
        "attack_pairs": attacks["pairs"],
    }


def _summarise(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["epsilon"]), []).append(r)
    out = []
    for (method, eps), rs in groups.items():
        acc = np.array([r["accuracy"] for r in rs])
        out.append(
            {
                "method": method,
                "epsilon": eps,
                "epsilon_composed": rs[0]["epsilon_composed"],
                "epsilon_per_round": rs[0]["epsilon_per_round"],
                "accuracy_mean": float(acc.mean()),
                "accuracy_sd": float(acc.std()),
                "common_mean": float(np.mean([r["common_accuracy"] for r in rs])),
                "seeds": len(rs),
                "upload_bytes": rs[0]["upload_bytes"],
                "guarantee": rs[0]["guarantee"],
                "simulation": bool(rs[0].get("simulation", False)),
                "attack_auc": float(np.mean([r.get("attack_auc_sequence", math.nan) for r in rs])),
                "attack_auc_bound": rs[0].get("attack_auc_bound", math.nan),
                "describe": rs[0]["describe"],
            }
        )
    return out


def _plot_tradeoff(summary: list[dict], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, method in enumerate(sorted({s["method"] for s in summary})):
        pts = sorted(
            (s["epsilon_composed"], s["accuracy_mean"], s["accuracy_sd"])
            for s in summary
            if s["method"] == method and math.isfinite(s["epsilon_composed"])
        )
        inf = [
            s["accuracy_mean"] for s in summary if s["method"] == method and not math.isfinite(s["epsilon"])
        ]
        if pts:
            x, y, e = (np.array(v) for v in zip(*pts))
            ax.errorbar(x, y, yerr=e, marker="o", capsize=3, color=f"C{i}", label=method)
        for v in inf:
            ax.axhline(v, color=f"C{i}", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon composed over every release of the run (dotted: no noise)")
    ax.set_ylabel("personalised accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def rounds_settings(local_epochs: int | None, families: Sequence[str] | None, init: str | None) -> dict:
    """The multi-round settings a run used (defaults filled in), as results.json's config records them."""
    d = RoundsConfig()
    return {
        "local_epochs": d.local_epochs if local_epochs is None else int(local_epochs),
        "families": list(d.families if not families else families),
        "init": d.init if init is None else init,
    }


def tradeoff_main(cfg, args, argv=()) -> int:
    """``python -m privfed.tradeoff --method fedlog --rounds R`` with R > 1: write, plot and print.

    Written through :class:`privfed._cli.OutputDir` like every command: SIGTERM / Ctrl-C keep the (epsilon,
    seed) pairs that finished in ``results.partial.*``, checkpointed every ``CHECKPOINT_S`` seconds.
    """
    from privfed._cli import OutputDir, as_int, keep_finished, periodic_checkpoint, versions

    families = (
        None
        if getattr(args, "families", None) is None
        else [f.strip() for f in args.families.split(",") if f.strip()]
    )
    epochs = getattr(args, "local_epochs", None)
    epochs = None if epochs is None else as_int(epochs, "--local-epochs", minimum=1)
    init = getattr(args, "init", None)
    command = " ".join(["python -m privfed.tradeoff", *argv])
    # every setting that changes a result, so that --config results.json re-runs this run
    config = {**asdict(cfg), **rounds_settings(epochs, families, init)}
    out = OutputDir(
        args.out,
        "tradeoff",
        overwrite=args.overwrite,
        name_parts=("fedlog", f"rounds{cfg.rounds}"),
        command=command,
    )
    done: list[dict] = []
    partial = ("results.partial.csv", "results.partial.json")

    def write_partial(rows: list[dict]) -> None:
        keys = [k for k in rows[0] if k != "describe"]
        out.write_csv(partial[0], rows, keys)
        out.write_json(
            partial[1],
            {
                "config": config,
                "versions": versions(),
                "records": rows,
                "complete": False,
                "command": command,
            },
        )
        out.checkpoint()

    try:
        rows = tradeoff_rounds(
            cfg,
            local_epochs=epochs,
            families=families,
            init=init,
            progress=not args.quiet,
            records=done,
            on_record=periodic_checkpoint(write_partial, CHECKPOINT_S),
        )
        summary = _summarise(rows)
        keys = [k for k in rows[0] if k != "describe"]
        out.write_csv("results.csv", rows, keys)
        out.write_json(
            "results.json",
            {
                "config": config,
                "versions": versions(),
                "records": rows,
                "summary": summary,
                "command": command,
            },
        )
        if cfg.plot:
            fig = _plot_tradeoff(
                summary,
                f"digits: {cfg.clients} clients, {cfg.partition}, FedLog with local "
                f"bodies over {cfg.rounds} rounds vs one-shot frozen, {cfg.level} level",
            )
            out.save_figure("tradeoff.png", fig, dpi=130)
            import matplotlib.pyplot as plt

            plt.close(fig)
        out.finish(command, complete=True, drop=partial)
    except BaseException:
        keep_finished(out, done, write_partial, command, "python -m privfed.tradeoff")
        raise
    head = (
        f"{'method':<28} {'eps':>7} {'composed':>9} {'per round':>9} {'accuracy':>15} {'upload':>10} "
        f"{'attack AUC':>10} {'AUC bound':>9}"
    )
    print(head)
    for s in summary:
        print(
            f"{s['method']:<28} {s['epsilon']:>7.3g} {format_up(s['epsilon_composed']):>9} "
            f"{format_up(s['epsilon_per_round']):>9} "
            f"{s['accuracy_mean']:>8.4f} ± {s['accuracy_sd']:.3f} {s['upload_bytes'] / 1e3:>8.1f}kB "
            f"{s['attack_auc']:>10.3f} {s['attack_auc_bound']:>9.3f}"
        )
    if any(s.get("simulation") for s in summary):
        print(
            "seeded simulation: every run's noise was drawn from its --seeds value (replayable), not a release; "
            "epsilons are printed rounded up"
        )
    print(
        f"attack AUC: membership attack on all {cfg.rounds} releases of the multi-round run "
        f"({TRADEOFF_ATTACK_PAIRS} member / holdout pairs; attacks.rounds); AUC bound: Phi(mu_total / sqrt 2) of "
        "the composed guarantee (nan: no formal bound)"
    )
    for s in summary:
        if s["describe"]:
            print(f"{s['method']} at eps {s['epsilon']:g}:\n{s['describe']}")
    print(f"wrote {out.published}/: {', '.join(out.files())}")
    return 0
