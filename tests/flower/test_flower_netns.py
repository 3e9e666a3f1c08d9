"""The deployment as separate hosts: the SuperLink, three SuperNodes, the operator and an outsider,
each in its own network namespace with its own address on a bridge the test makes.

Every command is the documented one (docs/flower.md): TLS with the operator's CA, SuperNode
authentication with Flower keys the nodes signed with their roster identities, the operator's
verified list given to the deployed ServerApp, runs submitted with ``flwr run`` from the operator's
host.  The outsider's host shows what is refused: a SuperNode whose key is not registered, and any
client (``flwr`` or a SuperNode) without the operator's CA; and what the binding catches: Flower
1.41's open-source Control API lets the outsider register a key of its own, and its node comes
online, but the deployed ServerApp never sends it a message.

The namespaces, the bridge and every process are removed at the end, also when a test fails.  Where
namespaces cannot be made (not root, no ``ip``), the module is skipped with the reason;
tests/flower/test_flower_deploy.py runs the same deployment on loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization

pytest.importorskip("flwr")

from flower_deployment import (  # noqa: E402
    BIN,
    LINK,
    Processes,
    env_for,
    flwr,
    flwr_home,
    in_netns,
    last_json,
    operator_material,
    register,
    run_app,
    superlink_args,
    supernode_args,
    wait_online,
)

import privfed  # noqa: E402
from privfed.federation import partition  # noqa: E402
from privfed.flower.deploy.auth import make_flower_key  # noqa: E402

K = 3
SUBNET = "10.213.7"  # the hosts' private network: reachable only from the namespaces on the bridge
HOSTS = {"link": 1, "op": 2, "n0": 11, "n1": 12, "n2": 13, "x": 66}
PORT = 9093
SUPERLINK = f"{SUBNET}.{HOSTS['link']}"
pytestmark = [
    pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="Flower's executables absent"),
    # Minutes: Flower's start-up on six hosts and a masked run whose every stage spawns a ClientApp
    # process per node.  The loopback deployment (test_flower_deploy.py, also slow) and the deployed
    # ServerApp's checks over the in-process grid (test_deploy_auth.py, default suite) cover the code.
    pytest.mark.slow,
]


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {res.stderr.strip()}")


class Network:
    """One namespace per host, each with a veth into a bridge that lives in a namespace of its own."""

    def __init__(self) -> None:
        self.prefix = f"pf{os.getpid() % 100000}"
        self.made: list[str] = []

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def create(self) -> None:
        sw = self.ns("sw")
        _ip("netns", "add", sw)
        self.made.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i, (host, octet) in enumerate(HOSTS.items()):
            ns = self.ns(host)
            _ip("netns", "add", ns)
            self.made.append(ns)
            # The pair is made inside the namespaces: nothing is added to the test runner's own network.
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"port{i}", "netns", sw)
            _ip("-n", sw, "link", "set", f"port{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{octet}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def teardown(self) -> None:
        for ns in reversed(self.made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:  # anything still running in a host this test made
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip(
            "network namespaces cannot be made here (needs root and iproute2's ip); "
            "tests/flower/test_flower_deploy.py runs the same deployment on loopback"
        )
    net = Network()
    try:
        net.create()
    except OSError as exc:
        net.teardown()
        pytest.skip(
            f"network namespaces cannot be made here ({exc}); tests/flower/test_flower_deploy.py runs the "
            "same deployment on loopback"
        )
    tmp = tmp_path_factory.mktemp("flower-netns")
    m = operator_material(tmp, [SUPERLINK], K)
    address = f"{SUPERLINK}:{PORT}"
    env = {h: env_for(flwr_home(tmp / f"home-{h}", address, m.ca)) for h in HOSTS}
    env["x-no-ca"] = env_for(flwr_home(tmp / "home-x-no-ca", address, None))
    procs = Processes(tmp)
    t0 = time.monotonic()
    try:
        link = procs.start(superlink_args(m, "0.0.0.0", PORT), "superlink.log", env["link"], net.ns("link"))
        procs.wait_log("superlink.log", r"Uvicorn running on https://0\.0\.0\.0", 120, link)
        node_ids = {register(env["op"], m.registered / f"node-{i}.pub", net.ns("op")) for i in range(K)}
        for i in range(K):
            h = f"n{i}"
            args = supernode_args(address, m.keys[i] / "flower-key", m.ca, 9094, m.node_config(i))
            procs.start(args, f"supernode-{h}.log", env[h], net.ns(h))
        wait_online(env["op"], node_ids, 180, net.ns("op"))
        yield {"net": net, "m": m, "env": env, "procs": procs, "tmp": tmp, "node_ids": node_ids, "t0": t0}
    finally:
        procs.stop()
        net.teardown()
        assert all(p.poll() is not None for p in procs.procs)


def _outsider_key(path) -> tuple:
    """A Flower key no roster identity signed (what someone outside the federation holds)."""
    key = make_flower_key()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    pub = path.with_suffix(".pub")
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return path, pub


def _supernode_once(h, args, log: str, timeout: float = 120) -> tuple[int, str]:
    """Run a SuperNode on the outsider's host until it gives up: its exit code and its log.

    Output goes to a file, not a pipe: the SuperExec it spawned may hold a pipe open after it exits.
    """
    p = h["procs"].start(args, log, h["env"]["x"], h["net"].ns("x"))
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None  # still retrying: the caller's assertion shows the log
    return rc, h["procs"].log(log)


def test_the_hosts_are_separate(hosts):
    # The SuperLink listens on its own host's address; the outsider's loopback is another machine's.
    probe = (
        "import socket,sys; s=socket.socket(); s.settimeout(3); sys.exit(s.connect_ex((sys.argv[1], 9093)))"
    )
    x = hosts["net"].ns("x")
    run = lambda addr: subprocess.run(in_netns(x, ["python3", "-c", probe, addr]), timeout=30).returncode  # noqa: E731
    assert run(SUPERLINK) == 0 and run("127.0.0.1") != 0


def test_a_node_whose_key_is_not_registered_is_refused(hosts):
    key, _ = _outsider_key(hosts["tmp"] / "unregistered")
    rc, log = _supernode_once(
        hosts, supernode_args(f"{SUPERLINK}:{PORT}", key, hosts["m"].ca, 9094), "unregistered.log"
    )
    assert rc not in (0, None) and "Failed to activate SuperNode" in log, log[-3000:]
    assert "No SuperNode found with the given public key" in hosts["procs"].log("superlink.log")


def test_a_client_without_the_ca_cannot_connect(hosts):
    env, x = hosts["env"], hosts["net"].ns("x")
    with_ca = flwr(env["x"], "supernode", "ls", LINK, "--format", "json", netns=x)
    assert with_ca.returncode == 0 and last_json(with_ca.stdout)["success"], with_ca.stdout[-2000:]
    without = flwr(env["x-no-ca"], "supernode", "ls", LINK, "--format", "json", netns=x)
    assert not last_json(without.stdout)["success"], without.stdout[-2000:]
    # A SuperNode with a registered key, but trusting only the system's CAs: the TLS handshake fails.
    key, pub = _outsider_key(hosts["tmp"] / "no-ca")
    register(env["x"], pub, x)
    rc, log = _supernode_once(hosts, supernode_args(f"{SUPERLINK}:{PORT}", key, None, 9094), "no-ca.log")
    assert rc not in (0, None) and "CERTIFICATE_VERIFY_FAILED" in log, log[-3000:]


def test_an_authenticated_tls_run_gives_fits_head_and_never_uses_an_unbound_node(hosts, digits_dataset):
    env, m, net = hosts["env"], hosts["m"], hosts["net"]
    # Flower's open-source Control API has no account authentication: the outsider registers a key of its
    # own and its node comes online.  Only the binding keeps it out of the run.
    key, pub = _outsider_key(hosts["tmp"] / "self-registered")
    intruder = register(env["x"], pub, net.ns("x"))
    args = supernode_args(f"{SUPERLINK}:{PORT}", key, m.ca, 9094, "partition-id=0 num-partitions=3")
    hosts["procs"].start(args, "supernode-x.log", env["x"], net.ns("x"))
    wait_online(env["op"], {*hosts["node_ids"], intruder}, 120, net.ns("op"))

    t0 = time.monotonic()
    out = m.root / "fed3r-mask"
    run = run_app(
        env["op"],
        out,
        net.ns("op"),
        method="fed3r",
        clients=K,
        timeout=120.0,
        eps="inf",
        alpha=0.5,
        **{"secure-agg": "mask", "connect-timeout": 60.0, "node-keys": str(m.node_keys)},
    )
    seconds = time.monotonic() - t0
    ds = digits_dataset
    F, y, k = partition(ds.train_labels, K, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )
    ref = privfed.fit("fed3r", F, y, k, num_classes=10)
    assert np.abs(run["weight"] - ref.weight).max() < 1e3 * K * 2.0**-33
    na = run["report"]["node_authentication"]
    assert {int(n) for n in na["nodes"]} == hosts["node_ids"] and sorted(na["nodes"].values()) == [0, 1, 2]
    assert str(intruder) in na["refused"]
    assert run["report"]["secure_aggregation"]["summed_nodes"] == K
    print(
        f"masked fed3r across namespaces: {seconds:.1f} s; set-up to here {time.monotonic() - hosts['t0']:.1f} s"
    )
