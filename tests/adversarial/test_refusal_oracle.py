"""A lying server that reads a node's refusals, and asks again: a refusal names the rule, never a value
of the node's data, and it uses the aggregation id up, so the server cannot probe one node again and again.

The scenario is FedCOF's: the server crafts a plausible round-2 broadcast so that a victim's round-2 vector
is large, sets frac-bits to 53, and asks for a masked (or encrypted) upload; the victim refuses (its input
would overflow the ring / exceed the CKKS bound).  A refusal text carrying max |x| (or a count) would let the
server solve for the victim's class mean from a few such refusals.  Also here: a CKKS key holder makes one
key per session id, and a contribution signs the hash of the public context it was encrypted under, so
ciphertexts made under one key are never decrypted under another.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.identity import make_roster
from mechanisms.secagg.ledger import SessionLedger
from mechanisms.secagg.masking.node import MaskingNode
from mechanisms.secagg.masking.server import MaskingServer, run_in_process
from privfed.errors import InputError
from privfed.flower.secagg import encode_for_ring
from privfed.methods.fedcof import FedCOF
from privfed.methods.fedcof_protocol import FedCOFNode, FedCOFServer

K, C, D, F = 5, 3, 4, 53


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?", text))


def _victim_vector():
    """Node 0's round-2 vector under a crafted, plausible broadcast (the server shifts mu_2 by 5), and node 0's
    private counts and means."""
    rng = np.random.default_rng(1)
    counts = rng.integers(5, 30, size=(K, C)).astype(float)
    means = rng.normal(size=(K, C, D))
    nodes = [FedCOFNode(counts[k : k + 1], (counts[k, :, None] * means[k])[None]) for k in range(K)]
    server = FedCOFServer(FedCOF(), C, D)
    honest = server.fold_round1(np.sum([n.round1() for n in nodes], axis=0))
    # counts and K_c as summed (a broadcast isolating a class is refused on its own: test_fedcof_isolation)
    b = {"N": server.N.copy(), "mu": honest["mu"].copy(), "Kc": server.Kc.copy()}
    b["mu"][2, 0] += 5.0
    return nodes[0].round2(b).ravel(), counts[0], means[0]


def _private_numbers(x: np.ndarray, counts: np.ndarray, means: np.ndarray) -> set[str]:
    m = float(np.abs(x).max())
    out = {f"{m:.{p}g}" for p in range(2, 8)} | {f"{m:.{p}e}" for p in range(1, 6)} | {repr(m)}
    out |= {f"{c:g}" for c in counts} | {f"{v:.3g}" for v in means.ravel()}
    return out


# -- (a) a refusal carries no value measured from the node's data --------------------------------------
def test_a_ring_overflow_refusal_names_the_rule_and_no_value_of_the_statistic():
    x, counts, means = _victim_vector()
    assert float(np.abs(x).max()) * 2.0**F >= 2.0**63 / K  # the crafted broadcast does make it overflow
    with pytest.raises(InputError) as exc:
        encode_for_ring(x, F, K)
    text = str(exc.value)  # what the Flower node sends back (client_app's error reply)
    assert "lower frac-bits" in text
    assert not (_numbers(text) & _private_numbers(x, counts, means))
    assert _numbers(text) <= {"2", "64", str(K), str(F)}  # only public parameters: the ring, K, frac-bits


def test_a_ckks_bound_refusal_names_the_rule_and_no_value_of_the_statistic():
    pytest.importorskip("tenseal")
    from test_ckks_in_process import K as CK  # noqa: PLC0415
    from test_ckks_in_process import P, Run

    x, counts, means = _victim_vector()
    big = x * 2.0**P.bound_bits / 3.0  # what the server's broadcast and scale make of it: past the bound
    run = Run()
    with pytest.raises(InputError, match="CKKS bound") as exc:
        run.nodes[1].encrypt(run.encrypt_request(), big, aggregation=os.urandom(16))
    text = str(exc.value)
    assert not (_numbers(text) & _private_numbers(big, counts, means))
    assert _numbers(text) <= {"2", str(P.bound_bits), str(CK)}


# -- (b) a refusal uses the aggregation id up ---------------------------------------------------------------
def _masked_attempt(ids, roster, ledgers, agg, victim_input, *, probe: bool):
    t = roster.threshold
    server = MaskingServer(
        num_nodes=K, threshold=t, length=2, session=os.urandom(16), active=True, frac_bits=F
    )
    nodes = {
        u: MaskingNode(u, num_nodes=K, threshold=t, identity=ids[u], roster=roster, ledger=ledgers[u])
        for u in range(K)
    }
    inputs = lambda u: encode_for_ring(victim_input if u == 1 else np.zeros(2), F, K)  # noqa: E731
    # the probe sends the masked request to the victim only (the others "dropped", so they claim nothing)
    silent = (lambda st, u: st == "masked" and u != 1) if probe else (lambda st, u: False)
    return run_in_process(server, nodes, inputs=inputs, aggregation=agg, silent=silent)


def test_after_a_refused_masked_input_the_same_aggregation_id_is_refused():
    roster, ids = make_roster(K, 3)
    ledgers = [SessionLedger() for _ in range(K)]
    agg = os.urandom(16)
    with pytest.raises(InputError, match="could overflow"):
        _masked_attempt(ids, roster, ledgers, agg, np.array([3.14159, -2.5]) * 1e3, probe=True)
    assert agg.hex() in ledgers[1].used
    with pytest.raises(ProtocolAbort) as exc:  # a second probe, or the honest input, for the same id
        _masked_attempt(ids, roster, ledgers, agg, np.array([3.14159, -2.5]), probe=False)
    assert exc.value.deviation == "second-session" and exc.value.node == 1 and exc.value.stage == "masked"
    # a fresh aggregation id still sums, exactly
    other = os.urandom(16)
    total = _masked_attempt(
        ids, roster, [SessionLedger() for _ in range(K)], other, np.array([1.5, -2.5]), probe=False
    )
    assert np.array_equal(total, encode_for_ring(np.array([1.5, -2.5]), F, K))


def test_after_a_refused_ckks_input_the_same_aggregation_id_is_refused():
    pytest.importorskip("tenseal")
    from test_ckks_in_process import P, Run, X  # noqa: PLC0415

    run = Run()
    agg, asked = os.urandom(16), []
    big = np.full(3, 2.0**P.bound_bits)

    def values():
        asked.append(1)
        return big

    with pytest.raises(InputError, match="CKKS bound"):
        run.nodes[1].encrypt(run.encrypt_request(), values, aggregation=agg)
    assert asked == [1] and agg.hex() in run.ledgers[1].used
    with pytest.raises(ProtocolAbort) as exc:
        run.nodes[1].encrypt(run.encrypt_request(), lambda: asked.append(2) or X[1], aggregation=agg)
    assert exc.value.deviation == "second-session" and asked == [1]  # refused before the input is computed


# -- (c) one key per session; contributions bound to the context they were encrypted under --------------
def test_the_key_holder_refuses_to_make_keys_twice_for_one_session():
    pytest.importorskip("tenseal")
    from test_ckks_in_process import K as CK  # noqa: PLC0415
    from test_ckks_in_process import P, Run

    from mechanisms.secagg.ckks.holder import CKKSKeyHolder  # noqa: PLC0415

    run = Run()
    with pytest.raises(ProtocolAbort) as exc:
        run.holder.keys({"session": run.session, "K": CK})
    assert exc.value.deviation == "second-session" and exc.value.stage == "ckks_keys"
    # the refusal holds across holder objects sharing the node's ledger (a Flower node's context.state)
    again = CKKSKeyHolder(P, identity=run.ids[0], roster=run.roster, ledger=run.ledgers[0])
    with pytest.raises(ProtocolAbort, match="already made keys for this session"):
        again.keys({"session": run.session, "K": CK})
    assert "public" in again.keys({"session": os.urandom(16), "K": CK})  # a fresh session id is fine


def test_contributions_made_under_one_key_are_not_decrypted_under_another():
    pytest.importorskip("tenseal")
    from test_ckks_in_process import K as CK  # noqa: PLC0415
    from test_ckks_in_process import P, Run, X

    from mechanisms.secagg.ckks.holder import CKKSKeyHolder  # noqa: PLC0415

    run = Run()
    under_key_1 = run.contributions()
    # A second key for the same session from a holder that lost its memory (no ledger): the server has it
    # signed, then asks it to decrypt what the nodes encrypted under the first key.
    second = CKKSKeyHolder(P, identity=run.ids[0], roster=run.roster)
    second.keys({"session": run.session, "K": CK})
    with pytest.raises(ProtocolAbort) as exc:
        second.decrypt(run.decrypt_request(under_key_1))
    assert exc.value.deviation == "bad-signature" and exc.value.stage == "ckks_decrypt"
    # the honest path under the first key still decrypts the exact sum
    total = run.holder.decrypt(run.decrypt_request(under_key_1))["total"]
    assert np.abs(total - X.sum(axis=0)).max() <= 2.0**-P.precision_bits


def test_the_refusal_a_flower_node_sends_back_holds_no_measured_value(digits_dataset):
    """End to end: the digits sums at frac-bits 53 overflow the ring; the error the server reads (each
    node's reply) names the rule and the public K and frac-bits, no magnitude of the node's statistic."""
    pytest.importorskip("flwr")
    from privfed.errors import ConfigError  # noqa: PLC0415
    from privfed.flower import FlowerConfig, serve  # noqa: PLC0415
    from privfed.flower.local import LocalGrid  # noqa: PLC0415

    nodes = {100 + i: {"partition-id": i, "num-partitions": 4} for i in range(4)}
    with pytest.raises(
        ConfigError, match="could overflow the 2\\^64 ring with 4 nodes at frac-bits=53"
    ) as exc:
        serve(
            LocalGrid(nodes),
            FlowerConfig(method="fedncm", clients=4, secure="mask", frac_bits=53, timeout=30),
        )
    text = str(exc.value)
    assert "max" not in text and re.search(r"\d\.\d|\de[+-]?\d", text) is None  # no measured (real) number
    assert _numbers(text) <= {"2", "64", "4", "53", "3"} | {str(u) for u in nodes}  # K, f, node ids, count


def test_a_key_session_outlives_the_run_in_the_node_ledger_file(tmp_path):
    """A server that starts a new run (a fresh context.state) to have the key holder make a second key for a
    session: a node that keeps a ledger file refuses, because the session is written there too."""
    from types import SimpleNamespace  # noqa: PLC0415

    from privfed.flower.secagg import node_ledger  # noqa: PLC0415

    path = tmp_path / "ledger.txt"
    session = os.urandom(16)
    first = node_ledger(SimpleNamespace(node_config={"secagg-ledger": str(path)}, state={}))
    assert not first.has_key_session(session)
    first.claim_key_session(session)
    fresh = node_ledger(SimpleNamespace(node_config={"secagg-ledger": str(path)}, state={}))  # another run
    assert fresh.has_key_session(session) and not fresh.has_key_session(os.urandom(16))
    # without a file the ledger lives in the run only (documented): a fresh run starts empty
    assert not node_ledger(SimpleNamespace(node_config={}, state={})).has_key_session(session)
