"""Flower's deployment engine on one host: a SuperLink and three SuperNodes as separate processes on 127.0.0.1.

The documented deployment, on loopback: TLS with the operator's CA and SuperLink certificate,
SuperNode authentication with each node's Flower key (signed by its roster identity, verified and
registered by the operator), runs submitted with ``flwr run`` on the app in ``privfed/flower/app``
(offline: runtime dependency installation disabled).  Each process starts in its own process group
and every group is stopped at the end, also when a test fails.  The same deployment across network
namespaces (separate hosts) is tests/flower/test_flower_netns.py.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

pytest.importorskip("flwr")

from flower_deployment import (  # noqa: E402
    BIN,
    Processes,
    env_for,
    flwr_home,
    operator_material,
    register,
    run_app,
    superlink_args,
    supernode_args,
    wait_online,
)

import privfed  # noqa: E402
from privfed.federation import partition  # noqa: E402

K = 3
pytestmark = [
    pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="Flower's executables absent"),
    # Every stage spawns one ClientApp process per node: minutes on a busy 2-core machine. The
    # same app code runs in the default suite on the simulation engine (test_flower.py), and the
    # deployed ServerApp's node-key check over the in-process grid (test_deploy_auth.py).
    pytest.mark.slow,
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flower-deploy")
    m = operator_material(tmp, ["127.0.0.1"], K)
    port = _free_port()
    env = env_for(flwr_home(tmp / "flwr-home", f"127.0.0.1:{port}", m.ca))
    procs = Processes(tmp)
    try:
        link = procs.start(superlink_args(m, "127.0.0.1", port), "superlink.log", env)
        procs.wait_log("superlink.log", r"Uvicorn running on https://", 90, link)
        ids = {register(env, m.registered / f"node-{i}.pub") for i in range(K)}
        for i in range(K):
            # Node 2's ClientApp process exits (a crash, no reply) when it reaches unmasking.
            crash = ' fail-at="unmask:exit"' if i == 2 else ""
            args = supernode_args(
                f"127.0.0.1:{port}", m.keys[i] / "flower-key", m.ca, _free_port(), m.node_config(i, crash)
            )
            procs.start(args, f"supernode{i}.log", env)
        wait_online(env, ids, 120)
        yield env, m
    finally:
        procs.stop()
        assert all(p.poll() is not None for p in procs.procs)


def test_superlink_and_three_supernodes_give_fits_heads_despite_a_crash(deployment, digits_dataset):
    env, m = deployment
    ds = digits_dataset
    F, y, k = partition(ds.train_labels, K, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )
    common = {
        "clients": K,
        "connect-timeout": 90.0,
        "node-keys": str(m.node_keys),
        "eps": "inf",
        "alpha": 0.5,
    }
    plain = run_app(env, m.root / "fedncm", method="fedncm", timeout=90.0, **common)
    ref = privfed.fit("fedncm", F, y, k, num_classes=10)
    assert np.abs(plain["weight"] - ref.weight).max() < 1e-9
    assert plain["report"]["replied"] == K and plain["report"]["wire"]["bytes_up_per_node"] > 0
    assert sorted(plain["report"]["node_authentication"]["nodes"].values()) == list(range(K))

    # Node 2 uploads its masked input, then its process dies at unmasking: the other two
    # (t = 2 of 3) rebuild its self-mask seed, so the sum still covers all three inputs.
    masked = run_app(
        env, m.root / "fed3r-mask", method="fed3r", **{"secure-agg": "mask"}, timeout=60.0, **common
    )
    ref = privfed.fit("fed3r", F, y, k, num_classes=10)
    assert np.abs(masked["weight"] - ref.weight).max() < 1e3 * K * 2.0**-33
    sa = masked["report"]["secure_aggregation"]
    assert sa["summed_nodes"] == K and sa["rounds"][0]["threshold"] == 2
    assert len(sa["rounds"][0]["dropped_after_upload"]) == 1
    unmask = sa["rounds"][0]["stages"]["unmask"]
    assert unmask["answered"] == 2 and (unmask["silent"] or unmask["failed"])
    stages = masked["report"]["wire"]["stages"]
    assert {"setup", "sums:keys", "sums:shares", "sums:masked", "sums:consistency", "sums:unmask"} <= set(
        stages
    )
