"""A deviating server on the Flower app: the real ClientApp and ServerApp over the in-process grid, with the
grid (the server's side of the wire) changing what the server sends.  Run with ``python -m pytest tests/adversarial``."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import TamperingGrid, digits_nodes, serve_tampered  # noqa: E402

from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.secagg import masked_sum_over_messages, simulated_identities  # noqa: E402

K = 4


def _nodes(n=K):
    return digits_nodes(n)


def _rewrite(msg, change) -> None:
    """Rewrite a masking request as the server would send it: ``change(request dict)`` in place, then the
    request's records replaced by the changed request's."""
    from privfed.flower.secagg import from_records, to_records

    req = from_records(msg.content)
    change(req)
    for k in [k for k in msg.content.keys() if k.startswith("secagg")]:
        del msg.content[k]
    for k, v in to_records(req).items():
        msg.content[k] = v


def test_a_repeated_dp_session_is_refused_so_the_reported_epsilon_holds(digits_dataset):
    """The issue's differencing attack: run the noisy masked sum twice (the second time without a victim) and
    subtract.  The nodes remember the aggregation: the second session is refused before any upload."""
    grid = LocalGrid(_nodes())
    cfg = FlowerConfig(
        method="fedncm", clients=K, epsilon=1.0, delta=1e-5, clip=10.0, secure="mask", timeout=30
    )
    first = serve(grid, cfg)
    assert first.head.privacy.epsilon == pytest.approx(1.0, rel=1e-9)
    threat = first.head.secure_aggregation["threat"]  # computed: K = 4, t = 3 tolerates 2t - 4 - 1 = 1
    assert (threat["num_nodes"], threat["threshold"], threat["colluders_tolerated"]) == (4, 3, 1)
    assert threat["epsilon"]["this_run"] == pytest.approx(1.0, rel=1e-9)
    assert first.head.secure_aggregation["threat_model"].startswith(
        "Pairwise masking, active-adversary version"
    )
    for again in (
        cfg,
        FlowerConfig(**{**cfg.__dict__, "partition_seed": 5}),
    ):  # any DP config: one release a run
        with pytest.raises(ProtocolAbort, match="stage 'masked'.*second masked session") as exc:
            serve(grid, again)
        assert exc.value.node is not None and exc.value.stage == "masked"


def test_a_split_fedcof_broadcast_is_detected_on_flower(digits_dataset):
    """Round 2 of FedCOF: the victim gets mu_c = 0 and the others N_c + 1 for every class of two or more
    nodes, lies each node's own checks pass (with K_c = 1 for the others, the issue's attack, which
    released the victim's sum_c w_c n_c mu_c mu_c^T, the other nodes already refuse the broadcast).
    The nodes' signed echoes disagree: every node aborts."""
    victim = 100

    def tamper(msg):
        if msg.metadata.message_type == "query.masked" and "broadcast" in msg.content:
            b = msg.content["broadcast"]
            arrays = {k: b[k].numpy() for k in b.keys()}
            shared = arrays["Kc"] >= 2  # classes of two or more nodes: a sole holder checks its own
            if msg.metadata.dst_node_id == victim:
                arrays["mu"] = np.where(shared[:, None], 0.0, arrays["mu"])
            else:
                arrays["N"] = np.where(shared, arrays["N"] + 1.0, arrays["N"])
            from privfed.flower.wire import arrays_record

            msg.content["broadcast"] = arrays_record(arrays)

    with pytest.raises(
        ProtocolAbort, match="stage 'unmask'.*(split-broadcast|did not sum what|other survivor)"
    ):
        serve_tampered(tamper, method="fedcof")


def test_an_inconsistent_uploader_list_is_detected_on_flower(digits_dataset):
    """Half the nodes are told the victim uploaded, the other half that it dropped."""

    def tamper(msg):
        if msg.metadata.message_type == "query.consistency" and msg.metadata.dst_node_id in (102, 103):
            _rewrite(msg, lambda rec: rec.update(uploaded=[u for u in rec["uploaded"] if u != 0]))

    with pytest.raises(ProtocolAbort, match="node 10[0-3] refused secure aggregation at stage"):
        serve_tampered(tamper, clients=6)


def test_a_server_asking_for_a_lower_threshold_is_refused_by_every_node(digits_dataset):
    grid = LocalGrid(_nodes())  # roster: K = 4, t = 3

    def payload(node):
        raise AssertionError("no node gets as far as the masked stage")

    with pytest.raises(ProtocolAbort, match="stage 'keys'.*asks for K=4, t=2.*configured with K=4, t=3"):
        masked_sum_over_messages(
            grid,
            sorted(grid.contexts),
            length=3,
            frac_bits=16,
            threshold=2,
            timeout=5,
            masked_payload=payload,
            round_name="sums",
        )


def test_a_substituted_key_advertisement_is_refused_on_flower(digits_dataset):
    def tamper(msg):
        if msg.metadata.message_type == "query.shares":

            def change(rec):
                rec["c_pk"] = [bytes(32 * [9]), *rec["c_pk"][1:]]

            _rewrite(msg, change)

    with pytest.raises(
        ProtocolAbort, match="stage 'shares'.*(not signed by its roster key|came back changed)"
    ):
        serve_tampered(tamper)


def test_a_tampered_share_on_flower_names_the_node_and_stage_not_a_raw_invalid_tag(digits_dataset):
    def tamper(msg):
        if msg.metadata.message_type == "query.masked" and msg.metadata.dst_node_id == 101:

            def change(rec):
                cts = [bytearray(c) for c in rec["ct"]]
                cts[0][-1] ^= 1
                rec["ct"] = [bytes(c) for c in cts]

            _rewrite(msg, change)

    with pytest.raises(
        ProtocolAbort, match="node 101 refused secure aggregation at stage 'masked'.*fails authentication"
    ) as exc:
        serve_tampered(tamper)
    assert "InvalidTag" not in str(exc.value)


def test_a_nodes_own_refusal_at_the_masked_stage_reaches_the_user(digits_dataset):
    # frac-bits=53 (the most the encoding takes, fixed by the operator's roster): the digits sums times 2^53
    # overflow the ring for K = 4.
    from mechanisms.secagg.bounds import PublicBounds

    with pytest.raises(ConfigError, match="stage 'masked'.*could overflow the 2\\^64 ring with 4 nodes"):
        serve(
            LocalGrid(simulated_identities(_nodes(), bounds=PublicBounds(frac_bits=53))),
            FlowerConfig(method="fedncm", clients=K, secure="mask", frac_bits=53, timeout=30),
        )
    # a server asking for other frac-bits than the roster's (the default 32) is refused before any input
    with pytest.raises(ProtocolAbort, match="stage 'masked'.*frac-bits=53 but its roster fixes frac-bits=32"):
        serve(
            LocalGrid(_nodes()),
            FlowerConfig(method="fedncm", clients=K, secure="mask", frac_bits=53, timeout=30),
        )
    with pytest.raises(ConfigError, match="frac_bits must lie in"):
        FlowerConfig(method="fedncm", clients=K, secure="mask", frac_bits=60)


def test_the_overflow_check_uses_the_configured_K_not_the_servers(digits_dataset):
    """A server claiming K = 2 (to make a node accept a larger input) is refused at the first stage; the node's
    overflow rule uses the roster's K."""
    grid = LocalGrid(simulated_identities(_nodes()))

    with pytest.raises(ProtocolAbort, match="asks for K=2"):
        masked_sum_over_messages(
            grid,
            sorted(grid.contexts),
            length=3,
            frac_bits=16,
            threshold=2,
            timeout=5,
            masked_payload=lambda n: {},
            round_name="sums",
            num_nodes=2,
        )


def test_a_minority_threshold_is_refused_before_any_message():
    with pytest.raises(ConfigError, match="threshold=3 is too low for clients=6.*t >= 4"):
        FlowerConfig(method="fedncm", clients=6, secure="mask", threshold=3)


def test_a_node_ledger_file_refuses_a_sum_repeated_in_another_run(digits_dataset, tmp_path):
    """A server that starts a new run (fresh node state) to repeat a sum: refused by nodes that keep a ledger
    file; another configuration over the same uploaders is another aggregation and runs."""
    nodes = _with_ledgers(
        simulated_identities(
            {n: {**c, "secagg-ledger": str(tmp_path / f"ledger-{n}.json")} for n, c in _nodes().items()}
        )
    )
    cfg = FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30)
    serve(LocalGrid(nodes), cfg)
    with pytest.raises(
        ProtocolAbort, match="stage 'masked'.*its ledger .* already uploaded for this configuration"
    ):
        serve(LocalGrid(nodes), cfg)  # a new run: new contexts, the same nodes
    serve(LocalGrid(nodes), FlowerConfig(method="fed3r", clients=K, secure="mask", timeout=30))
    for n in nodes:  # two aggregation ids, and the one uploader set both sums covered
        rec = _records(nodes[n])
        assert rec["uploaders"] == [0, 1, 2, 3] and len(rec["aggregations"]) == 2


def _sum(grid, cfg, among, round_name="sums"):
    """One masked sum of the nodes' statistics under ``cfg``, run by the server over ``among`` only."""
    from flwr.app import ConfigRecord

    from privfed.flower.protocol import sum_vector_length

    rec = ConfigRecord({**cfg.to_wire(), "run-nonce": os.urandom(8).hex()})
    return masked_sum_over_messages(
        grid,
        among,
        length=sum_vector_length(cfg.make_method(), 10, 64),
        frac_bits=cfg.frac_bits,
        threshold=None,
        timeout=30,
        masked_payload=lambda n: {"config": rec, "round": ConfigRecord({"round": round_name})},
        round_name=round_name,
        num_nodes=K,
    )


def test_two_sums_over_different_uploader_sets_are_refused_whatever_the_configuration(digits_dataset):
    """Differencing without DP: the same statistic summed twice in one run, the second time without the victim,
    under two run configs that differ only where the sum does not (delta, without DP), so the two aggregation ids
    differ.
    Before, both sums were released and their difference was the victim's class counts and sums, exactly.
    A node now signs only the uploader set of its first sum: the second aborts before any share is revealed."""
    grid = LocalGrid(simulated_identities(_nodes()))
    nodes = sorted(grid.contexts)
    first = FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30)
    _sum(grid, first, nodes)
    other = FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30, delta=first.delta / 10)
    with pytest.raises(
        ProtocolAbort,
        match="stage 'consistency'.*uploaders \\[1, 2, 3\\].*earlier sum covered \\[0, 1, 2, 3\\]",
    ) as exc:
        _sum(grid, other, nodes[1:])
    assert exc.value.stage == "consistency" and exc.value.node in nodes[1:]
    # Another configuration over the same uploaders is fine: it is a sum over the same set.
    again = _sum(grid, FlowerConfig(method="fed3r", clients=K, secure="mask", timeout=30), nodes)
    assert again.uploaded == nodes


def test_a_ledger_file_keeps_the_uploader_set_and_the_dp_release_across_runs(digits_dataset, tmp_path):
    """Across runs (fresh node state) the ledger file holds the uploader set and, under DP, the release: a
    new run that leaves a node out is refused, and so is a second DP release under another configuration
    (before, any config change gave the file a new id: a second noisy release of the same statistics)."""
    nodes = _with_ledgers(
        simulated_identities(
            {n: {**c, "secagg-ledger": str(tmp_path / f"ledger-{n}.json")} for n, c in _nodes().items()}
        )
    )
    ids = sorted(nodes)
    _sum(LocalGrid(nodes), FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30), ids)
    with pytest.raises(ProtocolAbort, match="stage 'consistency'.*earlier sum covered \\[0, 1, 2, 3\\]"):
        _sum(LocalGrid(nodes), FlowerConfig(method="fed3r", clients=K, secure="mask", timeout=30), ids[1:])
    dp = {
        "method": "fedncm",
        "clients": K,
        "secure": "mask",
        "timeout": 30,
        "epsilon": 1.0,
        "delta": 1e-5,
        "clip": 10.0,
    }
    _sum(LocalGrid(nodes), FlowerConfig(**dp), ids)
    with pytest.raises(ProtocolAbort, match="stage 'masked'.*its ledger .* already uploaded"):
        _sum(LocalGrid(nodes), FlowerConfig(**dp, partition_seed=5), ids)


def _with_ledgers(nodes: dict[int, dict]) -> dict[int, dict]:
    """Each node's ledger file created by the documented step (the operator's --init-ledger, bound to the
    roster the node runs with)."""
    from mechanisms.secagg.identity import Roster
    from mechanisms.secagg.ledger import init_ledger_file

    for c in nodes.values():
        init_ledger_file(c["secagg-ledger"], Roster.from_json(c["secagg-roster"]).fingerprint)
    return nodes


def _records(node_config: dict) -> dict:
    """The secagg section of a node's ledger file."""
    from mechanisms.secagg.identity import Roster
    from mechanisms.secagg.ledger import SECTION
    from privfed.results.ledger import NodeLedger

    fp = Roster.from_json(node_config["secagg-roster"]).fingerprint
    return NodeLedger.open(node_config["secagg-ledger"], fp).read(SECTION)


def _deployed(roster, ids, ledgers=None) -> dict[int, dict]:
    """Node configs of K deployed nodes: each its identity and the roster, and a ledger file in ``ledgers``
    (a folder, each file created by the operator's step) unless None."""
    out = {}
    for i in range(K):
        out[100 + i] = {
            "partition-id": i,
            "num-partitions": K,
            "secagg-identity": ids[i].to_json(),
            "secagg-roster": roster.to_json(),
        }
        if ledgers is not None:
            out[100 + i]["secagg-ledger"] = str(ledgers / f"ledger-{i}.json")
    return out if ledgers is None else _with_ledgers(out)


def test_a_node_deployed_with_a_roster_refuses_to_release_in_the_clear(digits_dataset, tmp_path):
    """The simplest deviation: instead of a secure sum, the server asks each node for its statistics in a plain
    query (or through Flower's SecAgg+, which it can unmask).  Before, a node with a roster answered either with
    its raw statistics.  Now it refuses unless its own operator allows plain releases."""
    from mechanisms.secagg.identity import make_roster
    from privfed.flower.local import LocalGrid as Grid

    roster, ids = make_roster(K, colluders=0)  # CKKS needs a roster that declares no colluder
    deployed = _deployed(roster, ids, tmp_path)
    for secure in ("none", "flwr-secaggplus-insecure"):
        extra = {"clip": 10.0, "max_records": 1000} if secure != "none" else {}
        with pytest.raises(
            (ConfigError, ProtocolAbort, RuntimeError), match="refuses (a plain release|Flower's SecAgg)"
        ):
            serve(
                Grid(deployed), FlowerConfig(method="fedncm", clients=K, secure=secure, timeout=30, **extra)
            )
    masked = serve(Grid(deployed), FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30))
    assert masked.head.secure_aggregation["summed_nodes"] == K
    allowed = {n: {**c, "allow-plain-release": "true"} for n, c in deployed.items()}
    assert serve(Grid(allowed), FlowerConfig(method="fedncm", clients=K, timeout=30)).report["replied"] == K


@pytest.mark.parametrize("secure", ["mask", "ckks"])
def test_a_dp_config_claiming_more_nodes_than_the_roster_is_refused(digits_dataset, secure):
    """Each node adds sigma^2 / (K - tolerance) with K from the run config.  A server that sends clients=200
    to K = 4 nodes gets a sum carrying 4/200 of the noise the reported epsilon needs; before, every node
    uploaded.  Now the node checks K against its roster first."""

    def tamper(msg):
        if msg.metadata.message_type in ("query.masked", "query.ckks_encrypt"):
            msg.content["config"]["clients"] = 200

    cfg = FlowerConfig(
        method="fedncm", clients=K, epsilon=1.0, delta=1e-5, clip=10.0, secure=secure, timeout=60
    )
    stage = "masked" if secure == "mask" else "ckks_encrypt"
    with pytest.raises(ProtocolAbort, match=f"stage '{stage}'.*clients=200 but its roster has K=4"):
        serve(TamperingGrid(_nodes(), tamper), cfg)

    def tamper_setup(
        msg,
    ):  # the same lie from the first stage: a digits node sees it disagree with its partition
        if msg.metadata.message_type == "query.setup":
            msg.content["config"]["clients"] = 200

    with pytest.raises(
        ConfigError, match=r"stage 'setup'.*num-partitions=4, but the run config says clients=200"
    ):
        serve(TamperingGrid(_nodes(), tamper_setup), cfg)


def test_a_deployed_node_refuses_a_noise_seed_chosen_by_the_server(digits_dataset, tmp_path):
    """noise-seed makes a node's noise share a function of (seed, node id), both known to the server, which can
    then subtract every share from the sum: no DP at all while the report says epsilon = 1.  Before, a node with
    a roster drew its share from the server's seed; now it refuses unless its operator allows seeded noise."""
    from mechanisms.secagg.identity import make_roster

    roster, ids = make_roster(K, colluders=0)  # CKKS needs a roster that declares no colluder
    # DP releases without a lifetime budget: the operator of a test deployment says so explicitly
    deployed = {n: {**c, "allow-unbudgeted-dp": "true"} for n, c in _deployed(roster, ids, tmp_path).items()}
    dp = {"method": "fedncm", "clients": K, "epsilon": 1.0, "delta": 1e-5, "clip": 10.0, "timeout": 30}
    for secure in ("mask", "ckks"):
        with pytest.raises(
            ConfigError, match="stage 'setup'.*noise-seed=7, and a noise share drawn from a seed"
        ):
            serve(LocalGrid(deployed), FlowerConfig(**dp, secure=secure, noise_seed=7))
    assert serve(
        LocalGrid(deployed), FlowerConfig(**dp, secure="mask")
    ).head.privacy.epsilon == pytest.approx(1.0)


def test_masking_then_ckks_under_dp_is_one_release(digits_dataset):
    """The same DP release through the other protocol in the same run (a fresh noise share each time would
    compose; the same share would subtract): the node's one ledger refuses the second upload."""
    grid = LocalGrid(_nodes())
    dp = {"method": "fedncm", "clients": K, "epsilon": 1.0, "delta": 1e-5, "clip": 10.0, "timeout": 60}
    serve(grid, FlowerConfig(**dp, secure="mask"))
    with pytest.raises(ProtocolAbort, match="stage 'ckks_encrypt'.*second masked session"):
        serve(grid, FlowerConfig(**dp, secure="ckks"))


def _rewrite_broadcast(msg, change):
    from privfed.flower.wire import arrays_record

    b = msg.content["broadcast"]
    arrays = {k: b[k].numpy() for k in b.keys()}
    change(arrays)
    msg.content["broadcast"] = arrays_record(arrays)


@pytest.mark.parametrize(
    "change, text",
    [
        (lambda a: a.update(Kc=a["Kc"] + 0.5), "whole numbers"),
        (lambda a: a.update(Kc=np.zeros_like(a["Kc"])), "K_c = 0 \\(no mean\\)"),
        (lambda a: a.update(N=np.ones_like(a["N"])), "at least K_c, one record per mean"),
        (lambda a: a.update(mu=np.full_like(a["mu"], np.inf)), "NaN or inf"),
        (lambda a: a.pop("Kc"), "expected exactly"),
        # inflated K_c (the reweighting lie) beyond K means of K roster nodes with one mean each
        (lambda a: a.update(Kc=a["Kc"] + K), f"a K_c is above {K}, the public bound"),
        # inflated N_c (the issue's exact reweighting: N_0 = 1e15) beyond K times the roster's records per node
        (
            lambda a: a.update(N=np.where(np.arange(a["N"].size) == 0, 1e15, a["N"])),
            "an N_c is above 4.1943e\\+06",
        ),
    ],
)
def test_a_lying_fedcof_broadcast_sent_to_every_node_is_refused_before_it_uploads(
    digits_dataset, change, text
):
    """The same false broadcast for all (no split for the echo to catch): each node checks it against the public
    rules and bounds (its roster's: K means and K * 2^20 records a class, by default) and aborts at the masked
    stage, before computing or uploading its round-2 spread."""

    def tamper(msg):
        if msg.metadata.message_type == "query.masked" and "broadcast" in msg.content:
            _rewrite_broadcast(msg, change)

    with pytest.raises(
        ProtocolAbort, match=f"stage 'masked'.*refuses FedCOF's round-2 broadcast.*{text}"
    ) as exc:
        serve_tampered(tamper, method="fedcof")
    assert exc.value.node in _nodes() and exc.value.stage == "masked"


@pytest.mark.parametrize(
    "method, rewrite, text",
    [
        ("fedcof", {"fedcof-1": "sums"}, "asks for secure round 'sums'.*runs \\['fedcof-1', 'fedcof-2'\\]"),
        ("fedncm", {"sums": "fedcof-2"}, "asks for secure round 'fedcof-2'.*runs \\['sums'\\]"),
        ("fedcof", {"fedcof-2": "fedcof-1"}, "round 1 takes no broadcast"),
    ],
)
def test_a_round_the_method_does_not_run_is_refused(digits_dataset, method, rewrite, text):
    """A server asking a FedCOF node for its plain class totals (or a sum-only node for a FedCOF round, or
    round 1 with a broadcast) gets a refusal, not a vector."""
    from flwr.app import ConfigRecord

    def tamper(msg):
        if msg.metadata.message_type == "query.masked":
            name = str(msg.content["round"]["round"])
            if name in rewrite:
                msg.content["round"] = ConfigRecord({"round": rewrite[name]})

    with pytest.raises(ProtocolAbort, match=f"stage 'masked'.*{text}"):
        serve(
            TamperingGrid(_nodes(), tamper),
            FlowerConfig(method=method, clients=K, secure="mask", timeout=30),
        )


def test_an_honest_two_round_run_states_the_protocol_threat_model(digits_dataset):
    from mechanisms.secagg.bounds import DEFAULTS
    from privfed.methods.fedcof_protocol import threat_model

    res = serve(LocalGrid(_nodes()), FlowerConfig(method="fedcof", clients=K, secure="mask", timeout=30))
    sa = res.head.secure_aggregation
    # computed with the bounds the nodes check: the roster's (default) K * means and K * records per node
    want = threat_model(
        DEFAULTS.max_means(K), DEFAULTS.max_count(K), exact=True, max_ratio=DEFAULTS.fedcof_tilt()
    )
    assert sa["protocol_threat_model"] == want and "Not prevented" in want and f"K_c <= {K}" in want
    assert "tilt the round-2 sum toward one class by at most 1024" in want
    assert [len(s) for s in res.sums] == [
        2 * res.report["C"] + res.report["C"] * res.report["d"],
        res.report["d"] ** 2 + 1,
    ]


def test_a_lying_fedcof_broadcast_is_refused_under_ckks_too(digits_dataset):
    pytest.importorskip("tenseal")

    def tamper(msg):
        if msg.metadata.message_type == "query.ckks_encrypt" and "broadcast" in msg.content:
            _rewrite_broadcast(msg, lambda a: a.update(N=np.ones_like(a["N"])))

    with pytest.raises(ProtocolAbort, match="stage 'ckks_encrypt'.*at least K_c, one record per mean"):
        serve(
            TamperingGrid(_nodes(), tamper),
            FlowerConfig(method="fedcof", clients=K, secure="ckks", timeout=60),
        )


@pytest.mark.parametrize("secure", ["mask", "ckks"])
def test_a_deployed_node_without_a_ledger_file_refuses_before_any_key(digits_dataset, secure):
    """Without a ledger that outlives the run, a server that starts run after run under one session id collects
    the same nodes' consistency signatures on different survivor views and replays them in a later run, so
    that a victim's neighbours reveal both kinds of its shares.  A node deployed with a roster therefore needs
    secagg-ledger (or its operator's allow-ephemeral-ledger=true for a test deployment)."""
    from mechanisms.secagg.identity import make_roster

    roster, ids = make_roster(K, colluders=0)  # CKKS needs a roster that declares no colluder
    deployed = _deployed(roster, ids)
    cfg = FlowerConfig(method="fedncm", clients=K, secure=secure, timeout=30)
    # the first message of a secure run, before any key: the setup
    with pytest.raises(ConfigError, match="stage 'setup'.*without a ledger file.*secagg-ledger=\"FILE\""):
        serve(LocalGrid(deployed), cfg)
    allowed = {n: {**c, "allow-ephemeral-ledger": "true"} for n, c in deployed.items()}
    assert serve(LocalGrid(allowed), cfg).head.secure_aggregation["summed_nodes"] == K
    # a ledger setting that names no file (secagg-ledger="$LEDGER" with the variable unset, or a number) is
    # refused, never taken for no ledger: run after run would then sum the same nodes again
    for value in ("", "  ", 0, False):
        unnamed = {n: {**c, "secagg-ledger": value} for n, c in deployed.items()}
        with pytest.raises(ConfigError, match=r"secagg-ledger=.* names no file"):
            serve(LocalGrid(unnamed), cfg)


def test_the_bound_on_counts_comes_from_the_roster_never_from_the_server(digits_dataset):
    """N_c is checked against K times the roster's records per node: a roster saying 1,000 refuses
    N_c = 4,001 whatever the run config claims (max-records is the server's), and the honest run passes."""
    from mechanisms.secagg.bounds import PublicBounds

    nodes = simulated_identities(_nodes(), bounds=PublicBounds(max_records=1000))

    def tamper(msg):
        if msg.metadata.message_type == "query.masked" and "broadcast" in msg.content:
            _rewrite_broadcast(
                msg, lambda a: a.update(N=np.where(np.arange(a["N"].size) == 0, 4001.0, a["N"]))
            )

    def inflate(msg):  # the server claims a larger bound in the run config: refused at the door
        if "config" in msg.content:
            msg.content["config"]["max_records"] = 10**9

    honest = serve(LocalGrid(nodes), FlowerConfig(method="fedcof", clients=K, secure="mask", timeout=30))
    assert "N_c <= 4000" in honest.head.secure_aggregation["protocol_threat_model"]
    with pytest.raises(ProtocolAbort, match="an N_c is above 4000, the public bound on a class's count"):
        serve(
            TamperingGrid(nodes, tamper), FlowerConfig(method="fedcof", clients=K, secure="mask", timeout=30)
        )
    with pytest.raises(ConfigError, match="max-records 1000000000 contradicts level record"):
        serve(
            TamperingGrid(nodes, lambda m: (inflate(m), tamper(m))),
            FlowerConfig(method="fedcof", clients=K, secure="mask", timeout=30),
        )


# ----------------------------------------------------------------------------- the message bytes on the wire
def _corrupt_bytes(rec):
    from flwr.app import ConfigRecord

    from privfed.flower.secagg import MESSAGE_KEY

    raw = bytes(rec[MESSAGE_KEY])
    return ConfigRecord({MESSAGE_KEY: raw[:-3]})


def _extra_value(rec):
    from flwr.app import ConfigRecord

    return ConfigRecord({**dict(rec), "uploaded": [0, 1, 2, 3]})


def _not_bytes(rec):
    from flwr.app import ConfigRecord

    from privfed.flower.secagg import MESSAGE_KEY

    return ConfigRecord({MESSAGE_KEY: "PFM1"})


@pytest.mark.parametrize(
    "stage, corrupt",
    [
        ("keys", _corrupt_bytes),
        ("shares", _not_bytes),
        ("masked", _corrupt_bytes),
        ("consistency", _extra_value),
        ("unmask", _corrupt_bytes),
    ],
)
def test_a_lying_server_sending_bytes_that_are_no_message_gets_a_clean_refusal(
    digits_dataset, stage, corrupt
):
    """Every stage's request, its encoded message cut short, replaced by text or joined by a value beside
    it: the node answers with its one-line malformed-request refusal naming the stage (never a traceback),
    and no sum is released."""

    sent_as = "query.setup" if stage == "keys" else f"query.{stage}"  # the keys request rides the setup

    def tamper(msg):
        if msg.metadata.message_type == sent_as and msg.metadata.dst_node_id == 101:
            msg.content["secagg"] = corrupt(msg.content["secagg"])

    with pytest.raises(
        ProtocolAbort, match=f"node 101 refused secure aggregation at stage '{stage}'.*malformed"
    ) as exc:
        serve_tampered(tamper)
    assert "Traceback" not in str(exc.value)


# ----------------------------------------------------------------------------- key advertisements with the setup
class CountingGrid(LocalGrid):
    """A LocalGrid that counts the messages it pushes by message type."""

    def __init__(self, nodes, **kw):
        super().__init__(nodes, **kw)
        self.sent: dict[str, int] = {}

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            t = m.metadata.message_type
            self.sent[t] = self.sent.get(t, 0) + 1
        return super().push_messages(messages)


@pytest.mark.parametrize("method, sums", [("fedncm", 1), ("fedcof", 2)])
def test_the_first_sums_key_advertisements_travel_with_the_setup(digits_dataset, method, sums):
    """A masked run sends no keys request of its own for its first sum (the setup carries it): one round
    trip fewer; FedCOF's second sum, among the first's uploaders, advertises its keys as before.  The head is
    the plain run's."""
    plain = serve(LocalGrid(_nodes()), FlowerConfig(method=method, clients=K, timeout=30))
    grid = CountingGrid(_nodes())
    masked = serve(grid, FlowerConfig(method=method, clients=K, secure="mask", timeout=30))
    assert grid.sent["query.setup"] == K and grid.sent.get("query.keys", 0) == K * (sums - 1)
    for stage in ("shares", "masked", "consistency", "unmask"):
        assert grid.sent[f"query.{stage}"] == K * sums, stage
    np.testing.assert_allclose(masked.head.weight, plain.head.weight, atol=1e-6)


def test_a_keys_request_riding_the_setup_is_checked_as_one_sent_alone(digits_dataset):
    """The server lowers t in the keys request its setup carries: every node answers the setup and refuses
    the keys request, and the run stops at the keys stage with the node's own reason, no sum released."""

    def tamper(msg):
        if msg.metadata.message_type == "query.setup":
            _rewrite(msg, lambda rec: rec.update(t=2))

    with pytest.raises(ProtocolAbort, match="stage 'keys'.*asks for K=4, t=2.*configured with K=4, t=3"):
        serve_tampered(tamper)
