"""Bytes on the wire: the compact layout (float32, held classes only without DP) against fit's byte model.

fit counts 4 bytes a float over the statistics a method uploads for the M
(client, class) pairs it sends (every class under DP).  Over the in-process
grid, the real ClientApp's replies are measured array by array.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

import privfed  # noqa: E402
from privfed.audit import audit_release, neighbour_battery  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.federation import partition  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.audit import flower_release  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.stats import compute_client_stats  # noqa: E402

K, C = 4, 10
DP = {"epsilon": 1.0, "clip": 10.0, "noise_seed": 1}


@pytest.fixture(scope="module")
def split(digits_dataset):
    ds = digits_dataset
    return partition(ds.train_labels, K, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )


def _run(method, **kw):
    nodes = {100 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}
    return serve(LocalGrid(nodes), FlowerConfig(method=method, clients=K, **kw))


@pytest.mark.parametrize("dp", [False, True], ids=["plain", "dp"])
@pytest.mark.parametrize("method, counted", [("fedncm", ("sums",)), ("fed3r", ("sums", "second"))])
def test_compact_payload_is_fits_byte_model_plus_counts_and_class_indices(split, method, counted, dp):
    F, y, k = split
    res = _run(method, wire="compact", **(DP if dp else {}))
    pv = res.report["payload_vs_model"]
    by = pv["payload_bytes_by_array"]
    d = F.shape[1]
    # M: pairs with data (counted here from the partition), or every class of every node under DP.
    M = K * C if dp else int(np.count_nonzero(np.bincount(k * C + y, minlength=K * C)))
    model = privfed.methods.get(method).upload_bytes(M=M, K=K, d=d, C=C)
    assert pv["model_bytes"] == model == res.head.upload_bytes["total"]
    assert sum(by[a] for a in counted) == model  # the statistics the model counts, 4 bytes a value
    assert by["counts"] == 4 * M  # not in the model: one count a pair ...
    assert by.get("classes", 0) == (0 if dp else 4 * M)  # ... and, without DP, the class of each row
    dense = _run(method, **(DP if dp else {}))
    # The default float64 dense layout: 8 bytes a value over every class of every node.
    assert sum(dense.report["payload_vs_model"]["payload_bytes_by_array"][a] for a in counted) == 8 * sum(
        {"sums": K * C * d, "second": K * d * d}[a] for a in counted
    )


def test_compact_sum_is_the_sum_of_float32_rounded_uploads(split):
    F, y, k = split
    res = _run("fed3r", wire="compact")
    fields = ("counts", "sums", "second")
    want = {}
    for i in range(K):
        st = compute_client_stats(F[k == i], y[k == i], None, num_classes=C, fields=fields)
        for f in fields:
            want[f] = want.get(f, 0.0) + getattr(st, f)[0].astype(np.float32).astype(np.float64)
    got = dict(zip(fields, res.sums))
    for f, value in want.items():
        assert np.abs(got[f][0] - value).max() <= 1e-9 * max(1.0, np.abs(value).max())
    # float32 moved the statistics (it is not the exact float64 run) by at most 2^-24 relative a value.
    exact = dict(zip(("counts", "sums", "second"), _run("fed3r").sums))
    err = np.abs(got["sums"][0] - exact["sums"][0]).max()
    assert 0 < err <= K * 2.0**-24 * np.abs(exact["sums"][0]).max()
    np.testing.assert_array_equal(got["counts"][0], exact["counts"][0])  # integer counts: exact in float32


def test_compact_dp_uploads_reveal_nothing_deterministic():
    run = flower_release("fedncm", epsilon=4.0, clip=3.0, wire="compact")
    res = audit_release(run, neighbour_battery("record"), draws=0, meta_draws=3)
    assert all(r.verdict == "metadata only" for r in res), [r for r in res if r.flagged]


def test_compact_layout_is_refused_with_secure_aggregation():
    with pytest.raises(ConfigError, match="wire=compact applies to plain uploads"):
        FlowerConfig(method="fedncm", clients=K, secure="mask", wire="compact")
    with pytest.raises(ConfigError, match="wire must be 'float64' or 'compact'"):
        FlowerConfig(method="fedncm", clients=K, wire="float16")


def test_the_server_polls_less_often_the_more_replies_it_awaits():
    """Each poll asks the grid after every pending message: a thousand pending are polled every half second,
    a hundred or fewer at the shortest interval, and never less often than once a second."""
    from privfed.flower.transport import POLL_SECONDS, poll_interval

    assert poll_interval(1000) == 0.5 and poll_interval(100) == poll_interval(3) == POLL_SECONDS
    assert poll_interval(10**6) == 1.0 and poll_interval(400) == 0.2


def test_a_masked_flower_sum_notes_rounding_that_swamps_its_statistics(split):
    """The masked sum over Flower said nothing when its fixed-point rounding (each of the K uploaders rounds
    each value to 2^-f) was a visible share of the statistics, where the same sum in process notes it: at
    f = 2 the K = 4 uploaders move each summed value by up to 4 x 2^-3 = 0.5, at the default f = 32 by 5e-10."""
    from mechanisms.secagg.bounds import PublicBounds
    from privfed.flower.provision import simulated_identities

    nodes = {100 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}
    grid = LocalGrid(simulated_identities(nodes, bounds=PublicBounds(frac_bits=2)))  # the roster fixes f
    coarse = serve(grid, FlowerConfig(method="fedncm", clients=K, secure="mask", frac_bits=2))
    notes = [n for n in coarse.head.notes if "fixed-point rounding" in n]
    assert len(notes) == 1 and "f = 2 fractional bits, 4 uploaders" in notes[0] and "by up to 0.5" in notes[0]
    assert not [n for n in _run("fedncm", secure="mask").head.notes if "fixed-point rounding" in n]


def test_a_ckks_flower_sum_notes_a_release_grid_that_swamps_its_statistics(split, monkeypatch):
    """The CKKS sum over Flower noted nothing, where the same sum in process notes its 2^-p grid: released on
    whole numbers (p = 0, for the server and the nodes alike), the digits' sums move by up to about 0.625."""
    pytest.importorskip("tenseal")
    import dataclasses

    import privfed.flower.ckks as flower_ckks
    import privfed.flower.server_secure as server_secure
    from mechanisms.secagg.ckks.scheme import CKKSParams

    assert not [n for n in _run("fedncm", secure="ckks").head.notes if "CKKS releases the sum" in n]
    whole = dataclasses.replace(CKKSParams(), precision_bits=0)
    for module in (server_secure, flower_ckks):  # the key holder (a node) rounds; the server notes
        monkeypatch.setattr(module, "CKKSParams", lambda: whole)
    res = _run("fedncm", secure="ckks")
    assert res.sums and all(np.array_equal(s, np.round(s)) for s in res.sums)  # released on the grid noted
    notes = [n for n in res.head.notes if "CKKS releases the sum" in n]
    assert len(notes) == 1 and "on the 2^-0 grid" in notes[0] and "by up to about 0.625" in notes[0]
