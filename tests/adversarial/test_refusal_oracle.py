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
    roster, ids = make_roster(K, 3, colluders=0)  # t = 3 of 5 tolerates no colluder: declared explicitly
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
    from mechanisms.secagg.bounds import PublicBounds  # noqa: PLC0415
    from privfed.errors import ConfigError  # noqa: PLC0415
    from privfed.flower import FlowerConfig, serve  # noqa: PLC0415
    from privfed.flower.local import LocalGrid  # noqa: PLC0415
    from privfed.flower.secagg import simulated_identities  # noqa: PLC0415

    # frac-bits=53 is the operator's (the roster's): a server cannot dial it
    nodes = simulated_identities(
        {100 + i: {"partition-id": i, "num-partitions": 4} for i in range(4)},
        bounds=PublicBounds(frac_bits=53),
    )
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

    from mechanisms.secagg.ledger import init_ledger_file  # noqa: PLC0415
    from privfed.flower.secagg import node_ledger  # noqa: PLC0415

    roster, _ = make_roster(K)
    path = tmp_path / "ledger.json"
    init_ledger_file(path, roster.fingerprint)  # the operator's step, once per node
    session = os.urandom(16)
    first = node_ledger(SimpleNamespace(node_config={"secagg-ledger": str(path)}, state={}), roster)
    assert not first.has_key_session(session)
    first.claim_key_session(session)
    fresh = node_ledger(
        SimpleNamespace(node_config={"secagg-ledger": str(path)}, state={}), roster
    )  # a new run
    assert fresh.has_key_session(session) and not fresh.has_key_session(os.urandom(16))
    # without a file the ledger lives in the run only (documented): a fresh run starts empty
    assert not node_ledger(SimpleNamespace(node_config={}, state={}), roster).has_key_session(session)


# -- (d) the oracle across aggregation ids: a repeatable question reads nothing ----------------------------
class _VictimOnly:
    """A LocalGrid whose server sends the masked stage to the victim only (the others are silent there)."""

    def __init__(self, grid, victim: int) -> None:
        self.grid, self.victim = grid, victim

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def push_messages(self, messages):
        keep = [
            m
            for m in messages
            if not (m.metadata.message_type == "query.masked" and m.metadata.dst_node_id != self.victim)
        ]
        return self.grid.push_messages(keep) + [""] * (len(messages) - len(keep))


class _Oracle:
    """The issue's oracle: one masked FedCOF round-2 session per probe, under a fresh aggregation id (a run
    config that differs only in delta, which changes nothing without DP), with a crafted broadcast that only
    the victim receives; whether the victim uploads or refuses is the answer."""

    def __init__(self, grid, nodes, victim, C, d) -> None:
        self.grid, self.nodes, self.victim, self.C, self.d = _VictimOnly(grid, victim), nodes, victim, C, d
        self.answers: list[bool] = []

    def ask(self, broadcast: dict, frac_bits: int) -> bool:
        from flwr.app import ConfigRecord  # noqa: PLC0415

        from privfed.flower import FlowerConfig  # noqa: PLC0415
        from privfed.flower.secagg import masked_sum_over_messages  # noqa: PLC0415
        from privfed.flower.wire import arrays_record  # noqa: PLC0415
        from privfed.methods.fedcof_protocol import round_lengths  # noqa: PLC0415

        i = len(self.answers)
        cfg = FlowerConfig(
            method="fedcof",
            clients=len(self.nodes),
            secure="mask",
            frac_bits=frac_bits,
            delta=1e-5 * (1 + i * 1e-6),
        )
        rec = ConfigRecord({**cfg.to_wire(), "run-nonce": os.urandom(8).hex()})
        payload = {
            "config": rec,
            "round": ConfigRecord({"round": "fedcof-2"}),
            "broadcast": arrays_record(broadcast),
        }
        try:
            masked_sum_over_messages(
                self.grid,
                self.nodes,
                length=round_lengths(self.C, self.d, False)["fedcof-2"],
                frac_bits=frac_bits,
                threshold=None,
                timeout=30,
                masked_payload=lambda n: payload,
                round_name="fedcof-2",
                num_nodes=len(self.nodes),
            )
        except Exception as exc:  # noqa: BLE001 - the run cannot finish (the others are silent): read why
            text = str(exc)
            assert "stage 'masked'" in text, text
            accepted = "refused" not in text
        else:  # pragma: no cover - three nodes, one answering: never a sum
            accepted = True
        self.answers.append(accepted)
        return accepted


def _fedcof_world(K=3):
    """K digits nodes of the Flower app, their honest round-1 broadcast, and each node's own counts and means."""
    from privfed.flower import FlowerConfig  # noqa: PLC0415
    from privfed.flower.local import LocalGrid  # noqa: PLC0415
    from privfed.flower.node import load_node_data, node_rng, node_statistics  # noqa: PLC0415

    configs = {100 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}
    grid = LocalGrid(configs)
    cfg = FlowerConfig(method="fedcof", clients=K, secure="mask")
    stats = {
        n: node_statistics(load_node_data(c, cfg), cfg, node_rng(cfg, n, "noise"), secure=True)[0]
        for n, c in configs.items()
    }
    nodes = [FedCOFNode.from_stats(s, cfg.make_method()) for s in stats.values()]
    C, d = nodes[0].C, nodes[0].d
    server = FedCOFServer(cfg.make_method(), C, d)
    honest = server.fold_round1(np.sum([n.round1() for n in nodes], axis=0))
    own = {
        n: (s.counts.sum(axis=0), s.sums.sum(axis=0) / np.maximum(s.counts.sum(axis=0), 1)[:, None])
        for n, s in stats.items()
    }
    return grid, sorted(configs), honest, own, C, d


def _run_oracle(oracle: _Oracle, honest: dict, c: int, coords=(0, 1, 2)):
    """The count of class c by bisection on the rule N_c >= own count (11 probes), then each coordinate of the
    class mean by bisection on the ring-overflow rule with N_c as the dial (frac-bits 0, 42 probes each)."""
    K = len(oracle.nodes)
    base = {k: np.array(v, dtype=np.float64) for k, v in honest.items()}
    lo, hi = 0, 2048
    while hi - lo > 1:  # refused iff mid < own count
        mid = (lo + hi) // 2
        b = {k: v.copy() for k, v in base.items()}
        b["N"][c] = mid
        if oracle.ask(b, 32):
            hi = mid
        else:
            lo = mid
    count = hi
    T = 2.0**63 / K  # the overflow rule at frac-bits 0: max|x| + 1/2 < 2^63 / K
    r = 100.0
    w = T / (r * r * max(count, 1))  # weight on class c making the crossing radius r
    means = {}
    for i in coords:
        lo_d, hi_d = 0.0, 4 * r
        for _ in range(42):
            mid = (lo_d + hi_d) / 2
            b = {k: v.copy() for k, v in base.items()}
            b["N"][c] = np.floor(w * (b["Kc"][c] - 1) + 1)
            b["mu"][c, i] += mid
            if oracle.ask(b, 0):
                lo_d = mid
            else:
                hi_d = mid
        means[i] = base["mu"][c, i] + (lo_d + hi_d) / 2 - r
    return count, means


def test_the_issues_oracle_reads_neither_a_count_nor_a_mean_in_200_probes(digits_dataset):
    """The oracle of the issue: 11 probes bisect a class count on "N_c below the node's own count", 126 more
    bisect three coordinates of the class mean on the ring-overflow refusal (N_c and mu_c the dials,
    frac-bits 0), each probe under a fresh aggregation id.  Before, it recovered the count exactly and the
    coordinates to 1e-9.  Now every check reads the broadcast and public values only (frac-bits are the
    roster's, N_c is bounded by it, a spread beyond the ring is clipped and counted): run against two
    victims with different data, the oracle gets the same answers, and its estimates miss both."""
    grid, nodes, honest, own, C, d = _fedcof_world()
    c = int(np.argmax(np.min([own[n][0] for n in nodes], axis=0)))  # a class every node holds
    assert honest["Kc"][c] == len(nodes)
    runs = {}
    for victim in nodes[:2]:
        oracle = _Oracle(grid, nodes, victim, C, d)
        runs[victim] = (_run_oracle(oracle, honest, c), list(oracle.answers))
        assert len(oracle.answers) <= 200
    ans0, ans1 = runs[nodes[0]][1], runs[nodes[1]][1]
    assert own[nodes[0]][0][c] != own[nodes[1]][0][c]  # the two victims differ
    assert ans0 == ans1  # the same answers whatever the victim holds: nothing to read
    for victim, ((count, means), _) in runs.items():
        n_true, m_true = own[victim][0][c], own[victim][1][c]
        assert abs(count - n_true) > 1, (count, n_true)
        assert min(abs(means[i] - m_true[i]) for i in means) > 1e-3, (means, m_true[list(means)])


def test_an_unknown_run_config_key_is_refused_before_any_key_or_input(digits_dataset):
    """The oracle's first trick: one key the node does not know ("probe-id": i) gave a fresh aggregation id per
    probe, the config being hashed whole.  Now a node refuses a config it cannot read in full."""
    from privfed.errors import ConfigError  # noqa: PLC0415
    from privfed.flower import FlowerConfig, serve  # noqa: PLC0415
    from privfed.flower.local import LocalGrid  # noqa: PLC0415

    class Probing(LocalGrid):
        def push_messages(self, messages):
            for m in messages:
                if "config" in m.content:
                    m.content["config"]["probe-id"] = 7
            return super().push_messages(messages)

    nodes = {100 + i: {"partition-id": i, "num-partitions": 3} for i in range(3)}
    for secure in ("mask", "none"):
        with pytest.raises(ConfigError, match="run config carries key\\(s\\) \\['probe-id'\\]"):
            serve(Probing(nodes), FlowerConfig(method="fedncm", clients=3, secure=secure, timeout=30))


def test_num_classes_is_no_dial_a_node_with_its_own_file_answers_for_one(tmp_path):
    """A node with its own feature file checks its labels against num-classes, which the server names: a server
    varying it (10, 9, 8, ...) would learn the node's largest label a bit at a time, each run refused or not.
    The node answers for the num-classes of its first run, ever: another is refused whatever its labels."""
    from privfed.errors import PrivfedError  # noqa: PLC0415
    from privfed.flower import FlowerConfig, serve  # noqa: PLC0415
    from privfed.flower.local import LocalGrid  # noqa: PLC0415

    rng = np.random.default_rng(0)
    nodes = {}
    for i in range(3):
        path = tmp_path / f"site-{i}.npz"
        np.savez(path, features=rng.normal(size=(30, 8)), labels=np.arange(30) % (4 if i == 0 else 6))
        nodes[100 + i] = {"features": str(path)}
    grid = LocalGrid(nodes)
    first = serve(grid, FlowerConfig(method="fedncm", clients=3, secure="mask", num_classes=6, timeout=30))
    assert first.report["C"] == 6
    for C in (5, 4, 7):  # node 100's labels are 0..3: 5 and 4 would pass its label check, 7 too
        with pytest.raises(PrivfedError, match="refuses num-classes=%d: it answers for num-classes=6" % C):
            serve(grid, FlowerConfig(method="fedncm", clients=3, secure="mask", num_classes=C, timeout=30))


def test_the_ring_rule_reads_the_statistic_s_most_negative_value_too():
    """encode_for_ring refuses NaN, +inf and -inf, and a statistic whose largest magnitude is a negative
    value past the ring's rule (|x| 2^f + 1/2 < 2^63 / K) as it refuses a positive one; under the rule it
    is fixed_point.encode's encoding."""
    from mechanisms.secagg import fixed_point

    limit = (2.0**63 / K - 0.5) / 2.0**F  # the rule's largest |x|, to float rounding
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(InputError, match="NaN/inf"):
            encode_for_ring(np.array([1.0, bad, -2.0]), F, K)
    for sign in (1.0, -1.0):
        with pytest.raises(InputError, match="overflow"):
            encode_for_ring(np.array([0.5, sign * limit * 1.01, -0.25 * sign]), F, K)
        ok = np.array([0.5, sign * limit * 0.99, -0.25 * sign])
        np.testing.assert_array_equal(encode_for_ring(ok, F, K), fixed_point.encode(ok, F))
    assert encode_for_ring(np.zeros(0), F, K).size == 0
