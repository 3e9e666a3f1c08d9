"""The release plan against the release composed by hand from the mechanism's and protocol's hooks.

For every branch a release can take (streamed local noise for sum-only and per-client methods,
a trusted aggregator's central noise, client level, distributed noise under masking, count noise on
per-client uploads, a secure protocol without noise, and no protection at all), the plan's head,
sigma, bytes and guarantee equal those of the same hooks called in order by hand with the same
seeds; the trace says what the server received and which events the accountant composed.
"""

from __future__ import annotations

import numpy as np
import pytest

import privfed
from mechanisms import GaussianMechanism, LaplaceCountNoise, PairwiseMasking
from privfed.errors import InputError
from privfed.methods import get
from privfed.release import ReleasePlan
from privfed.release.pipeline import client_statistics, server_head
from privfed.stats import StatsFold

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, C, D = 6, 4, 5


def _data(seed=0, n=120):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    F = rng.normal(size=(n, D)) + y[:, None] * 0.7
    k = np.arange(n) % K
    return F, y, k


def _stats(m, mech, secure=None, seed=1):
    F, y, k = _data()
    return client_statistics(
        m,
        F,
        y,
        k,
        num_classes=C,
        num_clients=K,
        rng=np.random.default_rng(seed),
        privacy=mech,
        secure_agg=secure,
    )


def _by_hand(m, stats, mech, rng, secure=None):
    """The release composed from the hooks, in the order the pipeline documents."""
    if mech is not None and secure is None and getattr(mech, "streams_upload", lambda m: False)(m):
        total = mech.fold_local_upload(stats, m, rng)
        head = m.aggregate(mech.after_aggregate(total, m, rng))
        uploaded = None
    elif mech is not None and secure is None and getattr(mech, "streams_pairs", lambda m: False)(m):
        head = m.aggregate_stream(*mech.local_upload_stream(stats, rng))
        uploaded = None
    else:
        uploaded = stats if mech is None else mech.before_upload(stats, m, rng)
        if secure is not None:
            run = secure.secure_sum(rng)
            after = getattr(mech, "after_secure_sum", None)
            head = m.secure_aggregate(uploaded, run if after is None else (lambda a: after(run(a), m, rng)))
        elif m.per_client:
            head = m.aggregate(uploaded)
        else:
            total = StatsFold(num_classes=C, dim=D).add(uploaded.select(m.requires)).result()
            head = m.aggregate(total if mech is None else mech.after_aggregate(total, m, rng))
    report = None if mech is None else mech.report()
    return head, report, uploaded


def _gauss(**kw):
    return GaussianMechanism(epsilon=2.0, delta=1e-5, clip=3.0, **kw)


CASES = {
    "local-sum (streamed)": ("fedncm", lambda: _gauss(), None, "not-kept"),
    "local-pairs (streamed)": ("fedcof", lambda: _gauss(), None, "not-kept"),
    "central, record level": (
        "fed3r",
        lambda: _gauss(blocks=("sums", "counts", "second"), trusted_aggregator=True),
        None,
        "uploads",
    ),
    "central, client level": (
        "fedncm",
        lambda: _gauss(level="client", max_records=30, trusted_aggregator=True),
        None,
        "uploads",
    ),
    "distributed under masking": (
        "fedncm",
        lambda: _gauss(level="client", max_records=30),
        lambda: PairwiseMasking(),
        "secure-sums",
    ),
    "count noise, per client": ("fedcof", lambda: LaplaceCountNoise(epsilon=1.0), None, "uploads"),
    "masking, no noise": ("fedcof", lambda: None, lambda: PairwiseMasking(), "secure-sums"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_equals_the_hooks_composed_by_hand(case):
    name, make_mech, make_secure, seen = CASES[case]
    m = get(name)
    mech_a, mech_b = make_mech(), make_mech()
    sec_a = None if make_secure is None else make_secure()
    sec_b = None if make_secure is None else make_secure()
    stats_a = _stats(m, mech_a, sec_a)
    stats_b = _stats(m, mech_b, sec_b)
    head = server_head(
        m, stats_a, num_clients=K, rng=np.random.default_rng(7), privacy=mech_a, secure_agg=sec_a
    )
    ref, report, uploaded = _by_hand(m, stats_b, mech_b, np.random.default_rng(7), sec_b)

    exact = sec_a is None  # masking decodes a fixed-point sum: equal to its resolution, not bit for bit
    if exact:
        np.testing.assert_array_equal(head.weight, ref.weight)
        np.testing.assert_array_equal(head.bias, ref.bias)
    else:
        np.testing.assert_allclose(
            head.weight, ref.weight, rtol=0, atol=1e-6 * max(1.0, np.abs(ref.weight).max())
        )
    assert head.notes[: len(ref.notes)] == ref.notes
    if report is not None:
        assert head.privacy.epsilon == report.epsilon and head.privacy.sigma == report.sigma
        assert head.privacy.guarantee == report.guarantee
    trace = head.trace
    assert trace.server_view().kind == seen
    assert trace.stage("report").values["bytes"] == head.upload_bytes
    if mech_a is not None and hasattr(mech_a, "ledger"):
        assert len(trace.events) == len(mech_a.ledger.events) > 0
        assert trace.stage("report").values["epsilon"] == head.privacy.epsilon
    if seen == "uploads":
        np.testing.assert_array_equal(trace.server_view().stats.counts, uploaded.counts)
    central = getattr(mech_a, "trusted_aggregator", False) and sec_a is None
    # a trusted aggregator receives the uploads; what leaves it is its noisy sum
    assert trace.release_view().kind == ("noisy-sum" if central else seen)
    if seen == "secure-sums":
        # every output of the protocol, nothing per client
        assert trace.server_view().stats is None and len(trace.server_view().arrays) >= 2


def test_streaming_is_a_property_of_the_plan():
    """The plan decides streaming once from the method, the mechanism and the protection."""
    local = _gauss()
    assert ReleasePlan(get("fedncm"), local).streamed
    assert ReleasePlan(get("fedcof"), local).streamed
    assert not ReleasePlan(get("fedncm"), _gauss(trusted_aggregator=True)).streamed
    assert not ReleasePlan(get("fedncm"), _gauss(level="client", max_records=3), PairwiseMasking()).streamed
    assert [
        s.name
        for s in ReleasePlan(
            get("fed3r"), _gauss(blocks=("sums", "counts", "second"), trusted_aggregator=True)
        ).stages
    ] == ["client-release", "sum", "central-noise", "method"]


def test_keep_uploads_shows_the_streamed_uploads_the_server_received():
    """On a streamed plan the trace keeps every client's noisy upload when asked, and they sum to what
    the method was given (the attack and the audit read exactly this)."""
    m = get("fedncm")
    mech = _gauss()
    stats = _stats(m, mech)
    head = server_head(m, stats, num_clients=K, rng=np.random.default_rng(3), privacy=mech, keep_uploads=True)
    view = head.trace.server_view()
    assert view.kind == "uploads" and view.stats.num_clients == K
    mech2 = _gauss()
    total = mech2.fold_local_upload(_stats(m, mech2), m, np.random.default_rng(3))
    np.testing.assert_allclose(view.stats.sums.sum(axis=0), total.sums[0], rtol=1e-12, atol=1e-9)


def test_fit_trace_labels_seeded_and_entropy_randomness():
    """A seeded fit's trace says "seeded" at every stage that drew noise; an unseeded one "os-entropy"."""
    F, y, k = _data()
    seeded = privfed.fit("fedncm", F, y, k, num_classes=C, num_clients=K, privacy=_gauss(), random_state=0)
    fresh = privfed.fit("fedncm", F, y, k, num_classes=C, num_clients=K, privacy=_gauss())
    assert seeded.trace.randomness == "seeded" and seeded.trace.stage("client-release").randomness == "seeded"
    assert fresh.trace.randomness == "os-entropy"
    assert [r.stage for r in fresh.trace.records] == [
        "clip",
        "statistics",
        "client-release",
        "method",
        "report",
    ]
    plain = privfed.fit("fedncm", F, y, k)
    assert plain.trace.randomness == "none" and plain.trace.server_view().kind == "sum"
    assert fresh.trace.to_dict()["stages"][0]["values"] == {"bound": 3.0}


def test_attack_view_is_read_off_the_same_release_as_fit():
    """The attacks' view under secure aggregation with distributed noise is what fit's trace says the
    server received, for the same data, mechanism and seed: one release, not a rebuilt copy."""
    from attacks.view import ServerView
    from privfed.release.ideal import IdealSecureSum

    F, y, k = _data()
    mech = _gauss(level="client", max_records=30)
    head = privfed.fit(
        "fedncm",
        F,
        y,
        k,
        num_classes=C,
        num_clients=K,
        privacy=mech,
        secure_agg=IdealSecureSum(),
        random_state=3,
    )
    sums = head.trace.server_view().arrays
    view = ServerView.from_federation(
        "fedncm",
        F,
        y,
        k,
        num_classes=C,
        secure_agg=True,
        privacy=_gauss(level="client", max_records=30),
        rng=3,
    )
    assert view.secure_agg and view.stats.num_clients == 1
    np.testing.assert_array_equal(view.stats.counts[0], sums[0])
    np.testing.assert_array_equal(view.stats.sums[0], sums[1])
    # and the noise it carries is the mechanism's distributed noise, not a clean sum
    assert np.abs(view.stats.counts[0] - np.bincount(y, minlength=C)).max() > 0


def test_keeping_uploads_reaches_a_release_made_through_fit():
    """privfed.fit streams local-noise uploads; inside keeping_uploads() its trace holds every upload."""
    from privfed.release import keeping_uploads

    F, y, k = _data()
    head = privfed.fit("fedncm", F, y, k, num_classes=C, num_clients=K, privacy=_gauss(), random_state=2)
    assert head.trace.server_view().kind == "not-kept"
    with keeping_uploads():
        kept = privfed.fit("fedncm", F, y, k, num_classes=C, num_clients=K, privacy=_gauss(), random_state=2)
    view = kept.trace.server_view()
    assert view.kind == "uploads" and view.stats.counts.shape == (K, C)
    # the same seed draws the same release: the head is unchanged by keeping its uploads
    np.testing.assert_array_equal(kept.weight, head.weight)


def test_attack_view_takes_the_public_number_of_clients():
    """Given num_clients, the attacks' view is the release fit makes with that public K: the uploads of
    clients without records are there (noise only), and an id out of range is refused by name."""
    from attacks.view import ServerView
    from privfed.release import keeping_uploads

    F, y, k = _data()
    with keeping_uploads():
        head = privfed.fit(
            "fedncm", F, y, k, num_classes=C, num_clients=K + 2, privacy=_gauss(), random_state=3
        )
    view = ServerView.from_federation(
        "fedncm", F, y, k, num_classes=C, num_clients=K + 2, privacy=_gauss(), rng=3
    )
    assert view.stats.num_clients == K + 2
    np.testing.assert_array_equal(view.stats.counts, head.trace.server_view().stats.counts)
    assert np.abs(view.stats.counts[K:]).max() > 0  # the empty clients upload noise, not nothing
    with pytest.raises(InputError, match=f"out of range for num_clients={K - 1}"):
        ServerView.from_federation(
            "fedncm", F, y, k, num_classes=C, num_clients=K - 1, privacy=_gauss(), rng=3
        )


def test_a_subclass_replacing_a_hook_is_not_streamed():
    """One check for every streamed path (the plan's local upload stream, a per-client method's streamed
    server, the plain pair fold): a subclass that replaced a hook the stream stands for keeps the
    one-call path, one that replaced nothing (or the stream together with its hooks) keeps the stream."""
    from privfed.methods.fedcof import FedCOF
    from privfed.release.pipeline import run_federation
    from privfed.release.streaming import stream_stands_for

    class Base:
        def stream(self):
            return "stream"

        def hook(self):
            return "hook"

    class Same(Base):
        pass

    class NewHook(Base):
        def hook(self):
            return "other"

    class NewStreamAndHook(Base):
        def stream(self):
            return "own stream"

        def hook(self):
            return "own hook"

    hooks = ("stream", "hook")
    assert stream_stands_for(Base(), "stream", hooks) and stream_stands_for(Same(), "stream", hooks)
    assert not stream_stands_for(NewHook(), "stream", hooks)
    assert stream_stands_for(NewStreamAndHook(), "stream", hooks)
    assert not stream_stands_for(object(), "stream", hooks)  # no stream at all

    class NoisyOwn(GaussianMechanism):
        def _noisy(self, *args, **kwargs):
            return super()._noisy(*args, **kwargs)

    class EstimateOwn(FedCOF):
        def estimate(self, *args, **kwargs):
            return super().estimate(*args, **kwargs)

    kw = {"epsilon": 2.0, "delta": 1e-5, "clip": 3.0}
    assert ReleasePlan(get("fedncm"), GaussianMechanism(**kw)).streamed
    assert not ReleasePlan(get("fedncm"), NoisyOwn(**kw)).streamed
    assert ReleasePlan(FedCOF(), GaussianMechanism(**kw)).streamed
    assert not ReleasePlan(EstimateOwn(), GaussianMechanism(**kw)).streamed

    F, y, k = _data()

    def first_detail(method):
        rng = np.random.default_rng(0)
        head = run_federation(method, F, y, k, num_classes=C, num_clients=K, rng=rng)
        return head, head.trace.records[0].detail

    ref, ref_detail = first_detail(FedCOF())
    own, own_detail = first_detail(EstimateOwn())
    assert "pair's sums folded" in ref_detail  # the pair stream
    assert "pair's sums folded" not in own_detail and "statistics folded" in own_detail  # the one-call path
    np.testing.assert_allclose(own.weight, ref.weight, rtol=1e-9, atol=1e-10)  # the same head either way
