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
Every round releases a new statistic, so R rounds are R releases.  Each is one run of the release
plan ``privfed.fit`` runs (:class:`privfed.release.ReleasePlan`, FedLog's augmented statistic under
one :class:`mechanisms.GaussianMechanism`), leaving its :class:`privfed.release.ReleaseTrace`
(``RoundsResult.traces``); the guarantee is composed from the traces' events
(:mod:`privfed.rounds.report`).  Noise is
added to the augmented statistic (counts and sums together, one sigma: the
Gaussian mechanism on phi (x) e_y of Theorem 3.1), centrally (a trusted
server noises the sum), distributed (each client adds N(0, sigma^2/(K - t)) and
secure aggregation reveals only the sum) or locally (each client noises its
own upload with the full sigma).  ``calibration="total"`` (default)
calibrates sigma so that the R releases *together* are (eps, delta)-DP:
mu_round = mu(eps, delta) / sqrt(R), exact in GDP
(:func:`mechanisms.dp.accounting.calibrate_round_mu`).  ``calibration="paper"``
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
(:class:`mechanisms.secagg.protection.PairwiseMasking`: fresh X25519 keys from the OS
CSPRNG every round, fixed point in Z_2^64, Shamir-shared seeds for dropouts)
or CKKS (:class:`mechanisms.secagg.protection.CKKSAggregation`).  ``placement=
"distributed"`` needs one (masking by default): every client adds its share
N(0, sigma^2/(K - t)) before masking, and the release is charged the noise
its sum really carries (U present shares: U sigma^2/(K - t)); ``dropouts``
simulates clients leaving each round; a trusted server (``placement="central"``) or clients noising
their own uploads (``"local"``) sum in clear.  The protocol's view of every round (masked ring
elements only) is kept in ``RoundsResult.server_views``.

Per-round API (for running the protocol in another loop, e.g. Flower)
--------------------------------------------------------------------
:func:`initial_head` (the server's seeded random head), :func:`client_update`
(one client's round: train its body against the broadcast head, return its
(C, m) statistic), :func:`client_statistic` (the statistic alone) and
:func:`server_step` (the MAP head and the array to broadcast from the
released sum).  :class:`RoundRelease` turns the clients' statistics into one
release (the plan's stages: bound, noise, secure sum, head) and keeps its trace.

Modules: :mod:`privfed.rounds.training` (the protocol), :mod:`privfed.rounds.baselines`,
:mod:`privfed.rounds.run` (:func:`run_rounds`), :mod:`privfed.rounds.release` and
:mod:`privfed.rounds.report` (the release and its guarantee); this package re-exports them.  The
``--rounds`` mode of the trade-off command is :mod:`privfed.commands.tradeoff.rounds`.

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

from privfed.rounds.bodies import FAMILIES, FEATURE_DIM, make_body
from privfed.rounds.config import DEFAULT_MAX_RECORDS, RoundsConfig, RoundsResult
from privfed.rounds.release import RoundRelease, RoundsDP, RoundsPrivacyReport, noise_generator
from privfed.rounds.run import make_dp, run_rounds
from privfed.rounds.training import (
    RoundsClient,
    RoundsSetup,
    assign_families,
    client_statistic,
    client_update,
    head_eta,
    init_body,
    initial_head,
    personal_test_split,
    server_step,
    train_body,
)

__all__ = [
    "DEFAULT_MAX_RECORDS",
    "FAMILIES",
    "FEATURE_DIM",
    "RoundRelease",
    "RoundsClient",
    "RoundsConfig",
    "RoundsDP",
    "RoundsPrivacyReport",
    "RoundsResult",
    "RoundsSetup",
    "assign_families",
    "client_statistic",
    "client_update",
    "head_eta",
    "init_body",
    "initial_head",
    "make_body",
    "make_dp",
    "noise_generator",
    "personal_test_split",
    "run_rounds",
    "server_step",
    "train_body",
]
