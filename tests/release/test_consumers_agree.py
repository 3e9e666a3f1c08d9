"""fit, the auditor's path, the attacks' view, the Flower app and multi-round FedLog report one release the same way.

For each method x protection x level, the same configuration run through ``privfed.fit``, the
auditor's ``fit_release`` path, the attacks' ``ServerView.from_federation`` and the Flower app
(in-process grid, the real ClientApp and ServerApp) states the same sigma, epsilon and guarantee;
fit's bytes are those its trace records, and the auditor's path sees the same bytes.  For FedLog's
augmented statistic, one round of multi-round FedLog (``privfed.rounds.release.RoundRelease``, and
the auditor's ``rounds_release`` path) on the same clients states what ``privfed.fit`` states.  Each
reads the one release plan, so a drift between copies shows here.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

import privfed  # noqa: E402
from attacks.view import ServerView  # noqa: E402
from mechanisms import GaussianMechanism, PairwiseMasking  # noqa: E402
from privfed.audit import fit_release  # noqa: E402
from privfed.audit.paths import rounds_release  # noqa: E402
from privfed.federation import partition  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, C, EPS, DELTA, CLIP = 4, 10, 2.0, 1e-5, 10.0

GRID = [
    # (method, protection, level kwargs)
    ("fedncm", "local", {}),
    ("fedcof", "local", {}),
    ("fed3r", "central", {}),
    ("fedncm", "central", {"level": "client", "max_records": 500}),
    ("fedncm", "mask", {}),
    ("fed3r-within", "mask", {"level": "client", "max_records": 500}),
]


@pytest.fixture(scope="module")
def split(digits_dataset):
    ds = digits_dataset
    return partition(ds.train_labels, K, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )


def _mechanism(method, protection, lvl):
    blocks = (
        ("sums", "counts", "second") if method in ("fed3r", "fed3r-within", "fedcgs") else ("sums", "counts")
    )
    return GaussianMechanism(
        epsilon=EPS, delta=DELTA, clip=CLIP, blocks=blocks, trusted_aggregator=protection == "central", **lvl
    )


@pytest.mark.parametrize(
    "method, protection, lvl", GRID, ids=[f"{m}-{p}-{lv.get('level', 'record')}" for m, p, lv in GRID]
)
def test_every_consumer_reports_the_same_release(split, method, protection, lvl):
    F, y, k = split
    secure = (lambda: PairwiseMasking()) if protection == "mask" else None
    data = {"features": F, "labels": y, "clients": k, "num_classes": C, "num_clients": K}

    head = privfed.fit(
        method,
        **data,
        privacy=_mechanism(method, protection, lvl),
        secure_agg=None if secure is None else secure(),
        random_state=0,
    )
    rep = head.privacy
    assert head.trace.stage("report").values["bytes"] == head.upload_bytes
    assert head.trace.stage("report").values["epsilon"] == rep.epsilon

    audited = fit_release(method, lambda: _mechanism(method, protection, lvl), secure)(data, 0)
    assert audited["report"].guarantee == rep.guarantee and audited["report"].sigma == rep.sigma
    assert dict(audited["meta"][1]) == head.upload_bytes

    view = ServerView.from_federation(
        method,
        F,
        y,
        k,
        num_classes=C,
        rng=0,
        privacy=_mechanism(method, protection, lvl),
        secure_agg=secure is not None,
    )
    assert view.noise.epsilon == EPS and view.noise.level == rep.level
    if protection == "local":  # every upload carries the full sigma the report states
        assert view.noise.sigma == pytest.approx(rep.sigma, rel=1e-12)

    cfg = FlowerConfig(
        method=method,
        clients=K,
        epsilon=EPS,
        delta=DELTA,
        clip=CLIP,
        num_classes=C,
        secure="mask" if protection == "mask" else "none",
        trusted_aggregator=protection == "central",
        noise_seed=0,
        timeout=30,
        **lvl,
    )
    nodes = {100 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}
    flower = serve(LocalGrid(nodes), cfg).head.privacy
    assert flower.sigma == rep.sigma
    assert flower.epsilon == pytest.approx(rep.epsilon, rel=1e-12)
    assert flower.level == rep.level and flower.placement == rep.placement
    # the guarantee sentence names the same budget, level, placement and accountant
    assert (
        flower.guarantee.split("; accountant")[0].split(")-DP")[1]
        == rep.guarantee.split("; accountant")[0].split(")-DP")[1]
    )


ROUNDS_GRID = [
    # (protection, level kwargs): the placements of multi-round FedLog
    ("central", {}),
    ("local", {}),
    ("mask", {}),
    ("central", {"level": "client", "max_records": 500}),
]


@pytest.mark.parametrize(
    "protection, lvl", ROUNDS_GRID, ids=[f"fedlog-{p}-{lv.get('level', 'record')}" for p, lv in ROUNDS_GRID]
)
def test_one_round_of_multi_round_fedlog_reports_what_fit_reports(split, protection, lvl):
    """The rounds path is a consumer too: one round on the same clients states fit's sigma, bytes, guarantee."""
    import numpy as np

    from privfed.rounds.release import RoundRelease, RoundsDP, augmented

    F, y, k = split
    d = F.shape[1]
    placement = {"central": "central", "local": "local", "mask": "distributed"}[protection]
    secure = "mask" if protection == "mask" else "none"
    head = privfed.fit(
        "fedlog",
        features=F,
        labels=y,
        clients=k,
        num_classes=C,
        num_clients=K,
        privacy=GaussianMechanism(
            epsilon=EPS,
            delta=DELTA,
            clip=CLIP,
            split="augmented",
            trusted_aggregator=protection == "central",
            **lvl,
        ),
        secure_agg=PairwiseMasking() if secure == "mask" else None,
        random_state=0,
    )
    rep = head.privacy

    dp = RoundsDP(
        epsilon=EPS,
        delta=DELTA,
        clip=CLIP,
        clip_norm="l2",
        rounds=1,
        placement=placement,
        bodies_trained=False,  # frozen features: Theorem 3.1's bound, as fit's record level
        dim=d,
        **lvl,
    )
    dp.declare_randomness(seeded=True, noise_seed=0)
    stats = privfed.stats.compute_client_stats(
        dp.clipping(F), y, k, num_classes=C, num_clients=K, fields=("counts", "sums")
    )
    release = RoundRelease(dp, secure, num_clients=K)
    rounds_head = release.release(augmented(stats), np.random.default_rng(0))
    one = rounds_head.privacy
    assert one.sigma == rep.sigma and one.sensitivity == rep.sensitivity
    assert one.guarantee == rep.guarantee and one.placement == rep.placement
    assert one.epsilon == pytest.approx(rep.epsilon, rel=1e-12)
    assert rounds_head.upload_bytes == head.upload_bytes
    assert rounds_head.trace.stage("report").values["bytes"] == head.trace.stage("report").values["bytes"]
    # the rounds' own report, composed from the round's trace, states the same budget
    composed = dp.report()
    assert composed.sigma == rep.sigma["sums"] and composed.releases == 1
    assert composed.epsilon == pytest.approx(rep.epsilon, rel=1e-9)
    assert [e["scale"] for e in rounds_head.trace.events] == [e["scale"] for e in head.trace.events]

    # and the auditor's path over the rounds release
    data = {"features": F, "labels": y, "clients": k, "num_classes": C, "num_clients": K}
    audited = rounds_release(
        epsilon=EPS, clip=CLIP, rounds=1, delta=DELTA, placement=placement, secure=secure, **lvl
    )(data, 0)["report"]
    assert audited.sigma == composed.sigma and audited.guarantee == composed.guarantee
