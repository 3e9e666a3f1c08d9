"""The masking state machines: the active version sums what the honest-but-curious one sums, with the same keys."""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms.secagg import masking


@pytest.mark.parametrize("kw", [{}, {"dropped_before_upload": [1], "dropped_after_upload": [4]}])
def test_active_version_uploads_the_same_bytes_and_adds_only_the_consistency_round(kw):
    X = np.random.default_rng(3).normal(size=(7, 11))
    a = masking.masked_sum(X, key_seed=9, active=True, **kw)
    h = masking.masked_sum(X, key_seed=9, **kw)
    assert np.array_equal(a.total, h.total)
    assert (
        np.abs(
            a.total - X[[u for u in range(7) if u not in kw.get("dropped_before_upload", [])]].sum(0)
        ).max()
        <= 7 * 2.0**-33
    )
    for u in h.view.masked_uploads:  # same key material: the same masked uploads and encrypted shares
        assert a.view.masked_uploads[u].tobytes() == h.view.masked_uploads[u].tobytes()
    assert a.view.encrypted_shares == h.view.encrypted_shares
    signers = (
        set(range(7)) - set(kw.get("dropped_before_upload", [])) - set(kw.get("dropped_after_upload", []))
    )
    assert set(a.view.consistency_signatures) == signers and not h.view.consistency_signatures
    for u in range(7):
        extra = a.upload_bytes[u]["public_keys"] - h.upload_bytes[u]["public_keys"]
        assert extra == 64 and a.upload_bytes[u]["consistency"] == (64 if u in signers else 0)


@pytest.mark.parametrize("kw", [{}, {"dropped_before_upload": [2]}, {"dropped_after_upload": [5]}])
def test_active_version_on_a_sparse_graph_sums_exactly_and_costs_the_same_at_any_K(kw):
    """On the roster's k-regular graph every node's traffic depends on k alone: the same bytes up and down for
    K = 9 and K = 17 (no dropouts), more for a larger k; the sum is the uploaders' sum."""
    per_node = {}
    for K, k in ((9, 4), (17, 4), (17, 6)):
        X = np.random.default_rng(K).normal(size=(K, 7))
        r = masking.masked_sum(X, active=True, neighbours=k, **kw)
        # the default threshold tolerates a colluder: 2t > (k + 1) + 1, so one dropout per group of k + 1 = 5
        assert r.view.consistency_signatures and r.threshold == (k + 2) // 2 + 1
        assert np.abs(r.total - X[list(r.uploaded)].sum(0)).max() <= K * 2.0**-33
        assert set(r.uploaded) == set(range(K)) - set(kw.get("dropped_before_upload", []))
        per_node[K, k] = (sum(r.upload_bytes[0].values()), r.download_bytes[0])
    if not kw:
        assert per_node[9, 4] == per_node[17, 4]
    assert per_node[17, 6][0] > per_node[17, 4][0] and per_node[17, 6][1] > per_node[17, 4][1]


def test_active_version_refuses_an_odd_degree():
    for k in (3, 1, 0):
        with pytest.raises(masking.ConfigError, match="even integer"):
            masking.masked_sum(np.ones((6, 2)), neighbours=k, active=True)


def _extra_bytes(K: int, after: int) -> tuple[float, float]:
    """Bytes the active version adds per client, from the protocol description: up, a signature on the key
    advertisement, on the echo with the upload and on the uploader list (the S = K - after signers); down,
    the K - 1 peers' advertisement signatures, the uploader list (4 bytes an id) to consistency, and to each
    signer min(S, t) (id, signature) pairs (its own and t - 1 more: a node checks t) and the K echoes, less
    the uploader list the honest version sends to all K."""
    from mechanisms.secagg.threat import default_threshold

    S, sig, idb, t = K - after, 64, 4, default_threshold(K)
    up = (K * 2 * sig + S * sig) / K
    down = (
        K * (K - 1) * sig + K * idb * K + S * (idb * K + (idb + sig) * min(S, t) + sig * K) - K * idb * K
    ) / K
    return up, down


def test_consistency_round_bytes_follow_the_protocol_description():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from experiments.bench_secagg import run_active

    rows, _ = run_active(K=10, D=5, repeats=1, seed=0)
    for r in rows:
        up, down = _extra_bytes(10, r["dropped_after_upload"])
        assert r["extra_upload_bytes_per_client"] == pytest.approx(up, abs=1e-9)
        assert r["extra_download_bytes_per_client"] == pytest.approx(down, abs=1e-9)
        assert r["active_max_abs_error"] <= r["error_bound"] and r["honest_max_abs_error"] <= r["error_bound"]


def test_recorded_consistency_round_benchmark_is_what_its_rows_say():
    from experiments import recorded

    try:
        rec = recorded.load("bench_secagg_active")
    except recorded.MissingRecord:
        pytest.skip("no record yet: python experiments/bench_secagg.py --active --record")
    K = rec["data"]["config"]["clients"]
    for r in rec["data"]["rows"]:
        assert r["cpu_ratio"] == pytest.approx(r["active_cpu_s"] / r["honest_cpu_s"], rel=1e-12)
        assert r["upload_ratio"] == pytest.approx(
            r["active_upload_bytes_per_client"] / r["honest_upload_bytes_per_client"], rel=1e-12
        )
        up, down = _extra_bytes(K, r["dropped_after_upload"])
        assert r["extra_upload_bytes_per_client"] == pytest.approx(up, abs=1e-6)
        assert r["extra_download_bytes_per_client"] == pytest.approx(down, abs=1e-6)
        assert r["active_max_abs_error"] <= r["error_bound"]


def test_operator_command_writes_a_roster_and_private_identity_files(tmp_path, capsys):
    import os
    import stat

    from mechanisms.secagg.identity import Roster, main
    from privfed.errors import ConfigError
    from privfed.flower.secagg import node_identity

    assert main([str(tmp_path), "--nodes", "5"]) == 0
    roster = Roster.load(tmp_path / "roster.json")
    # the default declares one colluder: 2t > 5 + 1, t = 4, which tolerates 2t - 5 - 1 = 2
    assert roster.size == 5 and roster.threshold == 4 and roster.colluders == 1 and roster.tolerated == 2
    for i in range(5):
        path = tmp_path / f"node-{i}.json"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        ident, r = node_identity(
            {
                "secagg-identity": str(path),
                "secagg-roster": str(tmp_path / "roster.json"),
                "secagg-ledger": str(tmp_path / f"ledger-{i}.txt"),
            },
            i,
        )
        assert ident.index == i and r == roster
    # Node 1's key with node 2's index (or another roster) is refused, as is a node without any identity.
    bad = tmp_path / "bad.json"
    bad.write_text((tmp_path / "node-1.json").read_text().replace('"index": 1', '"index": 2'))
    with pytest.raises(ConfigError, match="not in the roster"):
        node_identity(
            {
                "secagg-identity": str(bad),
                "secagg-roster": str(tmp_path / "roster.json"),
                "secagg-ledger": str(tmp_path / "ledger.txt"),
            },
            7,
        )
    with pytest.raises(ConfigError, match="node 7 has no secure-aggregation identity.*secagg-identity"):
        node_identity({}, 7)
    assert main([str(tmp_path / "x"), "--nodes", "6", "--threshold", "3"]) == 2
    assert "t > n_C + (K - n_C)/2" in capsys.readouterr().err
