"""The operator's deployment files: what the roster, certificate, key-binding and budget commands write, refuse
and never overwrite.

Each test is a mistake an operator makes while setting up a federation (running a step twice, a folder that
holds something else, a key of the wrong kind) and what the command must do instead of losing a node's identity,
leaving a secret readable by others or ending in a traceback.
"""

from __future__ import annotations

import datetime
import os
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

pytest.importorskip("flwr")

from mechanisms.secagg import identity  # noqa: E402
from mechanisms.secagg.identity import Identity, Roster  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.flower import budget  # noqa: E402
from privfed.flower.deploy import auth, certs  # noqa: E402


def _roster(tmp_path, capsys, nodes: int = 3):
    assert identity.main([str(tmp_path / "ids"), "--nodes", str(nodes)]) == 0
    capsys.readouterr()
    return tmp_path / "ids"


def test_the_roster_command_never_replaces_a_roster_and_writes_identities_private(tmp_path, capsys):
    """Run twice, it wrote a new roster over the old one: every node's identity, binding and ledger voided."""
    ids = _roster(tmp_path, capsys)
    before = {p.name: p.read_bytes() for p in ids.iterdir()}
    assert {n: stat.S_IMODE((ids / n).stat().st_mode) for n in before} == {
        "roster.json": 0o644,
        "node-0.json": 0o600,
        "node-1.json": 0o600,
        "node-2.json": 0o600,
    }
    assert identity.main([str(ids), "--nodes", "3"]) == 2
    assert "already holds a roster's files" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in ids.iterdir()} == before


def test_an_identity_is_never_written_through_a_link_or_into_an_open_file(tmp_path, capsys):
    """A link or a 0644 file at node-0.json received a private key (the mode applied to new files only)."""
    shared = tmp_path / "shared.txt"
    shared.write_text("x")
    ids = tmp_path / "ids"
    ids.mkdir()
    (ids / "node-0.json").symlink_to(shared)
    assert identity.main([str(ids), "--nodes", "3"]) == 2
    assert "already holds a roster's files (node-0.json;" in capsys.readouterr().err
    assert shared.read_text() == "x" and sorted(p.name for p in ids.iterdir()) == ["node-0.json"]


def test_a_roster_that_cannot_be_written_whole_leaves_nothing(tmp_path, capsys, monkeypatch):
    """A failure part-way left a new roster beside the old identities (a mixed set) and a traceback."""
    from mechanisms.secagg import roster_files

    real_open, calls = os.open, []

    def full_disk_on_the_third(path, flags, mode=0o777):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(roster_files.os, "open", full_disk_on_the_third)
    assert identity.main([str(tmp_path / "ids"), "--nodes", "3"]) == 2
    assert "cannot write the roster into" in capsys.readouterr().err
    assert list((tmp_path / "ids").iterdir()) == []
    (tmp_path / "afile").write_text("")
    assert identity.main([str(tmp_path / "afile"), "--nodes", "3"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,words",
    [
        (["", "--nodes", "3"], "DIR is empty"),
        (["r", "--nodes", "-3"], "a whole number of nodes >= 1, got -3"),
        (["r", "--nodes", "3", "--threshold", "9"], "lower the threshold"),
        (["r", "--nodes", "3", "--init-ledger", "l.json", "--roster", "x"], "--init-ledger runs on a node"),
    ],
)
def test_the_roster_commands_mistakes_are_one_line_with_the_right_fix(
    tmp_path, capsys, monkeypatch, argv, words
):
    monkeypatch.chdir(tmp_path)
    assert identity.main(argv) == 2
    assert words in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_verify_refuses_a_curve_openssh_cannot_read_and_writes_nothing_before_every_binding_passed(
    tmp_path, capsys
):
    """A P-192 key passed every check, then the OpenSSH rendering failed after node-0.pub was written."""
    ids = _roster(tmp_path, capsys)
    roster, ident = Roster.load(ids / "roster.json"), Identity.load(ids / "node-1.json")
    small = ec.generate_private_key(ec.SECP192R1()).public_key()
    with pytest.raises(ConfigError, match=r"not an EC key on P-256, P-384 or P-521"):
        auth.KeyBinding.sign(ident, roster, small)
    auth.write_node_key(tmp_path / "k0", Identity.load(ids / "node-0.json"), roster)
    (tmp_path / "bad.json").write_text("{}")
    assert auth.main(["verify", str(tmp_path / "k0" / auth.BINDING_FILE), str(tmp_path / "bad.json"),
                      "--roster", str(ids / "roster.json"), "--out", str(tmp_path / "reg")]) == 2  # fmt: skip
    assert not (tmp_path / "reg").exists()


def test_verify_into_a_folder_of_an_earlier_list_refuses_to_drop_its_nodes(tmp_path, capsys):
    """The new list dropped node 0 without a word and left node-0.pub, which the documented loop registered; a
    list that leaves out a node of the one in --out (or is for another roster) is refused, and nothing deleted."""
    ids = _roster(tmp_path, capsys)
    roster = Roster.load(ids / "roster.json")
    for i in (0, 1):
        auth.write_node_key(tmp_path / f"k{i}", Identity.load(ids / f"node-{i}.json"), roster)
    out = tmp_path / "reg"
    out.mkdir()
    (out / "node-admin.pub").write_text("the operator's own")
    both = [str(tmp_path / f"k{i}" / auth.BINDING_FILE) for i in (0, 1)]
    assert auth.main(["verify", *both, "--roster", str(ids / "roster.json"), "--out", str(out)]) == 0
    listed = (out / auth.LIST_FILE).read_bytes()
    assert auth.main(["verify", both[1], "--roster", str(ids / "roster.json"), "--out", str(out)]) == 2
    assert (
        "holds the list of roster nodes [0, 1], and this one leaves out node(s) [0]"
        in capsys.readouterr().err
    )
    assert (out / auth.LIST_FILE).read_bytes() == listed
    assert sorted(p.name for p in out.iterdir()) == [
        "node-0.pub",
        "node-1.pub",
        "node-admin.pub",
        "node-keys.json",
    ]
    assert auth.main(["verify", *both, "--roster", str(ids / "roster.json"), "--out", str(out)]) == 0  # again


def test_verify_refuses_a_fifo_and_empty_folders_at_once(tmp_path, capsys):
    ids = _roster(tmp_path, capsys)
    os.mkfifo(tmp_path / "b.json")
    assert (
        auth.main(["verify", str(tmp_path / "b.json"), "--roster", str(ids / "roster.json"), "--out", "r"])
        == 2
    )
    assert "is a FIFO" in capsys.readouterr().err  # never opened for reading (it would wait for a writer)
    assert (
        auth.main(["verify", str(tmp_path / "b.json"), "--roster", str(ids / "roster.json"), "--out", ""])
        == 2
    )
    assert "--out is empty" in capsys.readouterr().err


def _ca(folder, *, ca: bool = True, expired: bool = False) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a CA")])
    now = datetime.datetime.now(datetime.UTC)
    end = now - datetime.timedelta(days=1) if expired else now + datetime.timedelta(days=30)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=30))
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir()
    (folder / certs.CA_CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (folder / certs.CA_KEY).write_bytes(pem)


@pytest.mark.parametrize(
    "kind,words",
    [
        ("no CA", "is not a CA certificate"),
        ("expired", "expired on"),
        ("encrypted", "is encrypted: move it to ca.key.enc"),
    ],
)
def test_renewing_from_a_ca_that_cannot_issue_is_one_line(tmp_path, kind, words):
    """A leaf certificate renewed silently (no node would accept what it signed); an expired CA or an encrypted
    key ended in a traceback."""
    _ca(tmp_path / "c", ca=kind != "no CA", expired=kind == "expired")
    if kind == "encrypted":
        key = serialization.load_pem_private_key((tmp_path / "c" / certs.CA_KEY).read_bytes(), None)
        locked = serialization.BestAvailableEncryption(b"secret")
        (tmp_path / "c" / certs.CA_KEY).write_bytes(
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, locked)
        )
    with pytest.raises(ConfigError, match=words):
        certs.write_certificates(tmp_path / "c", ["a.org"], renew=True)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [certs.CA_CERT, certs.CA_KEY]


def test_a_private_key_is_never_written_through_a_link_at_its_temporary_name(tmp_path):
    """The temporary name was predictable: a link left there received the CA's private key, readable by others.
    Temporary files now have random names and are created new; a stopped run's half-made CA is named."""
    out = tmp_path / "c"
    out.mkdir()
    bait = tmp_path / "bait"
    bait.write_text("")
    (out / f".{certs.CA_KEY}.{os.getpid()}.privfed-tmp").symlink_to(bait)
    certs.write_certificates(out, ["a.org"])
    assert bait.read_text() == "" and not (out / certs.CA_KEY).is_symlink()
    assert stat.S_IMODE((out / certs.CA_KEY).stat().st_mode) == 0o600
    assert stat.S_IMODE((out / certs.CA_CERT).stat().st_mode) == 0o644
    (
        out / certs.CA_CERT
    ).unlink()  # as a run stopped between writing the CA's key and its certificate leaves it
    with pytest.raises(ConfigError, match=r"has no ca.crt beside it: a run that made this CA was stopped"):
        certs.write_certificates(out, ["a.org"], renew=True)


def test_a_new_ca_that_cannot_be_written_whole_leaves_nothing(tmp_path, monkeypatch):
    real, calls = certs.write_file, []

    def fail_on_the_second(path, data, *, private):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(path, data, private=private)

    monkeypatch.setattr(certs, "write_file", fail_on_the_second)
    with pytest.raises(OSError):
        certs.write_certificates(tmp_path / "c", ["a.org"])
    assert [p.name for p in (tmp_path / "c").iterdir()] == []


def test_budget_commands_name_the_folder_and_the_budget(tmp_path, capsys):
    """init in a missing folder said to restore the ledger from a backup with the secure-aggregation command;
    show --epsilon inf was refused as 'finite here' after the advice to use inf."""
    assert budget.main(["init", str(tmp_path / "nodir" / "b.json")]) == 2
    err = capsys.readouterr().err
    assert "does not exist; create it first" in err and "--init-ledger" not in err
    assert budget.main(["init", ""]) == 2
    assert "FILE is empty" in capsys.readouterr().err
    assert budget.main(["init", str(tmp_path / "b.json")]) == 0
    assert budget.main(["show", str(tmp_path / "b.json"), "--epsilon", "inf", "--delta", "1e-5"]) == 2
    assert "--epsilon is the node's lifetime budget: a finite number > 0, got inf" in capsys.readouterr().err
