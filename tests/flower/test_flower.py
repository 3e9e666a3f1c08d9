"""privfed as a Flower app: the same heads as ``fit``, secure aggregation over messages, clear errors.

One Flower simulation (4 virtual SuperNodes, Ray) runs every configuration in
sequence (start-up is most of its cost); the error paths that need a node
with odd data run the real ClientApp and ServerApp over an in-process grid
that delivers messages directly (``_LocalGrid``), which takes milliseconds.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")


import privfed  # noqa: E402
from mechanisms import GaussianMechanism  # noqa: E402
from mechanisms.secagg import fixed_point
from mechanisms.secagg.masking import ProtocolAbort  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.federation import partition  # noqa: E402
from privfed.flower import FlowerConfig, run_simulation, serve  # noqa: E402
from privfed.flower.client_app import make_client_app  # noqa: E402
from privfed.flower.fold import NodeFold  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.protocol import sum_vector  # noqa: E402
from privfed.flower.secagg import simulated_identities  # noqa: E402
from privfed.stats import ClientStats, compute_client_stats  # noqa: E402

K = 4
SUM_ONLY = ["fedncm", "fed3r", "fed3r-within", "fedcgs", "fedlog", "fedcof-oracle"]
#: Fixed-point bound of a masked sum: K inputs each rounded to 2^-(f+1), f = 32 bits.
MASK_BOUND = K * 2.0**-33
ROUNDS_PARAMS = {"local_epochs": 1, "families": ["mlp"], "init": "scratch"}


def _configs():
    # Stage timeouts far above a stage's time: on a loaded machine the first stage waits for the
    # nodes' processes to start.  The faults below answer at once, so nothing waits on them.
    w = dict(clients=K, timeout=900.0, connect_timeout=900.0)
    warm = FlowerConfig(method="fedncm", **w)  # first: every node's process has started after it
    plain = [FlowerConfig(method=m, **w) for m in [*SUM_ONLY, "fedcof"]]
    secure = [FlowerConfig(method=m, secure="mask", **w) for m in ("fedcof", "fedncm", "fedcgs")]
    dp = FlowerConfig(method="fedncm", epsilon=1.0, delta=1e-5, clip=10.0, noise_seed=7, **w)
    dp_central = FlowerConfig(
        method="fed3r", epsilon=2.0, delta=1e-5, clip=10.0, noise_seed=3, trusted_aggregator=True, **w
    )
    # multi-round FedLog under DP, masked: the real simulation engine against privfed.rounds (below)
    rounds_dp = FlowerConfig(
        method="fedlog",
        rounds=2,
        rounds_params=ROUNDS_PARAMS,
        epsilon=4.0,
        delta=1e-5,
        clip=2.0,
        noise_seed=5,
        secure="mask",
        **w,
    )
    too_many = FlowerConfig(method="fedncm", clients=K + 1, connect_timeout=1.0)
    return {
        "warm": warm,
        **{f"plain:{c.method}": c for c in plain},
        **{f"mask:{c.method}": c for c in secure},
        "dp": dp,
        "dp_central": dp_central,
        "rounds_dp": rounds_dp,
        "too_many": too_many,
    }


#: Ray's default root while the module's simulation ran (RAY_TMPDIR): its sessions must not land there.
RAY_DEFAULT_ROOT: list = []


@pytest.fixture(scope="module")
def sim(digits_dataset, tmp_path_factory):
    """One simulation of K nodes running every configuration (dropout drills run over the in-process grid)."""
    cfgs = _configs()
    root = tmp_path_factory.mktemp("ray-default-root")
    RAY_DEFAULT_ROOT.append(root)
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(root)
    t0 = time.monotonic()
    try:
        out = run_simulation(list(cfgs.values()), num_supernodes=K, keep_view=True)
    finally:
        if before is None:
            del os.environ["RAY_TMPDIR"]
        else:
            os.environ["RAY_TMPDIR"] = before
    return dict(zip(cfgs, out)), time.monotonic() - t0


def test_the_simulation_leaves_no_ray_session_behind(sim):
    """Ray's sessions (logs, sockets) of a simulation live in a folder of the run's own, removed at its end; its
    default root (which keeps every session for good) stays untouched."""
    assert list(RAY_DEFAULT_ROOT[0].iterdir()) == []


@pytest.fixture(scope="module")
def split(digits_dataset):
    ds = digits_dataset
    F, y, k = partition(ds.train_labels, K, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )
    return F, y, k


def _fit(method, F, y, k, **kw):
    return privfed.fit(method, F, y, k, num_classes=10, **kw)


def _ok(results, key):
    res = results[key]
    assert not isinstance(res, Exception), f"{key} raised {res!r}"
    return res


def test_simulation_of_multi_round_fedlog_under_masked_dp_is_run_rounds(sim):
    """On Flower's simulation engine (Ray), multi-round FedLog with distributed noise under masking gives
    privfed.rounds.run_rounds' heads (masked sums are exact in the ring) and its composed guarantee."""
    from privfed.rounds import run_rounds

    res = _ok(sim[0], "rounds_dp")
    ref = run_rounds(
        clients=K,
        rounds=2,
        baselines=(),
        epsilon=4.0,
        delta=1e-5,
        clip=2.0,
        noise_seed=5,
        placement="distributed",
        partition="dirichlet",  # the Flower run config's default partition
        alpha=0.5,
        **{**ROUNDS_PARAMS, "families": ("mlp",)},
    )
    for r in range(2):
        eta = np.concatenate([res.heads[r].bias[:, None], res.heads[r].weight], axis=1)
        np.testing.assert_array_equal(eta, ref.history[r]["eta"])
    assert res.head.privacy.guarantee == ref.privacy.guarantee
    assert res.head.privacy.epsilon == ref.privacy.epsilon


@pytest.mark.parametrize("method", [*SUM_ONLY, "fedcof"])
def test_simulation_head_equals_fit(sim, split, method):
    res = _ok(sim[0], f"plain:{method}")
    ref = _fit(method, *split)
    np.testing.assert_allclose(res.head.weight, ref.weight, rtol=0, atol=1e-9)
    np.testing.assert_allclose(res.head.bias, ref.bias, rtol=0, atol=1e-9)
    assert res.report["replied"] == K
    assert res.head.upload_bytes["total"] == ref.upload_bytes["total"]
    wire = res.report["wire"]
    # Each node sent its float64 statistics: at least 8 bytes a float of what fit counts at 4.
    assert wire["bytes_up_per_node"] >= 2 * ref.upload_bytes["per_client"]


@pytest.mark.parametrize("method", ["fedcof", "fedncm", "fedcgs"])
def test_masked_head_equals_fit_to_fixed_point_bound(sim, split, method):
    res = _ok(sim[0], f"mask:{method}")
    plain = _ok(sim[0], f"plain:{method}")
    ref = _fit(method, *split)
    # Same statistics summed to within K 2^-33 per coordinate; the head moves by at most a
    # small multiple of that (its condition number on digits is below 1e3).
    err = np.abs(res.head.weight - ref.weight).max()
    assert err < 1e3 * MASK_BOUND
    assert np.abs(plain.head.weight - ref.weight).max() < 1e-9
    sa = res.head.secure_aggregation
    assert sa["summed_nodes"] == K and sa["dropped"] == []
    assert len(sa["rounds"]) == (2 if method == "fedcof" else 1)


def test_server_never_holds_a_clients_statistics_under_masking(sim, split):
    """Everything the server received in a masked run: keys, ciphertexts, masked ring
    elements and seed shares; no float array, and no upload close to any client's statistic."""
    res = _ok(sim[0], "mask:fedncm")
    plain = _ok(sim[0], "plain:fedncm")
    F, y, k = split
    method = privfed.methods.get("fedncm")
    truths = [
        sum_vector(compute_client_stats(F[k == i], y[k == i], None, num_classes=10), method) for i in range(K)
    ]
    kinds = {type(v).__name__ for (_, _, _, v) in res.received}
    assert kinds <= {"tuple", "bytes", "ndarray", "int"}
    uploads = [v for (stage, _, _, v) in res.received if isinstance(v, np.ndarray)]
    assert len(uploads) == K and all(u.dtype == np.uint64 for u in uploads)
    for u in uploads:
        decoded = fixed_point.decode(u, 32)
        for x in truths:
            assert not np.array_equal(u, fixed_point.encode(x, 32))
            assert np.abs(decoded - x).max() > 1e3
    # The plain run, by contrast, hands the server every client's own statistics.
    sent = [np.concatenate([a["counts"].ravel(), a["sums"].ravel()]) for (_, _, a) in plain.received]
    assert any(np.allclose(s, truths[0]) for s in sent)


def test_dropouts_before_and_after_upload_give_the_survivors_sum(digits_dataset):
    n = 6  # t = 4 (the default tolerates a colluder): node 5 drops before uploading, node 4 after; 4 of the
    # 5 uploaders unmask
    app = make_client_app(faults={5: "masked", 4: "unmask"})
    res = serve(
        _LocalGrid(_digits_nodes(n), app), FlowerConfig(method="fed3r", clients=n, secure="mask", timeout=30)
    )
    ds = digits_dataset
    F, y, k = partition(ds.train_labels, n, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )
    keep = k < 5  # partition 5 dropped before uploading; partition 4 uploaded, then dropped
    ref = _fit("fed3r", F[keep], y[keep], k[keep])
    assert np.abs(res.head.weight - ref.weight).max() < 1e3 * n * 2.0**-33
    full = _fit("fed3r", F, y, k)
    assert np.abs(res.head.weight - full.weight).max() > 1e-3  # not the full federation's head
    rnd = res.head.secure_aggregation["rounds"][0]
    assert rnd["uploaded"] == 5 and len(rnd["dropped_before_upload"]) == 1
    assert len(rnd["dropped_after_upload"]) == 1
    assert rnd["stages"]["masked"]["failed"] and rnd["stages"]["unmask"]["failed"]
    assert rnd["stages"]["consistency"]["answered"] == 5 and rnd["stages"]["unmask"]["answered"] == 4
    assert any("dropped before uploading" in n for n in res.head.notes)


def test_dp_report_equals_fit_report(sim, split):
    for key, kw in (("dp", {}), ("dp_central", {"trusted_aggregator": True})):
        res = _ok(sim[0], key)
        cfg = _configs()[key]
        blocks = ("sums", "counts", "second") if cfg.method == "fed3r" else ("sums", "counts")
        mech = GaussianMechanism(epsilon=cfg.epsilon, delta=cfg.delta, clip=cfg.clip, blocks=blocks, **kw)
        ref = _fit(cfg.method, *split, num_clients=K, privacy=mech, random_state=0)
        got, want = res.head.privacy, ref.privacy
        assert got.guarantee == want.guarantee
        assert got.epsilon == pytest.approx(want.epsilon, rel=1e-12)
        assert got.sigma == want.sigma and got.num_events == want.num_events
        assert res.report["privacy"]["guarantee"] == want.guarantee
        assert "seeded" in res.report["noise_randomness"]


def test_too_few_nodes_is_a_clear_error_within_the_timeout(sim):
    err = sim[0]["too_many"]
    assert isinstance(err, ConfigError)
    assert f"only {K} of the {K + 1} expected nodes" in str(err)


# -------------------------------------------------------------------- in-process grid
_LocalGrid = LocalGrid


def _digits_nodes(n):
    return {100 + i: {"partition-id": i, "num-partitions": n} for i in range(n)}


def test_local_grid_matches_fit(digits_dataset, split):
    res = serve(_LocalGrid(_digits_nodes(K)), FlowerConfig(method="fedcof", clients=K))
    assert np.abs(res.head.weight - _fit("fedcof", *split).weight).max() < 1e-9


def test_node_without_data_is_a_clear_server_error(digits_dataset, tmp_path):
    empty = tmp_path / "empty.npz"
    np.savez(empty, features=np.zeros((0, 64)), labels=np.zeros(0, dtype=np.int64))
    nodes = {**_digits_nodes(2), 7: {"features": str(empty)}}
    nodes.pop(101)
    for secure in ("none", "mask"):
        with pytest.raises(ConfigError, match="node 7.*is empty"):
            serve(
                _LocalGrid(nodes),
                FlowerConfig(method="fedncm", clients=2, secure=secure, timeout=5, num_classes=10),
            )
    bare = {**_digits_nodes(2), 9: {}}
    bare.pop(101)
    with pytest.raises(ConfigError, match="node 9.*has no data"):
        serve(_LocalGrid(bare), FlowerConfig(method="fedncm", clients=2, timeout=5))


def test_mismatched_dimension_is_a_clear_server_error(digits_dataset, tmp_path):
    rng = np.random.default_rng(0)
    odd = tmp_path / "d32.npz"
    np.savez(odd, features=rng.normal(size=(40, 32)), labels=np.arange(40) % 10)
    nodes = {**_digits_nodes(2), 5: {"features": str(odd)}}
    nodes.pop(101)
    for secure, says in (("none", "same backbone"), ("mask", "disagree on the shape")):
        with pytest.raises(ConfigError, match=says):
            serve(
                _LocalGrid(nodes),
                FlowerConfig(method="fedncm", clients=2, secure=secure, timeout=5, num_classes=10),
            )


def test_silent_node_times_out_and_secure_run_aborts_below_threshold(digits_dataset):
    # Node 102 crashes at its first masked stage (no reply); t = 3 of 3 cannot be met.
    app = make_client_app(faults={2: "masked"})
    t0 = time.monotonic()
    with pytest.raises(ProtocolAbort, match="stage 'masked'.*below the threshold t=3"):
        serve(
            _LocalGrid(simulated_identities(_digits_nodes(3), threshold=3), app),
            FlowerConfig(method="fedncm", clients=3, secure="mask", threshold=3, timeout=1.0),
        )
    assert time.monotonic() - t0 < 10


def test_bad_run_config_is_refused_before_any_message():
    with pytest.raises(ConfigError, match="unknown method 'fednope'"):
        FlowerConfig.from_run_config({"method": "fednope"})
    with pytest.raises(ConfigError, match="unknown run-config key"):
        FlowerConfig.from_run_config({"method": "fedncm", "epsilonn": 1})
    with pytest.raises(ConfigError, match="needs clip"):  # no public split to take a default clip from
        FlowerConfig.from_run_config({"method": "fedncm", "eps": 1.0, "dataset": "synthetic:4:10"})
    assert (
        FlowerConfig.from_run_config({"method": "fedncm", "eps": 1.0}).clip > 0
    )  # digits: the public median
    with pytest.raises(ConfigError, match="gamma"):
        FlowerConfig.from_run_config({"method": "fedcof", "param": '{"gamma": -1}'})
    cfg = FlowerConfig.from_run_config(
        {
            "method": "fed3r",
            "clients": 5,
            "eps": "inf",
            "param": '{"lam": 0.5}',
            "noise-seed": "none",
        }
    )
    assert cfg.clients == 5 and math.isinf(cfg.epsilon) and cfg.method_params == {"lam": 0.5}
    assert FlowerConfig.from_wire(cfg.to_wire()) == cfg


def test_fold_is_a_running_sum_for_sum_only_methods():
    rng = np.random.default_rng(1)
    F, y = rng.normal(size=(200, 6)), rng.integers(0, 3, 200)
    k = np.arange(200) % 5
    method = privfed.methods.get("fed3r")
    fold = NodeFold(method)
    for i in range(5):
        fold.add(
            f"node {i}",
            compute_client_stats(F[k == i], y[k == i], None, num_classes=3, fields=method.requires),
        )
    total = fold.result()
    ref = compute_client_stats(F, y, k, num_classes=3, fields=method.requires).total()
    assert (
        total.num_clients == 1 and fold.fold.keep == "total" and not fold.fold._pairs
    )  # nothing kept per node
    for name, arr in ref.arrays().items():
        np.testing.assert_allclose(getattr(total, name), arr, rtol=0, atol=1e-10)
    with pytest.raises(ConfigError, match="same backbone"):
        fold.add(
            "node 9", ClientStats(counts=np.ones((1, 3)), sums=np.ones((1, 3, 4)), second=np.ones((1, 4, 4)))
        )


def test_round_loop_folds_each_round_and_feeds_the_next(digits_dataset, split):
    """The multi-round hook: each node's round-r statistic depends on the broadcast; the loop
    sums them per round and stops when the step says so."""
    from privfed.flower.rounds import ROUND_STATISTICS, register_round_statistics, run_rounds

    @register_round_statistics("test-scaled-sums")
    def node_round(data, cfg, broadcast, r):
        st = compute_client_stats(data.features, data.labels, None, num_classes=data.num_classes)
        return ClientStats(counts=st.counts, sums=st.sums * broadcast["scale"][0])

    seen = []

    def step(r, total):
        seen.append(total.sums[0].copy())
        return {"scale": np.array([r + 2.0])} if r < 2 else None

    try:
        grid = _LocalGrid(_digits_nodes(K))
        cfg = FlowerConfig(method="fedlog", clients=K, timeout=5)
        stages = run_rounds(
            grid,
            cfg,
            sorted(grid.contexts),
            name="test-scaled-sums",
            first={"scale": np.array([1.0])},
            step=step,
            max_rounds=10,
        )
    finally:
        ROUND_STATISTICS.pop("test-scaled-sums", None)
    F, y, k = split
    base = compute_client_stats(F, y, None, num_classes=10).sums[0]
    assert len(stages) == 3 and all(len(s.answered) == K for s in stages)
    for r, got in enumerate(seen):
        np.testing.assert_allclose(got, base * (r + 1), rtol=1e-12, atol=1e-9)


def test_command_line_errors_are_one_line(capsys):
    from privfed.commands.flower import main

    assert main(["--method", "fednope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown method 'fednope'" in err[0]
    assert main(["--method", "fedcof", "--eps", "1", "--dataset", "synthetic:8:20"]) == 2
    assert "needs clip" in capsys.readouterr().err


def test_feature_file_per_node_is_a_natural_split(tmp_path):
    rng = np.random.default_rng(4)
    F, y = rng.normal(size=(90, 8)), np.arange(90) % 3
    k = np.repeat(np.arange(3), 30)
    nodes = {}
    for i in range(3):
        path = tmp_path / f"site{i}.npz"
        np.savez(path, features=F[k == i], labels=y[k == i])
        nodes[20 + i] = {"features": str(path)}
    for method in ("fed3r", "fedcof"):
        res = serve(_LocalGrid(nodes), FlowerConfig(method=method, clients=3, num_classes=3, timeout=5))
        ref = privfed.fit(method, F, y, k, num_classes=3)
        assert np.abs(res.head.weight - ref.weight).max() < 1e-9


def test_flwr_app_config_names_every_key_and_the_components():
    import pathlib
    import tomllib
    from dataclasses import fields

    app = pathlib.Path(privfed.__file__).parent / "flower" / "app" / "pyproject.toml"
    flwr_cfg = tomllib.loads(app.read_text())["tool"]["flwr"]["app"]
    run_config = flwr_cfg["config"]
    from privfed.flower.config import RUN_CONFIG_KEYS, public_clip

    # flwr run --run-config can override only keys the app declares: every key is declared, named like the
    # commands' flags where the field's name differs (eps, secure-agg, seeds, out, param), and the deployed
    # ServerApp's own node-keys (privfed.flower.deploy.server), which it takes out first.
    renamed = {v: k for k, v in RUN_CONFIG_KEYS.items()}
    declared = {renamed.get(f.name, f.name.replace("_", "-")) for f in fields(FlowerConfig)}
    assert set(run_config) == declared | {"node-keys"}
    assert FlowerConfig.from_run_config(
        {k: v for k, v in run_config.items() if k != "node-keys"}
    ) == FlowerConfig(method="fedlog", clients=2, epsilon=0.1, alpha=0.1, clip=public_clip("digits"))
    assert flwr_cfg["components"] == {
        "serverapp": "privfed.flower.deploy.server:app",
        "clientapp": "privfed.flower.client_app:app",
    }


@pytest.mark.parametrize("method", ["fedncm", "fedcof"])
def test_ckks_with_a_node_as_key_holder_equals_fit(digits_dataset, split, method):
    """CKKS over messages: node 101 holds the keys; the server only adds ciphertexts."""
    pytest.importorskip("tenseal")
    nodes = _digits_nodes(K)
    nodes[101] = {**nodes[101], "key-holder": "true"}
    res = serve(
        _LocalGrid(nodes), FlowerConfig(method=method, clients=K, secure="ckks", timeout=30), keep_view=True
    )
    ref = _fit(method, *split)
    # Released on the 2^-20 grid: sums within 2^-21 per coordinate.
    assert np.abs(res.head.weight - ref.weight).max() < 1e3 * 2.0**-21
    rounds = res.head.secure_aggregation["rounds"]
    assert all(r["key_holder"] == 101 and r["uploaded"] == K for r in rounds)
    assert len(rounds) == (2 if method == "fedcof" else 1)
    kinds = [(stage, name) for (stage, _, name, _) in res.received]
    # The server received ciphertexts from every node and, per sum, one released total.
    assert kinds.count(("ckks_encrypt", "ciphertexts")) == K * len(rounds)
    assert [k for k in kinds if k[0] != "ckks_encrypt"] == [("ckks_decrypt", "released sum")] * len(rounds)


@pytest.mark.parametrize("eps", [float("nan"), -1.0, float("-inf"), 0.0])
def test_a_run_config_with_a_budget_that_would_add_no_noise_is_refused(eps):
    """flwr run passes the run config straight to FlowerConfig, without the command's checks."""
    from privfed.errors import ConfigError

    with pytest.raises(ConfigError, match=r"eps \(epsilon\) must be a number > 0"):
        FlowerConfig(method="fedncm", clients=4, epsilon=eps, clip=10.0)


def test_a_secure_run_whose_nodes_are_silent_says_they_timed_out(digits_dataset):
    """Two of three nodes silent at query.setup was reported as 'needs at least 2 nodes with data, got 0'."""
    real = make_client_app()
    nodes = simulated_identities(_digits_nodes(3))
    late = sorted(nodes)[1:]

    def app(msg, context):  # two nodes never answer the setup stage (no reply at all: silent, not failed)
        if msg.metadata.message_type == "query.setup" and msg.metadata.dst_node_id in late:
            return None
        return real(msg, context)

    with pytest.raises(ConfigError) as got:
        serve(
            _LocalGrid(nodes, app),
            FlowerConfig(method="fedncm", clients=3, secure="mask", timeout=1.0),
        )
    text = str(got.value)
    assert "got 1; 2 of 3 nodes did not answer query.setup within 1 s (silent: [" in text, text
    assert text.endswith("): raise timeout")
