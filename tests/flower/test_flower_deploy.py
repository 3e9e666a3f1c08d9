"""Flower's deployment engine: a SuperLink and three SuperNodes as separate processes on 127.0.0.1.

Each process starts in its own process group and every group is stopped at the
end, also when a test fails.  Runs are submitted with ``flwr run`` on the app in
``privfed/flower/app`` (offline: runtime dependency installation disabled).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

import privfed  # noqa: E402
from privfed.federation import partition  # noqa: E402

BIN = pathlib.Path(sys.executable).parent
APP = pathlib.Path(__file__).resolve().parents[2] / "privfed" / "flower" / "app"
K = 3
pytestmark = [
    pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="Flower's executables absent"),
    # Every stage spawns one ClientApp process per node: minutes on a busy 2-core machine. The
    # same app code runs in the default suite on the simulation engine (test_flower.py).
    pytest.mark.slow,
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc), to stop what Flower spawned in other groups."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _stop(procs: list[subprocess.Popen]) -> None:
    spawned = set().union(*(_descendants(p.pid) for p in procs)) if procs else set()
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)
    for pid in spawned:  # children Flower detached into groups of their own
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_port(port: int, timeout: float, procs) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a Flower process exited during start-up")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, digits_dataset):
    tmp = tmp_path_factory.mktemp("flower-deploy")
    home = tmp / "flwr-home"
    home.mkdir()
    port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PYTHONPATH": str(APP.parents[2]),
    }
    procs: list[subprocess.Popen] = []

    def start(args, log):
        procs.append(
            subprocess.Popen(
                args,
                env=env,
                cwd=tmp,
                stdout=open(tmp / log, "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    # The operator's roster and one identity file per node (what a deployment distributes).
    assert (
        subprocess.run(
            [sys.executable, "-m", "mechanisms.secagg.identity", str(tmp / "ids"), "--nodes", str(K)],
            env=env,
            capture_output=True,
        ).returncode
        == 0
    )
    try:
        start(
            [
                BIN / "flower-superlink",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--health-server-address",
                f"127.0.0.1:{_free_port()}",
            ],
            "superlink.log",
        )
        _wait_port(port, 60, procs)
        for i in range(K):
            # Node 2's ClientApp process exits (a crash, no reply) when it reaches unmasking.
            crash = ' fail-at="unmask:exit"' if i == 2 else ""
            # The plain fedncm run below needs it: a node with a roster otherwise refuses plain releases.
            start(
                [
                    BIN / "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(_free_port()),
                    "--node-config",
                    f"partition-id={i} num-partitions={K}{crash} allow-plain-release=true "
                    f'secagg-identity="{tmp / "ids" / f"node-{i}.json"}" secagg-roster="{tmp / "ids" / "roster.json"}" '
                    f'secagg-ledger="{tmp / f"ledger-{i}.txt"}"',
                ],
                f"supernode{i}.log",
            )
        yield env, tmp
    finally:
        _stop(procs)
        assert all(p.poll() is not None for p in procs)


def _run(env, tmp, name, **config) -> dict:
    out = tmp / name
    pairs = {
        "clients": K,
        "out": str(out),
        "connect-timeout": 90.0,
        "timeout": 90.0,
        "eps": "inf",
        "alpha": 0.5,
        **config,
    }
    rc = " ".join(f"{k}={json.dumps(v)}" for k, v in pairs.items())
    proc = subprocess.run(
        [BIN / "flwr", "run", str(APP), "local", "--stream", "--run-config", rc],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (out / "report.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    head = np.load(out / "head.npz")
    return {"weight": head["weight"], "report": json.loads((out / "report.json").read_text())}


def test_superlink_and_three_supernodes_give_fits_heads_despite_a_crash(deployment, digits_dataset):
    env, tmp = deployment
    ds = digits_dataset
    F, y, k = partition(ds.train_labels, K, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )
    plain = _run(env, tmp, "fedncm", method="fedncm")
    ref = privfed.fit("fedncm", F, y, k, num_classes=10)
    assert np.abs(plain["weight"] - ref.weight).max() < 1e-9
    assert plain["report"]["replied"] == K and plain["report"]["wire"]["bytes_up_per_node"] > 0

    # Node 2 uploads its masked input, then its process dies at unmasking: the other two
    # (t = 2 of 3) rebuild its self-mask seed, so the sum still covers all three inputs.
    masked = _run(env, tmp, "fed3r-mask", method="fed3r", **{"secure-agg": "mask"}, timeout=60.0)
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
