"""Inputs that used to state more privacy than a run had: each is now refused, or counted as it happened."""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms import GaussianMechanism, OpenDPNoise
from mechanisms.dp.accounting import ledger_epsilon
from mechanisms.dp.ledger import ReleaseEvent
from mechanisms.secagg import threat
from mechanisms.secagg.noise import DistributedGaussian
from privfed.errors import ConfigError, InputError


def test_a_rounding_backend_calibrated_for_another_d_is_refused_not_under_noised():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(5, 400)), np.array([0, 1, 0, 1, 2])
    m = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, dim=1, backend=OpenDPNoise(grid=0.25))
    small = m.sensitivity["sums"]  # 1 + 0.25 sqrt(1): the slack of d = 1
    with pytest.raises(
        InputError, match=r"d=400 but the mechanism was calibrated for d=1 .*a new mechanism of dim=400"
    ):
        m.release(X, y, rng=rng)
    assert m.sensitivity["sums"] == small and not m.ledger
    right = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, dim=400, backend=OpenDPNoise(grid=0.25))
    assert right.sensitivity["sums"] == pytest.approx(1.0 + 0.25 * np.sqrt(400), rel=1e-12)
    right.release(X, y, rng=rng)  # the d it was calibrated for
    # exact noise with L2 clipping: d does not enter the sensitivity, so another d is harmless
    plain = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, dim=1)
    plain.release(X, y, rng=rng)
    assert plain.sensitivity["sums"] == 1.0


def test_ledger_epsilon_counts_an_iterator_of_events_as_the_same_list():
    ev = ReleaseEvent("gaussian", "sums", 1.0, 1.0)
    listed = ledger_epsilon([ev, ev], 1e-5)
    assert listed[0] > 4.0
    assert ledger_epsilon(iter([ev, ev]), 1e-5) == listed
    assert ledger_epsilon((e for e in [ev, ev]), 1e-5) == listed
    with pytest.raises(ConfigError, match="ReleaseEvent objects .* got a dict"):
        ledger_epsilon([{"mechanism": "gaussian"}], 1e-5)


def test_distributed_guarantee_refuses_shares_no_client_sent():
    dg = DistributedGaussian(sigma=1.0, sensitivity=1.0)
    full = dg.guarantee(4)["full"]["epsilon"]
    assert dg.guarantee(4, present=4)["this_run"]["epsilon"] == pytest.approx(full, rel=1e-12)
    assert dg.guarantee(4, present=2)["this_run"]["epsilon"] > full  # fewer shares: less noise
    for bad in ({"present": 100}, {"present": -3}, {"present": 2.5}, {"present": True}):
        with pytest.raises(ConfigError, match="present"):
            dg.guarantee(4, **bad)
    for args, kw, word in [((0,), {}, "num_clients"), ((2.5,), {}, "num_clients"), ((4, 0), {}, "num_calls")]:
        with pytest.raises(ConfigError, match=word):
            dg.guarantee(*args, **kw)
    with pytest.raises(ConfigError, match="sizes gives 2 statistics' sizes, but 1"):
        dg.guarantee(4, sizes=[3, 4])


@pytest.mark.parametrize(
    "call, word",
    [
        (
            lambda: threat.masking_threat(10, 6, uploaded=range(10), declared_colluders=-3),
            "declared_colluders",
        ),
        (lambda: threat.masking_threat(10, 6, degree=3), "degree=3 must be an even integer"),
        (lambda: threat.masking_threat(2.9, 2), "num_nodes"),
        (lambda: threat.smallest_honest_sum(10, 6, -5), "colluders"),
        (lambda: threat.colluders_tolerated(5, 10), "threshold=10 exceeds the group of 5"),
        (lambda: threat.colluders_tolerated(True, 1), "group_size"),
    ],
)
def test_threat_model_inputs_that_would_raise_the_stated_protection_are_refused(call, word):
    with pytest.raises(ConfigError, match=word):
        call()


def test_declared_colluders_lower_this_runs_smallest_sum():
    # 10 uploaders in one part: the roster's 2 declared colluders know their shares, 8 honest ones remain
    tm = threat.masking_threat(10, 6, uploaded=range(10), declared_colluders=2, epsilon_of=lambda m: 1.0 / m)
    assert tm.shares["this_run"] == 8 and tm.epsilon["this_run"] == pytest.approx(1.0 / 8)
    assert threat.smallest_honest_sum(10, 6, 0) == 6 and threat.smallest_honest_sum(10, 6, 1) == 5


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"level": "clients"}, "level must be 'record' or 'client'"),
        ({"clip_l2": -1.0}, "clip_l2"),
        ({"clip_l2": float("nan")}, "clip_l2"),
        ({"clip_l2": "2"}, "clip_l2"),
        ({"level": "client", "max_records": 0}, "max_records"),
        ({"level": "client", "max_records": 2.5}, "max_records"),
        ({"level": "client", "max_records": True}, "max_records"),
    ],
)
def test_statistic_sensitivity_refuses_what_it_used_to_read_as_another_level_or_bound(kw, word):
    from mechanisms.dp.sensitivity import StatisticSensitivity

    with pytest.raises(ConfigError, match=word):
        StatisticSensitivity(**{"clip_l2": 1.0, **kw})
    assert StatisticSensitivity(1.0, level="client", max_records=3).per_block(("sums",)) == {"sums": 3.0}


def test_block_sigmas_refuses_shares_that_would_state_less_than_the_release_spends():
    from mechanisms.dp.sensitivity import block_sigmas

    sens = {"sums": 2.0, "counts": 1.0}
    ok = block_sigmas(sens, 1.0, {"sums": 0.5, "counts": 0.5})
    # the release's mu: sqrt(sum_b (Delta_b / sigma_b)^2) is the mu asked for
    assert np.sqrt(sum((sens[b] / ok[b]) ** 2 for b in sens)) == pytest.approx(1.0, rel=1e-12)
    for mu, weights, word in [
        (0.0, "equal", "mu must be a number > 0"),
        (-1.0, "equal", "mu must be a number > 0"),
        (1.0, "equl", "weights must be 'equal'"),
        (1.0, {"sums": 1.0, "counts": 0.0}, "a share > 0"),
        (1.0, {"sums": 1.0}, "a share > 0"),
        (1.0, {"sums": 1.0, "counts": 1.0}, "must sum to 1"),
    ]:
        with pytest.raises(ConfigError, match=word):
            block_sigmas(sens, mu, weights)
    with pytest.raises(ConfigError, match="differ by more than float64"):
        GaussianMechanism(epsilon=1, delta=1e-5, clip=1.0, split={"sums": 5e-324, "counts": 1e308})


def test_accountants_at_their_edges_answer_or_refuse_in_one_line():
    ev = ReleaseEvent("gaussian", "sums", 1.0, 1.0)
    for name in ("prv", "rdp", "gdp"):
        assert ledger_epsilon([ev], 0.0, name)[0] == float("inf")
    # refused from the grid's size before any allocation (a host with the memory would have filled 76 GiB)
    for event in (
        ReleaseEvent("gaussian", "sums", 1.0, 1.0, rounds=10**6),
        ReleaseEvent("gaussian", "sums", 1.0, 1e-3),  # mu = 1,000
    ):
        with pytest.raises(ConfigError, match="would span about .* steps, more than memory holds"):
            ledger_epsilon([event], 1e-5, "pld")
    ten = [ReleaseEvent("gaussian", "sums", 1.0, 1.0, rounds=10)]  # well inside: answered, near the exact GDP
    assert ledger_epsilon(ten, 1e-5, "pld")[0] == pytest.approx(ledger_epsilon(ten, 1e-5, "gdp")[0], rel=1e-2)


@pytest.mark.parametrize("draws", [2.7, True, "3", 0, -1])
def test_release_books_whole_draws_only(draws):
    rng = np.random.default_rng(0)
    m = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    with pytest.raises(ConfigError, match="draws must be an integer"):
        m.release(rng.normal(size=(4, 3)), np.array([0, 1, 0, 1]), rng=rng, draws=draws)
    assert not m.ledger
    out = m.release(rng.normal(size=(4, 3)), np.array([0, 1, 0, 1]), rng=rng, draws=3)
    apart = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    for _ in range(3):
        apart.release(rng.normal(size=(4, 3)), np.array([0, 1, 0, 1]), rng=rng)
    assert out.counts.shape[0] == 3
    assert m.report().epsilon == pytest.approx(apart.report().epsilon, rel=1e-12) and m.report().epsilon > 1.0


def test_shamir_combine_refuses_shares_and_coefficients_that_gave_a_wrong_secret():
    from mechanisms.secagg import shamir

    shares = shamir.split(1234, [1, 2, 3], 2, lambda n: bytes(range(n)))
    assert shamir.combine(shares, 2) == 1234
    lam = shamir.lagrange_at_zero(list(shares)[:2])
    assert shamir.combine(shares, 2, lam) == 1234
    for bad, kw, word in [
        (shares, {"coefficients": lam[:1]}, "coefficients must hold 2 values"),
        ({1: 5.7, 2: 7.2}, {}, "share values must be integers"),
        ({1: "5", 2: "7"}, {}, "share values must be integers"),
        ({1: -1, 2: 7}, {}, "share values must be integers"),
        ([(1, 5), (2, 7)], {}, "shares must be a dict"),
    ]:
        with pytest.raises(InputError, match=word):
            shamir.combine(bad, 2, **kw)


def test_noise_backends_refuse_scales_and_values_they_used_to_pass_through():
    from mechanisms.dp.backends import NumpyNoise

    rng = np.random.default_rng(0)
    for call, word in [
        (lambda: NumpyNoise().add_gaussian(np.zeros(3), float("nan"), rng), "sigma must be finite"),
        (lambda: NumpyNoise().add_gaussian(np.zeros(3), float("inf"), rng), "sigma must be finite"),
        (lambda: NumpyNoise().add_gaussian(np.zeros(3), -1.0, rng), "sigma must be finite and >= 0"),
        (lambda: NumpyNoise().add_gaussian(np.zeros(3), "1", rng), "sigma must be a number"),
        (lambda: NumpyNoise().add_gaussian(np.zeros(3), 1.0, None), "rng must be a numpy.random.Generator"),
        (lambda: NumpyNoise().add_laplace(np.zeros(3), float("nan"), rng), "scale must be finite"),
        (lambda: NumpyNoise().add_geometric(np.zeros(3), 0.0, rng), "epsilon of geometric noise must be > 0"),
        (lambda: NumpyNoise().add_geometric(np.zeros(3), float("nan"), rng), "epsilon of geometric noise"),
        (lambda: OpenDPNoise(grid=True), "grid must be a number"),
        (lambda: OpenDPNoise(grid="0.5"), "grid must be a number"),
    ]:
        with pytest.raises(ConfigError, match=word):
            call()
    with pytest.raises(InputError, match="real numbers, got values of dtype complex128"):
        OpenDPNoise().add_gaussian(np.array([1 + 1j]), 1.0)
    assert np.isfinite(NumpyNoise().add_gaussian(np.zeros(3), 1.0, rng)).all()


def test_count_noise_and_distributed_noise_take_numbers_not_bools_or_text():
    from mechanisms.dp.count_noise import LaplaceCountNoise
    from mechanisms.secagg import secagg_upload_bytes

    rng = np.random.default_rng(0)
    for counts in (np.array([1 + 1j]), np.array([True]), np.array(["a"])):
        with pytest.raises(ConfigError, match="counts must be whole numbers, got values of dtype"):
            LaplaceCountNoise(epsilon=1.0).release(counts, rng)
    with pytest.raises(ConfigError, match="sigma must be a positive finite number"):
        DistributedGaussian(sigma=True, sensitivity=1.0)
    with pytest.raises(ConfigError, match="delta must be a number"):
        DistributedGaussian(sigma=1.0, sensitivity=1.0, delta="0.5")
    with pytest.raises(ConfigError, match="epsilon and delta must be numbers"):
        DistributedGaussian.calibrate(epsilon=True, delta=1e-5, sensitivity=1.0, num_clients=4)
    with pytest.raises(ConfigError, match="num_clients"):
        DistributedGaussian.calibrate(epsilon=1.0, delta=1e-5, sensitivity=1.0, num_clients=2.9, tolerate=1)
    for bad in (-2, 3, True):
        with pytest.raises(ConfigError, match="neighbours must be an even integer"):
            secagg_upload_bytes("fedncm", 10, 4, 8, 3, neighbours=bad)
    with pytest.raises(InputError, match="K must be a positive integer"):
        secagg_upload_bytes("fedncm", 10, float("nan"), 8, 3)
    assert secagg_upload_bytes("fedncm", 10, 4, 8, 3, neighbours=2)["upload"] > 0


def test_shamir_helpers_and_release_events_refuse_what_raised_deep_inside():
    from mechanisms.secagg import shamir

    for call, word in [
        (lambda: shamir.lagrange_at_zero([]), "at least one share point"),
        (lambda: shamir.lagrange_at_zero([0, 1, 2]), "non-zero modulo PRIME"),
        (lambda: shamir.field_elements(-1, bytes), "count must be an integer >= 0"),
        (lambda: shamir.field_elements(2.5, bytes), "count must be an integer >= 0"),
        (lambda: shamir.split(4, [1, 2, 3], 2, lambda n: "a" * n), "must return bytes, got a str"),
    ]:
        with pytest.raises(InputError, match=word):
            call()
    assert len(shamir.field_elements(0, bytes)) == 0
    with pytest.raises(ConfigError, match="both infinite"):
        ReleaseEvent("gaussian", "sums", float("inf"), float("inf"))
    with pytest.raises(ConfigError, match="release_id must be an integer"):
        ReleaseEvent("gaussian", "sums", 1.0, 1.0, release_id="x")
    assert ledger_epsilon([ReleaseEvent("gaussian", "sums", float("inf"), 1.0)], 1e-5)[0] == float("inf")


def test_a_share_outside_the_field_aborts_the_unmasking_naming_its_sender(monkeypatch):
    # before: recovered into a wrong secret in silence; then, with the field check, an unattributed InputError
    from mechanisms.secagg.masking import ProtocolAbort, masked_sum
    from mechanisms.secagg.masking.node import MaskingNode

    real = MaskingNode._unmask

    def forged(self, msg):
        out = real(self, msg)
        if self.u == 0:
            out["share"] = [b"\xff" * 32, *out["share"][1:]]
        return out

    assert np.allclose(masked_sum(np.ones((5, 3)), rng=np.random.default_rng(0)).total, 5.0)
    monkeypatch.setattr(MaskingNode, "_unmask", forged)
    with pytest.raises(ProtocolAbort, match=r"node 0 answered a share of node \d+ outside the field"):
        masked_sum(np.ones((5, 3)), rng=np.random.default_rng(0))


def test_the_numpy_backend_refuses_complex_values_too():
    from mechanisms.dp.backends import NumpyNoise

    for call in (
        lambda: NumpyNoise().add_gaussian(np.array([1 + 1j]), 1.0, np.random.default_rng(0)),
        lambda: NumpyNoise().add_gaussian(np.array([1 + 1j]), 0.0, np.random.default_rng(0)),
        lambda: NumpyNoise().add_laplace(np.array(["a"]), 1.0, np.random.default_rng(0)),
    ):
        with pytest.raises(InputError, match="real numbers"):
            call()


def test_helpers_name_bad_input_instead_of_failing_later():
    from mechanisms.dp.backends import register_backend
    from mechanisms.dp.noise_aware import outer_product_bias
    from mechanisms.secagg import PairwiseMasking
    from mechanisms.secagg.ckks.scheme import CKKSParams
    from mechanisms.secagg.fixed_point import check_ring_bound

    for call, err, word in [
        (lambda: register_backend("x", 5), ConfigError, "callable factory"),
        (lambda: register_backend(3, NumpyNoiseFactory), ConfigError, "a non-empty str"),
        (lambda: outer_product_bias(1.0, 10, -1), InputError, "dim must be an integer >= 0"),
        (lambda: outer_product_bias(1.0, 10, 2.5), InputError, "dim must be an integer >= 0"),
        (lambda: check_ring_bound("1", 2, 10), ConfigError, "max_abs must be a number"),
        (lambda: check_ring_bound(None, 2, 10), ConfigError, "max_abs must be a number"),
        (lambda: DistributedGaussian(sigma=1.0, sensitivity=1.0).share_std(0, 0), ConfigError, "num_clients"),
        (lambda: threat.survivor_parts([{1}, {0}], [0, 5]), ConfigError, r"outside 0..1: \[5\]"),
        (lambda: CKKSParams().num_ciphertexts(-5), ConfigError, "size must be an integer >= 0"),
        (lambda: PairwiseMasking(threshold=1), ConfigError, "threshold must be an integer >= 2"),
    ]:
        with pytest.raises(err, match=word):
            call()
    assert outer_product_bias(2.0, 4, 3).tolist() == (0.5 * np.eye(3)).tolist()
    assert threat.survivor_parts([{1}, {0}, set()], [0, 1, 2]) == [(2,), (0, 1)]


def NumpyNoiseFactory():  # noqa: N802 - a backend factory, named as the class it makes
    from mechanisms.dp.backends import NumpyNoise

    return NumpyNoise()
