"""The masking state machines: the active version sums what the honest-but-curious one sums, with the same keys."""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms import masking


@pytest.mark.parametrize("kw", [{}, {"dropped_before_upload": [1], "dropped_after_upload": [4]}])
def test_active_version_uploads_the_same_bytes_and_adds_only_the_consistency_round(kw):
    X = np.random.default_rng(3).normal(size=(7, 11))
    a = masking.masked_sum(X, key_seed=9, active=True, **kw)
    h = masking.masked_sum(X, key_seed=9, **kw)
    assert np.array_equal(a.total, h.total)
    assert np.abs(a.total - X[[u for u in range(7) if u not in kw.get("dropped_before_upload", [])]].sum(0)).max() \
        <= 7 * 2.0**-33
    for u in h.view.masked_uploads:  # same key material: the same masked uploads and encrypted shares
        assert a.view.masked_uploads[u].tobytes() == h.view.masked_uploads[u].tobytes()
    assert a.view.encrypted_shares == h.view.encrypted_shares
    signers = set(range(7)) - set(kw.get("dropped_before_upload", [])) - set(kw.get("dropped_after_upload", []))
    assert set(a.view.consistency_signatures) == signers and not h.view.consistency_signatures
    for u in range(7):
        extra = a.upload_bytes[u]["public_keys"] - h.upload_bytes[u]["public_keys"]
        assert extra == 64 and a.upload_bytes[u]["consistency"] == (64 if u in signers else 0)


def test_active_version_refuses_a_sparse_graph():
    with pytest.raises(masking.ConfigError, match="complete graph"):
        masking.masked_sum(np.ones((6, 2)), neighbours=2, active=True)
