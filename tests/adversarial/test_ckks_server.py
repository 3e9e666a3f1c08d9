"""A deviating server against CKKS on Flower (key holder a node): a substituted public context, a single node's
ciphertext passed off as the sum, a repeated session.  Run with ``python -m pytest tests/adversarial``."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr")
pytest.importorskip("tenseal")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import TamperingGrid, digits_nodes  # noqa: E402

from mechanisms.secagg.ckks.holder import CKKSKeyHolder  # noqa: E402
from mechanisms.secagg.ckks.node import CKKSNode  # noqa: E402
from mechanisms.secagg.ckks.scheme import CKKSParams  # noqa: E402
from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

K = 4
CFG = dict(method="fedncm", clients=K, secure="ckks", timeout=60)


def _nodes():
    return digits_nodes(K)


def test_a_substituted_ckks_key_is_refused_before_anything_is_encrypted(digits_dataset):
    """The server makes its own keys (it could decrypt every upload) and relays its public context."""
    from mechanisms.secagg.identity import make_roster

    fake_roster, fake_ids = make_roster(
        K, colluders=0
    )  # identities the server controls, not the nodes' roster
    grid_box = {}

    def tamper(msg):
        if msg.metadata.message_type == "query.ckks_encrypt":
            rec = msg.content["ckks"]
            if "server" not in grid_box:
                grid_box["server"] = CKKSKeyHolder(
                    CKKSParams(), identity=fake_ids[0], roster=fake_roster
                ).keys({"session": bytes(rec["session"]), "K": K})
            rec["public"], rec["sig"] = grid_box["server"]["public"], grid_box["server"]["sig"]

    with pytest.raises(ProtocolAbort, match="stage 'ckks_encrypt'.*not signed by key holder") as exc:
        serve(TamperingGrid(_nodes(), tamper), FlowerConfig(**CFG))
    assert exc.value.stage == "ckks_encrypt"


def test_one_nodes_ciphertext_passed_off_as_the_sum_is_not_decrypted(digits_dataset):
    """Forwarding only the victim's contribution (or the victim's twice) to the key holder: refused."""

    def only_victim(msg):
        if msg.metadata.message_type == "query.ckks_decrypt":
            rec = msg.content["ckks"]
            n = len(rec["ct"]) // len(rec["from"])
            rec["from"], rec["sigs"], rec["ct"] = rec["from"][:1], rec["sigs"][:1], rec["ct"][:n]

    with pytest.raises(
        ProtocolAbort, match="stage 'ckks_decrypt'.*sum of 1 contribution.*below the threshold"
    ):
        serve(TamperingGrid(_nodes(), only_victim), FlowerConfig(**CFG))

    def relabelled(msg):  # the victim's ciphertext under the other nodes' names
        if msg.metadata.message_type == "query.ckks_decrypt":
            rec = msg.content["ckks"]
            n = len(rec["ct"]) // len(rec["from"])
            rec["ct"] = rec["ct"][:n] * len(rec["from"])

    with pytest.raises(ProtocolAbort, match="stage 'ckks_decrypt'.*not signed by it"):
        serve(TamperingGrid(_nodes(), relabelled), FlowerConfig(**CFG))


def test_a_second_ckks_session_for_the_same_aggregation_is_refused(digits_dataset):
    grid = LocalGrid(_nodes())
    serve(grid, FlowerConfig(**CFG))
    with pytest.raises(ProtocolAbort, match="stage 'ckks_encrypt'.*second masked session"):
        serve(grid, FlowerConfig(**CFG))


def test_ckks_beyond_the_safe_number_of_nodes_is_refused_before_any_message():
    with pytest.raises(ConfigError, match="CKKS with 257 nodes.*key-dependent"):
        FlowerConfig(method="fedncm", clients=257, secure="ckks")
    FlowerConfig(method="fedncm", clients=256, secure="ckks")


def test_a_split_fedcof_broadcast_is_refused_by_the_ckks_key_holder(digits_dataset):
    import numpy as np

    from privfed.flower.wire import arrays_record

    def split(msg):
        if msg.metadata.message_type == "query.ckks_encrypt" and "broadcast" in msg.content:
            b = msg.content["broadcast"]
            arrays = {k: b[k].numpy() for k in b.keys()}
            if msg.metadata.dst_node_id == 101:  # the victim (not the key holder)
                arrays["mu"] = np.zeros_like(arrays["mu"])
            msg.content["broadcast"] = arrays_record(arrays)

    with pytest.raises(ProtocolAbort, match="stage 'ckks_decrypt'.*split broadcast"):
        serve(TamperingGrid(_nodes(), split), FlowerConfig(**{**CFG, "method": "fedcof"}))


@pytest.mark.parametrize(
    "stage, field, value",
    [
        ("ckks_encrypt", "session", -1),
        ("ckks_encrypt", "holder", "0"),
        ("ckks_decrypt", "size", 2.5),
        ("ckks_keys", "K", float("inf")),
    ],
)
def test_wrongly_typed_ckks_fields_end_in_a_clean_abort(digits_dataset, stage, field, value):
    """A CKKS request with a field of the wrong type is refused as malformed, naming the node and stage
    (before: a raw ValueError or OverflowError from bytes() or int(), or the field silently converted)."""

    def tamper(msg):
        if msg.metadata.message_type == f"query.{stage}":
            msg.content["ckks"][field] = value

    with pytest.raises(ProtocolAbort, match=f"stage '{stage}'.*aborts at stage '{stage}': malformed request"):
        serve(TamperingGrid(_nodes(), tamper), FlowerConfig(**CFG))


def _ckks_sum(grid, cfg, among, holder):
    from flwr.app import ConfigRecord

    from privfed.flower.ckks import ckks_sum_over_messages
    from privfed.flower.protocol import sum_vector_length

    rec = ConfigRecord({**cfg.to_wire(), "run-nonce": os.urandom(8).hex()})
    return ckks_sum_over_messages(
        grid,
        among,
        key_holder=holder,
        length=sum_vector_length(cfg.make_method(), 10, 64),
        params=CKKSParams(),
        timeout=60,
        payload=lambda n: {"config": rec, "round": ConfigRecord({"round": "sums"})},
        round_name="sums",
        num_nodes=K,
    )


def _mask_sum(grid, cfg, among):
    from flwr.app import ConfigRecord

    from privfed.flower.protocol import sum_vector_length
    from privfed.flower.secagg import masked_sum_over_messages

    rec = ConfigRecord({**cfg.to_wire(), "run-nonce": os.urandom(8).hex()})
    return masked_sum_over_messages(
        grid,
        among,
        length=sum_vector_length(cfg.make_method(), 10, 64),
        frac_bits=cfg.frac_bits,
        threshold=None,
        timeout=30,
        masked_payload=lambda n: {"config": rec, "round": ConfigRecord({"round": "sums"})},
        round_name="sums",
        num_nodes=K,
    )


def test_two_ckks_sums_over_different_sets_are_refused_whichever_key_holder(digits_dataset):
    """Differencing under CKKS: the same statistic summed twice in one run under two configs (two aggregation
    ids), the second time without the victim.  Before, both were decrypted and their difference was the
    victim's class counts and sums exactly.  Now a node encrypts for one key holder per run, and that holder
    decrypts sums over one contributor set only."""
    grid = LocalGrid(_nodes())
    nodes = sorted(grid.contexts)
    a = FlowerConfig(**CFG)
    b = FlowerConfig(**{**CFG, "frac_bits": a.frac_bits - 1})
    _ckks_sum(grid, a, nodes, holder=101)
    with pytest.raises(
        ProtocolAbort,
        match="stage 'ckks_decrypt'.*(summed over another uploader set|earlier sum covered \\[0, 1, 2, 3\\])",
    ):
        _ckks_sum(grid, b, nodes[1:], holder=101)  # the same key holder: it keeps the first set
    with pytest.raises(
        ProtocolAbort, match="stage 'ckks_encrypt'.*names key holder 2.*encrypted for key holder 1"
    ):
        _ckks_sum(grid, b, nodes[1:], holder=102)  # another key holder: the nodes refuse to encrypt for it
    assert _ckks_sum(grid, FlowerConfig(**{**CFG, "method": "fed3r"}), nodes, holder=101).uploaded == nodes


def test_a_masked_sum_then_a_ckks_sum_over_fewer_nodes_is_refused_and_ckks_then_masking_too(digits_dataset):
    """Across protocols: a masked sum pins the uploaders, which every node signs into its CKKS contribution, so
    the key holder refuses a CKKS sum over another set; after a CKKS sum (whose set a node cannot see) a node
    takes part in no masked sum."""
    grid = LocalGrid(_nodes())
    nodes = sorted(grid.contexts)
    _mask_sum(grid, FlowerConfig(**{**CFG, "secure": "mask"}), nodes)
    with pytest.raises(
        ProtocolAbort,
        match="stage 'ckks_decrypt'.*node\\(s\\) \\[1, 2, 3\\] were summed over another uploader set",
    ):
        _ckks_sum(grid, FlowerConfig(**CFG), nodes[1:], holder=101)
    grid = LocalGrid(_nodes())
    _ckks_sum(grid, FlowerConfig(**CFG), nodes, holder=101)
    # The key holder knows the CKKS set and refuses another; the other nodes refuse any masked sum after CKKS.
    with pytest.raises(
        ProtocolAbort,
        match="stage 'consistency'.*earlier sum covered \\[0, 1, 2, 3\\].*2 more node\\(s\\) refused too",
    ):
        _mask_sum(grid, FlowerConfig(**{**CFG, "secure": "mask", "method": "fed3r"}), nodes[1:])


def test_ckks_is_refused_when_the_roster_allows_colluders():
    """The server names the key holder; with colluders allowed it names one of them and decrypts every upload.
    Before, a node encrypted under a colluding holder's (validly signed) context."""
    import numpy as np

    from mechanisms.secagg.identity import make_roster

    roster, ids = make_roster(5, colluders=1)
    session = os.urandom(16)
    keys = CKKSKeyHolder(CKKSParams(), identity=ids[4], roster=roster).keys(
        {"session": session, "K": 5}
    )  # node 4: the colluder as key holder
    with pytest.raises(
        ProtocolAbort, match="node 0 aborts at stage 'ckks_encrypt': its roster allows 1 node"
    ) as exc:
        CKKSNode(CKKSParams(), identity=ids[0], roster=roster).encrypt(
            {"public": keys["public"], "K": 5, "holder": 4, "sig": keys["sig"], "session": session},
            np.ones(3),
        )
    assert exc.value.deviation == "colluders"


def test_a_forged_key_holder_does_not_bind_the_node_to_it(digits_dataset):
    """A context the named holder never signed is refused, and leaves the node free to encrypt for the real
    key holder afterwards (a node binds to one holder per run only once its signature checked out)."""

    def tamper(msg):
        if msg.metadata.message_type == "query.ckks_encrypt":
            msg.content["ckks"]["holder"] = 3  # the context is holder 1's, the claim says node 3

    grid = TamperingGrid(_nodes(), tamper)
    with pytest.raises(ProtocolAbort, match="not signed by key holder 3"):
        _ckks_sum(grid, FlowerConfig(**CFG), sorted(grid.contexts), holder=101)
    grid.tamper = lambda msg: None
    assert _ckks_sum(grid, FlowerConfig(**CFG), sorted(grid.contexts), holder=101).uploaded == sorted(
        grid.contexts
    )
