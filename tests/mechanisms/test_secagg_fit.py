"""Secure aggregation through privfed.fit: every summable method (and FedCOF's two-round protocol)
reproduces its plain head; reports, dropouts, refusals and byte accounting.

Tolerances.  Masking at f = 32 fractional bits perturbs each summed
coordinate by at most K 2^-33 (7e-10 for K = 6; counts are exact); CKKS
releases sums on the 2^-20 grid (error <= 2^-21 + decryption error ~1e-8).
The heads are smooth functions of the statistics, with condition numbers
of order 10-100 on this well-separated data, so heads agree to 1e-7
(masking) and 1e-6 (CKKS) relative to the largest weight.
"""

from __future__ import annotations

import numpy as np
import pytest

import privfed
from mechanisms.secagg.comm import secagg_upload_bytes
from mechanisms.secagg.masking import ProtocolAbort
from mechanisms.secagg.noise import DistributedGaussian
from mechanisms.secagg.protection import CKKSAggregation, PairwiseMasking, SecureAggReport, make_secure_agg
from privfed.errors import ConfigError, InputError
from privfed.methods.base import Method

METHODS = ["fedncm", "fed3r", "fed3r-within", "fedcgs", "fedlog", "fedcof", "fedcof-oracle"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    K, C, d, n = 6, 4, 8, 360
    y = np.arange(n) % C
    F = rng.normal(size=(n, d)) + 3 * rng.normal(size=(C, d))[y]
    k = rng.integers(0, K, size=n)
    k[:K] = np.arange(K)  # no empty client
    return F, y, k


def _close(a, b, rel):
    scale = max(np.abs(b.weight).max(), 1.0)
    assert np.abs(a.weight - b.weight).max() <= rel * scale
    assert np.abs(a.bias - b.bias).max() <= rel * max(np.abs(b.bias).max(), 1.0)


@pytest.mark.parametrize("method", METHODS)
def test_masking_reproduces_the_plain_head(data, method):
    F, y, k = data
    plain = privfed.fit(method, F, y, k)
    head = privfed.fit(method, F, y, k, secure_agg=PairwiseMasking(key_seed=1))
    _close(head, plain, 1e-7)
    rep = head.secure_aggregation
    assert isinstance(rep, SecureAggReport)
    # Masking bytes are deterministic: the formula equals what the run sent.
    assert rep.bytes_per_client == pytest.approx(rep.measured_bytes_per_client, rel=1e-12)
    # Counts are integers: exact (f = 0); FedCOF's round 1 sends them with its sums at f = 32, where whole
    # numbers are exact too (tests/methods/test_fedcof_protocol.py).
    assert rep.calls[0]["frac_bits"] == (32 if method == "fedcof" else 0)


@pytest.mark.parametrize("method", METHODS)
def test_ckks_reproduces_the_plain_head(data, method):
    F, y, k = data
    plain = privfed.fit(method, F, y, k)
    head = privfed.fit(method, F, y, k, secure_agg=CKKSAggregation())
    _close(head, plain, 1e-6)
    rep = head.secure_aggregation
    # Serialized ciphertext sizes vary by a few bytes (compression): within 1%.
    assert rep.bytes_per_client == pytest.approx(rep.measured_bytes_per_client, rel=0.01)


def test_fedcof_two_round_protocol_with_multi_mean_sampling(data):
    F, y, k = data
    plain = privfed.fit("fedcof", F, y, k, means_per_client=3, random_state=4)
    head = privfed.fit("fedcof", F, y, k, means_per_client=3, random_state=4, secure_agg=PairwiseMasking())
    _close(head, plain, 1e-7)
    rep = head.secure_aggregation
    assert rep.secure_variant.startswith("two-round")
    assert [c["clients"] for c in rep.calls] == [6, 6]  # per real client, not per pseudo-client
    # round 1: counts, sums and presence in one vector (2 C + C d); round 2: the d x d spread and the count
    # of nodes that clipped it
    assert [c["shape"] for c in rep.calls] == [(2 * 4 + 4 * 8,), (8 * 8 + 1,)]


def test_report_states_parameters_threat_model_and_dropouts(data):
    F, y, k = data
    head = privfed.fit("fed3r", F, y, k, secure_agg=PairwiseMasking(dropouts=2, dropout_phase="after_upload"))
    plain = privfed.fit("fed3r", F, y, k)
    _close(head, plain, 1e-7)  # inputs uploaded before dropping still count
    rep = head.secure_aggregation
    # the threat model is computed from this run: K = 6, the default t = 4 (2t > 6 + 1), honest-but-curious
    # (t - 1 colluders tolerated), every uploader in one part
    th = rep.threat
    assert (th.version, th.num_nodes, th.threshold, th.colluders_tolerated) == ("honest-but-curious", 6, 4, 3)
    assert th.parts == (6,) and th.smallest_sum_alone == 4 and th.smallest_sum_colluding == 1
    assert rep.threat_model == th.text() and "colluders tolerated: 3" in rep.threat_model
    assert "a server that deviates" in rep.threat_model.lower()
    assert rep.parameters["frac_bits"] == 32 and rep.parameters["ring"] == "Z_2^64"
    assert len(rep.dropouts["after_upload"]) == 2 and rep.dropouts["before_upload"] == []
    assert len(rep.calls) == 3 and all(c["uploaded"] == 6 for c in rep.calls)
    assert len(rep.views) == 3 and all(len(v.masked_uploads) == 6 for v in rep.views)
    ck = privfed.fit("fed3r", F, y, k, secure_agg=CKKSAggregation()).secure_aggregation
    assert ck.threat.colluders_tolerated == 0 and ck.threat.threshold == 4 and ck.threat.parts == (6,)
    assert "Colluders tolerated: 0" in ck.threat_model and ck.parameters["poly_modulus_degree"] == 8192


@pytest.mark.parametrize("method", ["fed3r", "fedcof"])
def test_dropouts_before_upload_give_the_head_of_the_remaining_clients(data, method):
    F, y, k = data
    sa = PairwiseMasking(dropouts=2, dropout_phase="before_upload")
    head = privfed.fit(method, F, y, k, secure_agg=sa, random_state=3)
    gone = head.secure_aggregation.dropouts["before_upload"]
    assert len(gone) == 2
    keep = ~np.isin(k, gone)
    remap = np.searchsorted(np.unique(k[keep]), k[keep])  # the remaining clients as 0..K'-1
    plain = privfed.fit(method, F[keep], y[keep], remap)
    _close(head, plain, 1e-7)


def test_too_many_dropouts_abort_the_fit(data):
    F, y, k = data  # K = 6, t = 4: three dropouts leave 3 < t share holders
    with pytest.raises(ProtocolAbort, match="threshold"):
        privfed.fit("fedncm", F, y, k, secure_agg=PairwiseMasking(dropouts=3))


def test_per_client_method_without_secure_protocol_is_refused(data):
    F, y, k = data

    class Individual(Method):
        name = "individual-means"
        per_client = True

        def aggregate(self, stats):  # pragma: no cover - never reached
            raise AssertionError

        @classmethod
        def upload_floats(cls, *, M, K, d, C):
            return M * d

    with pytest.raises(ConfigError, match="secure aggregation"):
        privfed.fit(Individual(), F, y, k, secure_agg=PairwiseMasking())
    with pytest.raises(ConfigError, match="no secure protocol"):
        secagg_upload_bytes(Individual, 10, 5, 8, 4, "mask")


def test_single_client_is_refused(data):
    F, y, _ = data
    with pytest.raises(InputError, match="K >= 2"):
        privfed.fit("fedncm", F, y, secure_agg=PairwiseMasking())


def test_distributed_noise_through_fit_needs_an_enforced_clip(data):
    # DistributedGaussian is calibrated for a sensitivity that fit would not enforce (nothing clips):
    # refused; a mechanism with the protocol clips and splits its noise across the clients instead.
    F, y, k = data
    noise = DistributedGaussian(sigma=[2.0, 5.0], sensitivity=[1.0, 10.0], delta=1e-5, tolerate=2)
    with pytest.raises(ConfigError, match="clips the records"):
        privfed.fit("fedncm", F, y, k, secure_agg=PairwiseMasking(noise=noise), random_state=1)
    with pytest.raises(ConfigError, match="sensitivity="):
        DistributedGaussian(sigma=2.0)
    from mechanisms import GaussianMechanism

    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, dropout_tolerance=2)
    head = privfed.fit(
        "fedncm",
        F,
        y,
        k,
        num_classes=4,
        num_clients=6,
        privacy=mech,
        secure_agg=PairwiseMasking(),
        random_state=1,
    )
    rep = head.secure_aggregation
    assert all(c["frac_bits"] == 32 for c in rep.calls)  # noisy counts are not integers
    assert head.privacy.placement == "distributed"
    # 6 shares of sigma^2/4 each reached the sum: 1.5 sigma^2, so epsilon is below the target.
    from mechanisms import gdp_epsilon

    assert head.privacy.epsilon == pytest.approx(gdp_epsilon(mech.mu / 1.5**0.5, 1e-5), rel=1e-9)
    assert np.abs(head.weight - privfed.fit("fedncm", F, y, k).weight).max() > 1e-4


def test_upload_bytes_formula_by_hand():
    M, K, d, C = 30, 10, 16, 5
    plain = secagg_upload_bytes("fedncm", M, K, d, C, "none")
    assert plain["upload"] == 4 * M * d / K
    b = secagg_upload_bytes("fedncm", M, K, d, C, "mask")
    # Two secure sums (counts C, sums C d); 9 neighbours; 64-byte keys, 104-byte share messages, 37-byte answers.
    assert b["payload"] == 8 * (C + C * d)
    assert b["key_exchange"] == 2 * 64
    assert b["shares"] == 2 * 9 * 104
    assert b["unmask"] == 2 * 10 * 37
    assert b["upload"] == b["payload"] + b["key_exchange"] + b["shares"] + b["unmask"]
    sparse = secagg_upload_bytes("fedncm", M, K, d, C, "mask", neighbours=4)
    assert sparse["shares"] == 2 * 4 * 104
    ck = secagg_upload_bytes("fed3r", M, K, 100, C, "ckks")
    assert ck["num_ciphertexts"] == 1 + 1 + 3  # counts, 500 sums, 10,000 second-moment values
    assert 300_000 < ck["ciphertext_bytes"] < 400_000  # measured TenSEAL size at N = 8192
    cof = secagg_upload_bytes("fedcof", M, K, d, C, "mask")
    assert cof["calls"] == 2 and cof["payload"] == 8 * (2 * C + C * d + d * d + 1)
    with pytest.raises(ConfigError, match="protocol"):
        secagg_upload_bytes("fedncm", M, K, d, C, "paillier")


def test_make_secure_agg_by_name():
    assert make_secure_agg("none") is None
    assert isinstance(make_secure_agg("mask", frac_bits=24), PairwiseMasking)
    assert isinstance(make_secure_agg("ckks"), CKKSAggregation)
    with pytest.raises(ConfigError, match="mask or ckks"):
        make_secure_agg("garbled")
    with pytest.raises(ConfigError, match="neighbours"):
        PairwiseMasking(neighbours=3)


def test_a_split_graph_in_process_settles_epsilon_on_the_least_noised_part():
    """K = 12, degree 4, t = 3, four clients dropped before uploading (drawn by random_state 55, the graph's
    relabelling by key_seed 55): the uploaders' graph of the first secure sum splits into parts of 3 and 5.
    Noise is calibrated for (1, 1e-5) with all 12 shares; the 3-client part carries 3/12 of sigma^2: epsilon
    is the analytic Gaussian's at sqrt(12/3) times the full multiplier (computed here with scipy), not the 8
    uploaders' 1.25."""
    import math
    import warnings

    from scipy.optimize import brentq
    from scipy.stats import norm

    from mechanisms import GaussianMechanism

    def delta(eps, mu):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    mu0 = brentq(lambda mu: delta(1.0, mu) - 1e-5, 0.01, 20.0, xtol=1e-13)
    want = brentq(lambda e: delta(e, 2 * mu0) - 1e-5, 0.0, 100.0, xtol=1e-13)
    rng = np.random.default_rng(0)
    F, y, k = rng.normal(size=(240, 4)), np.arange(240) % 3, np.arange(240) % 12
    sa = PairwiseMasking(threshold=3, neighbours=4, dropouts=4, dropout_phase="before_upload", key_seed=55)
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = privfed.fit(
            "fedncm", F, y, k, num_classes=3, num_clients=12, privacy=mech, secure_agg=sa, random_state=55
        )
    rep = head.secure_aggregation
    # in one process each secure sum draws its own relabelling: the counts' sum splits, the sums' does not;
    # the release is settled on the least-noised part of any sum
    assert [c["parts"] for c in rep.calls] == [[3, 5], [8]] and rep.threat.parts == (3, 5)
    assert head.privacy.epsilon == pytest.approx(want, rel=1e-6) and want == pytest.approx(2.155, abs=5e-4)
    assert any("split into parts of 3, 5" in n for n in head.privacy.notes)


@pytest.mark.parametrize(
    "scale, frac_bits, noted", [(1.0, 32, False), (1e-10, 32, True), (1e-12, 32, True), (1.0, 0, True)]
)
def test_a_secure_sum_whose_rounding_swamps_the_statistics_says_so(scale, frac_bits, noted):
    """Each uploader rounds each value to 2^-f: K 2^-(f+1) per summed value.  Features of 1e-12 summed to all
    zeros (the head then said the statistics carry no signal, as if the data were constant) and f = 0 rounded
    unit features to integers, both without a word; the counts' sum, exact, never has the note."""
    from mechanisms.secagg import PairwiseMasking

    rng = np.random.default_rng(0)
    F = (rng.normal(size=(60, 4)) + np.repeat(np.eye(4)[:3], 20, 0)) * scale
    y, k = np.repeat(np.arange(3), 20), np.arange(60) % 4
    head = privfed.fit("fedncm", F, y, k, secure_agg=PairwiseMasking(frac_bits=frac_bits))
    notes = [n for n in head.notes if "fixed-point rounding" in n]
    assert bool(notes) == noted
    if noted:  # the sums of the features (the second secure sum), never the counts' (the first, exact)
        assert len(notes) == 1 and notes[0].startswith(
            f"secure sum 2: fixed-point rounding (f = {frac_bits} "
        )
        assert f"up to {4 * 2.0 ** -(frac_bits + 1):.3g}" in notes[0]


@pytest.mark.parametrize("scale, bits, noted", [(1.0, 20, False), (1e-7, 20, True), (1e-3, 0, True)])
def test_a_ckks_sum_whose_release_grid_swamps_the_statistics_says_so(scale, bits, noted):
    """CKKS releases a real sum rounded to its 2^-20 grid: features of 1e-7 came back as sums of 0 or 2^-20 and
    a FedNCM head of mostly zeros, with no note (masking's fixed point noted the same loss)."""
    pytest.importorskip("tenseal")
    from mechanisms.secagg.ckks.scheme import CKKSParams
    from mechanisms.secagg.protection import CKKSAggregation

    rng = np.random.default_rng(0)
    F = rng.normal(size=(60, 5)) * scale
    y, k = np.repeat(np.arange(3), 20), np.tile(np.arange(4), 15)
    head = privfed.fit("fedncm", F, y, k, secure_agg=CKKSAggregation(params=CKKSParams(precision_bits=bits)))
    notes = [n for n in head.notes if f"CKKS releases the sum on the 2^-{bits} grid" in n]
    assert bool(notes) == noted  # at 2^-0 (whole numbers) too: the gate read 0 bits as no grid
    if noted:  # the features' sums (the second secure sum); the counts' are integers, released exactly
        bound = 2.0 ** -(bits + 1) + 2.0 ** -(bits + 3)  # half the grid, plus the decryption error below it
        assert notes[0].startswith("secure sum 2: ") and f"by up to about {bound:.3g}" in notes[0]
        assert len(notes) == 1
