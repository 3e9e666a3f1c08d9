"""Flower node keys bound to roster identities, and the deployed ServerApp that enforces the binding.

Fast: the key files are read with Flower 1.41's own loaders (the SuperNode's and ``flwr supernode
register``'s), the signature is checked over bytes rebuilt here from the documented layout, and the
deployed server runs a real aggregation over the in-process grid with a node whose key is not bound.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

pytest.importorskip("flwr")

from flwr.app import Message, RecordDict  # noqa: E402
from flwr.proto.node_pb2 import NodeInfo  # noqa: E402

import privfed  # noqa: E402
from mechanisms.secagg.crypto import signed_bytes  # noqa: E402
from mechanisms.secagg.identity import Identity, make_roster  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.federation import partition  # noqa: E402
from privfed.flower.deploy import auth  # noqa: E402
from privfed.flower.deploy.server import AuthenticatedGrid, serve_authenticated  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402


@pytest.fixture(scope="module")
def roster():
    return make_roster(3, seed=b"deploy-auth-test")


def _pem(key) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def test_the_signature_covers_label_roster_index_and_key(roster):
    r, ids = roster
    key = auth.make_flower_key()
    b = auth.KeyBinding.sign(ids[1], r, key.public_key())
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # The signed bytes, rebuilt from the layout of mechanisms.secagg.crypto.signed_bytes.
    parts = [r.fingerprint, (1).to_bytes(8, "little", signed=True), der]
    msg = b"privfed secagg v1\x00flower-node-key\x00" + b"".join(
        len(p).to_bytes(8, "little") + p for p in parts
    )
    Ed25519PublicKey.from_public_bytes(r.public_keys[1]).verify(b.signature, msg)  # raises if not
    assert b.index == 1 and b.public_key == der and b.verify(r) is b


def test_every_mismatch_is_refused(roster):
    r, ids = roster
    key, other = auth.make_flower_key(), auth.make_flower_key()
    good = auth.KeyBinding.sign(ids[0], r, key.public_key())
    cases = {
        "another key": (
            auth.KeyBinding(0, good.roster, auth.spki_der(other.public_key()), good.signature),
            "does not verify",
        ),
        "another index": (
            auth.KeyBinding(1, good.roster, good.public_key, good.signature),
            "does not verify",
        ),
        "index outside": (auth.KeyBinding(3, good.roster, good.public_key, good.signature), "nodes 0..2"),
        "another roster": (auth.KeyBinding.sign(*_other_identity(), key.public_key()), "another roster"),
    }
    for name, (binding, match) in cases.items():
        with pytest.raises(ConfigError, match=match):
            binding.verify(r, name)
    # node 1 signing a key "for node 0" with its own key: the index is 0, node 0's key does not verify it
    forged = auth.KeyBinding(
        0,
        r.fingerprint,
        good.public_key,
        ids[1].sign(signed_bytes("flower-node-key", r.fingerprint, 0, good.public_key)),
    )
    with pytest.raises(ConfigError, match="not signed by that node"):
        forged.verify(r)
    # an identity that is not the roster's cannot sign at all
    with pytest.raises(ConfigError, match="not in the roster"):
        auth.KeyBinding.sign(Identity(0, b"\x01" * 32), r, key.public_key())


def _other_identity():
    r2, ids2 = make_roster(3, seed=b"another roster")
    return ids2[0], r2


def test_only_nist_ec_keys_are_accepted():
    with pytest.raises(ConfigError, match="P-256, P-384 or P-521"):
        auth.spki_der(ec.generate_private_key(ec.SECP256K1()).public_key())
    for small in (ec.SECP192R1, ec.SECP224R1):  # NIST curves OpenSSH (flwr supernode register) cannot read
        with pytest.raises(ConfigError, match="P-256, P-384 or P-521"):
            auth.spki_der(ec.generate_private_key(small()).public_key())
    with pytest.raises(ConfigError, match="P-256, P-384 or P-521"):
        auth.spki_der(
            Ed25519PrivateKey.generate()
            .public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    with pytest.raises(ConfigError, match="not a PEM, OpenSSH or DER"):
        auth.spki_der(b"ecdsa-sha2-nistp384 garbage")


def test_one_key_per_node_and_one_node_per_key(roster):
    r, ids = roster
    k0, k1 = auth.make_flower_key(), auth.make_flower_key()
    b0 = auth.KeyBinding.sign(ids[0], r, k0.public_key())
    with pytest.raises(ConfigError, match="both bind a Flower key to roster node 0"):
        auth.verify_bindings(r, [("a", b0), ("b", auth.KeyBinding.sign(ids[0], r, k1.public_key()))])
    with pytest.raises(ConfigError, match="same Flower key to two roster nodes"):
        auth.verify_bindings(r, [("a", b0), ("b", auth.KeyBinding.sign(ids[1], r, k0.public_key()))])
    with pytest.raises(ConfigError, match="no binding given"):
        auth.verify_bindings(r, [])


def test_files_load_with_flowers_own_loaders_and_map_back_to_the_roster(roster, tmp_path):
    from flwr.cli.supernode.register import try_load_public_key

    r, ids = roster
    written = {i: auth.write_node_key(tmp_path / f"n{i}", ids[i], r) for i in range(3)}
    assert stat.S_IMODE(written[0][auth.KEY_FILE].stat().st_mode) == 0o600
    keys = auth.NodeKeys(r, tuple(auth.KeyBinding.load(w[auth.BINDING_FILE]) for w in written.values()))
    for i, w in written.items():
        # what the SuperNode loads for --auth-supernode-private-key (flower_supernode._try_setup_client_authentication)
        sk = serialization.load_ssh_private_key(w[auth.KEY_FILE].read_bytes(), None)
        assert isinstance(sk, ec.EllipticCurvePrivateKey)
        # what `flwr supernode register` sends, i.e. what the SuperLink stores and get_nodes() reports
        registered = try_load_public_key(w[auth.PUB_FILE])
        assert registered == _pem(sk.public_key())
        assert keys.index_of(registered) == i
    assert keys.index_of(_pem(auth.make_flower_key().public_key())) is None
    assert keys.index_of(b"not a key") is None
    with pytest.raises(ConfigError, match="already exists"):
        auth.write_node_key(tmp_path / "n0", ids[0], r)


def test_the_operator_command_writes_what_flwr_registers_and_refuses_a_forgery(roster, tmp_path, capsys):
    r, ids = roster
    (tmp_path / "roster.json").write_text(r.to_json())
    for i in range(3):
        (tmp_path / f"node-{i}.json").write_text(ids[i].to_json())

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "privfed.flower.deploy.auth", *map(str, args)],
            capture_output=True,
            text=True,
        )

    for i in range(3):  # in this process (the last command below runs as `python -m`)
        argv = ["node-key", tmp_path / f"k{i}", "--identity", tmp_path / f"node-{i}.json"]
        assert auth.main([str(a) for a in [*argv, "--roster", tmp_path / "roster.json"]]) == 0
    bindings = [tmp_path / f"k{i}" / auth.BINDING_FILE for i in range(3)]
    argv = ["verify", *bindings, "--roster", tmp_path / "roster.json", "--out", tmp_path / "reg"]
    assert auth.main([str(a) for a in argv]) == 0
    assert "nodes 0, 1, 2" in capsys.readouterr().out
    keys = auth.NodeKeys.load(tmp_path / "reg" / auth.LIST_FILE)
    assert keys.roster == r and [b.index for b in keys.bindings] == [0, 1, 2]
    for i in range(3):
        assert (tmp_path / "reg" / f"node-{i}.pub").read_text() == (
            tmp_path / f"k{i}" / auth.PUB_FILE
        ).read_text()

    # A binding whose key was swapped for another (e.g. by whoever carried the file) is refused: exit 2, one line.
    raw = json.loads(bindings[2].read_text())
    raw["flower_public_key"] = _pem(auth.make_flower_key().public_key()).decode()
    bindings[2].write_text(json.dumps(raw))
    res = cli("verify", *bindings, "--roster", tmp_path / "roster.json", "--out", tmp_path / "reg2")
    assert (
        res.returncode == 2
        and "does not verify under roster node 2" in res.stderr
        and "Traceback" not in res.stderr
    )
    assert not (tmp_path / "reg2" / auth.LIST_FILE).exists()


@pytest.mark.parametrize("content", ["", "{}", '{"version": 1, "roster": {}, "bindings": []}', "[1]"])
def test_a_broken_node_key_list_is_refused(tmp_path, content):
    p = tmp_path / "node-keys.json"
    p.write_text(content)
    with pytest.raises(ConfigError, match="node-keys"):
        auth.NodeKeys.load(p)
    with pytest.raises(ConfigError, match="no such file"):
        auth.NodeKeys.load(tmp_path / "missing.json")


# ------------------------------------------------------------------ the deployed ServerApp
class _KeyedGrid(LocalGrid):
    """The in-process grid, reporting each node's Flower public key as the SuperLink's get_nodes() does."""

    def __init__(self, node_configs, flower_keys):
        super().__init__(node_configs)
        self.flower_keys = flower_keys
        self.delivered: set[int] = set()

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=_pem(self.flower_keys[n].public_key())) for n in self.contexts]

    def push_messages(self, messages):
        messages = list(messages)
        self.delivered.update(int(m.metadata.dst_node_id) for m in messages)
        return super().push_messages(messages)


@pytest.fixture(scope="module")
def deployed(roster, tmp_path_factory):
    """Three bound nodes (ids 11-13) and an intruder (id 5, a registered but unbound key) that sorts first."""
    r, ids = roster
    fk = {n: auth.make_flower_key() for n in (5, 11, 12, 13)}
    bindings = tuple(auth.KeyBinding.sign(ids[i], r, fk[n].public_key()) for i, n in enumerate((11, 12, 13)))
    path = tmp_path_factory.mktemp("keys") / "node-keys.json"
    path.write_text(auth.NodeKeys(r, bindings).to_json())
    configs = {n: {"partition-id": i, "num-partitions": 3} for i, n in enumerate((11, 12, 13))}
    configs[5] = {"partition-id": 0, "num-partitions": 3}  # the intruder: a copy of node 11's data
    return fk, configs, path


def test_the_deployed_server_never_messages_an_unbound_node(deployed, digits_dataset):
    fk, configs, path = deployed
    grid = _KeyedGrid(configs, fk)
    res = serve_authenticated(
        grid, {"method": "fedncm", "clients": 3, "timeout": 30.0, "node-keys": str(path)}
    )
    ds = digits_dataset
    F, y, k = partition(ds.train_labels, 3, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )
    ref = privfed.fit("fedncm", F, y, k, num_classes=10)
    assert np.abs(res.head.weight - ref.weight).max() < 1e-9
    assert grid.delivered == {11, 12, 13}
    na = res.report["node_authentication"]
    assert na["nodes"] == {"11": 0, "12": 1, "13": 2} and set(na["refused"]) == {"5"}
    assert na["roster"] == deployed_roster_fingerprint(path)


def deployed_roster_fingerprint(path) -> str:
    return auth.NodeKeys.load(path).roster.fingerprint.hex()


def test_the_plain_server_would_have_taken_the_intruder(deployed, digits_dataset):
    # What the binding prevents: without it the server picks the first three node ids, intruder included.
    from privfed.flower.config import FlowerConfig
    from privfed.flower.server_app import serve

    fk, configs, _ = deployed
    grid = _KeyedGrid(configs, fk)
    # the intruder claims a bound node's partition: the plain server sends it the run and takes its reply,
    # and only the duplicate partition-id check stops the sum from counting that partition twice
    with pytest.raises(ConfigError, match="nodes 5, 11 all hold partition-id=0"):
        serve(grid, FlowerConfig(method="fedncm", clients=3, timeout=30.0))
    assert 5 in grid.delivered


def test_the_deployed_server_fails_closed(deployed, tmp_path):
    fk, configs, path = deployed
    grid = _KeyedGrid(configs, fk)
    for rc in ({"clients": 3}, {"clients": 3, "node-keys": "none"}):
        with pytest.raises(ConfigError, match="node-keys is not set"):
            serve_authenticated(grid, rc)
    with pytest.raises(ConfigError, match="binds only 3 node key"):
        serve_authenticated(grid, {"clients": 4, "node-keys": str(path)})
    with pytest.raises(ConfigError, match="no such file"):
        serve_authenticated(grid, {"clients": 3, "node-keys": str(tmp_path / "nope.json")})
    with pytest.raises(ConfigError, match="does not report the nodes' public keys"):
        serve_authenticated(LocalGrid(configs), {"clients": 3, "node-keys": str(path)})
    assert grid.delivered == set()


def test_the_authenticated_grid_refuses_to_send_to_an_unbound_node(deployed):
    fk, configs, path = deployed
    grid = AuthenticatedGrid(_KeyedGrid(configs, fk), auth.NodeKeys.load(path))
    assert sorted(grid.get_node_ids()) == [11, 12, 13]
    with pytest.raises(ConfigError, match=r"node\(s\) \[5\]"):
        grid.push_messages([Message(RecordDict(), dst_node_id=5, message_type="query")])
    with pytest.raises(ConfigError, match=r"node\(s\) \[5\]"):
        grid.send_and_receive([Message(RecordDict(), dst_node_id=5, message_type="query")])


def test_a_deployed_masked_run_asks_the_threshold_and_graph_its_roster_fixes():
    """The nodes hold the roster and refuse any other t or graph: a run config that leaves them unset asks
    the roster's (t = 2 of 3 declared with no colluder; a SecAgg+ roster's degree), one that sets them keeps
    its own (for the nodes to refuse), and an unmasked run is left as it is."""
    from mechanisms.secagg.identity import make_roster
    from privfed.flower.config import FlowerConfig
    from privfed.flower.deploy.server import config_from_roster

    roster, _ = make_roster(3, 2, 0)
    masked = FlowerConfig(method="fed3r", clients=3, secure="mask")
    assert masked.secagg_threshold == 3  # the default alone would ask more than this roster's nodes hold
    assert config_from_roster(masked, roster).secagg_threshold == 2
    assert (
        config_from_roster(
            FlowerConfig(method="fed3r", clients=3, secure="mask", threshold=3), roster
        ).threshold
        == 3
    )
    plain = FlowerConfig(method="fed3r", clients=3)
    assert config_from_roster(plain, roster) is plain
    ring, _ = make_roster(12, degree=4)
    got = config_from_roster(FlowerConfig(method="fed3r", clients=12, secure="mask"), ring)
    assert got.degree == 4 and got.secagg_threshold == ring.threshold
