"""A node keeps its masking state machine between messages in its process, and never trusts it over the state
record its context holds: a lost, replaced or older record means the node is rebuilt from the record (or,
with none, starts from nothing and refuses the request), exactly as without the kept machine."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adversarial"))

from adversary import Federation  # noqa: E402

from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from mechanisms.secagg.identity import Identity, Roster, make_roster  # noqa: E402
from mechanisms.secagg.masking.node import MaskingNode  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.flower import kept  # noqa: E402
from privfed.flower.secagg import STATE_KEY, node_identity  # noqa: E402


def _count_builds(monkeypatch) -> list[int]:
    """Count MaskingNode constructions made from a state record (a rebuild) through node_step."""
    built = []
    original = MaskingNode.__init__

    def init(self, *args, state=None, **kw):
        if state is not None:
            built.append(1)
        original(self, *args, state=state, **kw)

    monkeypatch.setattr(MaskingNode, "__init__", init)
    return built


def test_a_kept_node_is_used_while_its_record_is_the_one_it_wrote(monkeypatch):
    built = _count_builds(monkeypatch)
    fed = Federation(K=5)
    server = fed.server()
    fed.run_until(server, "done")
    assert built == []  # every message after the first found its node kept: no rebuild
    from privfed.flower import secagg

    assert server.done and not [k for k in secagg._KEPT._nodes if k[2] == fed.roster.fingerprint]
    # a finished node is dropped with its secrets
    for c in fed.ctx:
        assert dict(c.state[STATE_KEY])["stage"] == "done" and kept.TOKEN not in c.state[STATE_KEY]


def test_a_replaced_or_restored_record_rebuilds_the_node_from_it(monkeypatch):
    """An older copy of the record (restored, or written by another process) carries another token: the node
    is rebuilt from it, and answers as that record's state says (here: a replayed stage is refused)."""
    built = _count_builds(monkeypatch)
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "shares")
    old = copy.deepcopy(fed.ctx[0].state[STATE_KEY])  # node 0 after its key advertisement
    fed.run_until(server, "masked")  # node 0 has answered the shares request since
    fed.ctx[0].state[STATE_KEY] = old  # its record, restored to the earlier one
    assert built == []
    msg = server.requests()[0]
    with pytest.raises(ProtocolAbort) as exc:  # the rebuilt node is in stage "advertised"
        fed.send(0, msg)
    assert exc.value.deviation == "out-of-order" and built == [1]


def test_a_lost_record_is_a_node_with_no_state_even_if_kept(monkeypatch):
    _count_builds(monkeypatch)
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "masked")
    del fed.ctx[1].state[STATE_KEY]
    with pytest.raises(ProtocolAbort) as exc:
        fed.send(1, server.requests()[1])
    assert exc.value.deviation == "out-of-order" and "in state 'new'" in str(exc.value)


def test_a_node_kept_in_one_process_and_rebuilt_in_another_answers_the_same(monkeypatch):
    """Dropping every kept node between stages (as when each message reaches another worker process) gives
    the same sum: the record alone carries the state."""
    built = _count_builds(monkeypatch)
    fed = Federation(K=5)
    server = fed.server()
    while not server.done:
        monkeypatch.setattr("privfed.flower.secagg._KEPT", kept.KeptNodes())
        assert not fed.stage(server)
    assert len(built) == 5 * 4  # every node rebuilt at every stage after its first
    got = server.total.copy()
    fed2 = Federation(K=5)
    fed2.x = fed.x
    server2 = fed2.server()
    fed2.run_until(server2, "done")
    from mechanisms.secagg import fixed_point

    a, b = fixed_point.decode(got, 16), fixed_point.decode(server2.total, 16)
    assert abs(a - b).max() <= 5 * 2.0**-16


def test_parsed_rosters_and_identities_are_parsed_once_per_text(tmp_path, monkeypatch):
    roster, ids = make_roster(5)
    calls = []
    original = Roster.from_json.__func__

    def from_json(cls, text, source="roster"):
        calls.append(source)
        return original(cls, text, source)

    monkeypatch.setattr(Roster, "from_json", classmethod(from_json))
    kept._PARSED.clear()
    conf = {
        "secagg-roster": roster.to_json(),
        "secagg-identity": ids[2].to_json(),
        "allow-ephemeral-ledger": "true",
    }
    a = node_identity(conf, 7)
    b = node_identity(dict(conf), 7)
    assert a == b and a[0].index == 2 and len(calls) == 1
    # a file is read each time: a changed file is parsed anew
    path = tmp_path / "roster.json"
    path.write_text(roster.to_json())
    other, _ = make_roster(5)
    assert kept.parsed(str(path), Roster) == roster
    path.write_text(other.to_json())
    assert kept.parsed(str(path), Roster) == other
    with pytest.raises(ConfigError, match="no such file"):
        kept.parsed(str(tmp_path / "missing.json"), Roster)
    bad = tmp_path / "id.json"
    bad.write_text(json.dumps({"index": 1}))
    with pytest.raises(ConfigError, match=r"id.json is not a privfed identity \(no 'private_key' field\)"):
        kept.parsed(str(bad), Identity)
    # inline JSON in the node config gets the same one line, naming it (it was a KeyError)
    with pytest.raises(ConfigError, match=r"^secagg-identity \(inline JSON\) is not a privfed identity"):
        kept.parsed(json.dumps({"index": 1}), Identity)
    for i in range(kept.PARSED_LIMIT + 5):  # bounded
        kept.parsed(json.dumps({"index": i, "private_key": "00" * 32}), Identity)
    assert len(kept._PARSED) <= kept.PARSED_LIMIT


def test_a_simulated_roster_in_files_travels_as_its_path(tmp_path):
    """On Flower's simulation runtime the ClientApp (with the simulated roster) is pickled with every message:
    with a directory it carries the path only, and each node reads its own identity file (mode 0600)."""
    import pickle
    import stat

    from privfed.flower.provision import SimulatedRoster

    inline = SimulatedRoster(50, degree=4)
    filed = SimulatedRoster(50, degree=4, directory=tmp_path)
    assert len(pickle.dumps(filed)) < len(pickle.dumps(inline)) / 10
    back = pickle.loads(pickle.dumps(filed))
    ident, roster = back.for_node({"partition-id": 7}, 107)
    assert ident.index == 7 and roster.size == 50 and roster.degree == 4
    assert ident.check(roster) is ident and roster == Roster.from_json(filed.roster_json)
    assert stat.S_IMODE((tmp_path / "node-7.json").stat().st_mode) == 0o600
    assert back.for_node({"partition-id": 50}, 150) is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_write_tokens_never_repeat_across_writes_or_a_forked_child():
    """Every write's token is new, and a forked child does not repeat its parent's tokens (its prefix is drawn
    again): otherwise a record another process wrote could pass for the one this process kept."""
    from privfed.flower.kept import KeptNodes

    roster, ids = make_roster(4)

    def tokens(n: int) -> list[str]:
        nodes, out = KeptNodes(), []
        for i in range(n):
            node = MaskingNode(0, num_nodes=4, threshold=roster.threshold, identity=ids[0], roster=roster)
            node.st = {"stage": "advertised"}
            out.append(nodes.keep(("run", i), node, None, dict)[kept.TOKEN])
        return out

    mine = tokens(50)
    assert len(set(mine)) == 50
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next tokens, through the pipe
        try:
            os.write(w, json.dumps(tokens(50)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        child = json.loads(fh.read())
    os.waitpid(pid, 0)
    later = tokens(50)
    assert len(set(child)) == 50 and not set(child) & set(mine + later)


def test_the_client_app_travels_as_the_call_that_builds_it(tmp_path, monkeypatch):
    """Flower's simulation pickles the ClientApp (with cloudpickle, as Ray does) with every message: it travels
    as its builder's reference, its arguments and a token, not its handlers' code; a process builds it once per
    token, with the same handlers, faults and simulated roster as the app that was sent."""
    from ray import cloudpickle

    from privfed.flower import client_app
    from privfed.flower.provision import SimulatedRoster

    monkeypatch.setattr(kept, "_BUILT", {})  # this test's builds only
    provision = SimulatedRoster(50, degree=4, directory=tmp_path)
    app = client_app.make_client_app({7: "masked:exit"}, provision=provision)
    raw = cloudpickle.dumps(app)
    assert len(raw) < 2_000  # the closures by value were over ten times that
    before = dict(kept._BUILT)
    first, again = cloudpickle.loads(raw), cloudpickle.loads(raw)
    assert first is again and first is not app and len(kept._BUILT) == len(before) + 1
    build, (faults, roster), _ = first._built_by
    assert build is client_app.make_client_app and faults == {7: "masked:exit"}
    assert roster.directory == str(tmp_path) and roster.for_node({"partition-id": 7}, 7)[0].index == 7
    assert sorted(first._registered_funcs) == sorted(app._registered_funcs)
    assert len(cloudpickle.dumps(first)) < 2_000  # what a process built travels on as small
    other = cloudpickle.loads(cloudpickle.dumps(client_app.make_client_app(None)))  # another app: built anew
    assert other is not first and len(kept._BUILT) == len(before) + 2


def test_the_flwr_run_client_app_travels_as_its_module_name():
    """The ClientApp ``flwr run`` simulations load (``privfed.flower.simulation:client_app``) is pickled with
    every message as a reference to itself, so a worker builds its inner app once, not per message."""
    import pickle

    from ray import cloudpickle

    from privfed.flower import simulation

    for dumps in (pickle.dumps, cloudpickle.dumps):
        raw = dumps(simulation.client_app)
        assert len(raw) < 200 and pickle.loads(raw) is simulation.client_app


def test_simulations_keep_node_messages_and_contexts_out_of_rays_object_store(monkeypatch):
    """A simulated node's message and context (about 410 kB each with 51,210 values) travel inside Ray's task
    messages: Ray's inline limit is raised for the Ray processes a simulation starts (and only while it runs,
    in this process), unless the user's environment sets it; a value that is no byte count is refused."""
    from privfed.errors import ConfigError
    from privfed.flower import runtime_env as simulation

    key = simulation.RAY_INLINE_ENV
    monkeypatch.setenv(key, "x")  # recorded by monkeypatch, so the environment is restored after the test
    monkeypatch.delenv(key)
    with simulation.ray_defaults():
        assert int(os.environ[key]) == simulation.RAY_INLINE_BYTES == simulation.ray_inline_bytes() >= 1 << 20
    assert key not in os.environ  # nothing left behind in the user's process
    monkeypatch.setenv(key, "12345")
    with simulation.ray_defaults():
        assert os.environ[key] == "12345" and simulation.ray_inline_bytes() == 12345
    assert os.environ[key] == "12345"
    for bad in ("4MB", "-1", "", " 5", "1_000"):  # Ray's parser takes digits only, and stops on anything else
        monkeypatch.setenv(key, bad)
        with pytest.raises(ConfigError, match=key):
            simulation.ray_inline_bytes()
    docs = (Path(__file__).resolve().parents[2] / "docs" / "flower.md").read_text()
    assert f"raise Ray's inline limit to {simulation.RAY_INLINE_BYTES >> 20} MiB" in docs.replace("\n", " ")


def test_a_client_app_changed_after_it_was_built_travels_as_it_is():
    """A handler added after make_client_app returned is not what its builder makes: such an app pickles by
    value (as any ClientApp) and keeps the handler; arguments changed after building are built anew."""
    from ray import cloudpickle

    from privfed.flower import client_app

    app = client_app.make_client_app({1: "masked:exit"})
    small = cloudpickle.loads(cloudpickle.dumps(app))
    app._built_by[1][0][2] = "unmask"  # the faults argument, changed after building: another token
    changed = cloudpickle.loads(cloudpickle.dumps(app))
    assert changed is not small and changed._built_by[1][0] == {1: "masked:exit", 2: "unmask"}

    @app.query("extra")
    def extra(msg, context):  # pragma: no cover - only its registration is checked
        return msg

    raw = cloudpickle.dumps(app)
    back = cloudpickle.loads(raw)
    assert len(raw) > 5_000 and "query.extra" in back._registered_funcs
    assert set(back._registered_funcs) == set(app._registered_funcs)


class _Started(Exception):
    """Raised by a stub in place of the simulation it would start."""


def test_both_simulation_routes_hand_ray_the_inline_limit(monkeypatch, tmp_path):
    """The in-process route runs Flower's simulation with the limit in this process's environment (for the Ray
    processes it starts) and removes it afterwards; flwr_run hands it to the SuperLink it starts; a value the
    user's environment sets is what both pass on."""
    import importlib

    from privfed.flower import FlowerConfig, runtime_env, simulation

    # the module (its package exports a function of the same name)
    flwr_sim = importlib.import_module("flwr.simulation.run_simulation")

    key = runtime_env.RAY_INLINE_ENV
    seen: list[str | None] = []

    def fake_simulation(**kw):
        seen.append(os.environ.get(key))
        raise _Started

    def fake_popen(argv, env=None, **kw):
        seen.append(env.get(key))
        raise _Started

    monkeypatch.setattr(flwr_sim, "_run_simulation", fake_simulation)
    monkeypatch.setattr(simulation.subprocess, "Popen", fake_popen)
    monkeypatch.setenv(key, "x")
    monkeypatch.delenv(key)
    for user in (None, "777"):
        if user is not None:
            monkeypatch.setenv(key, user)
        with pytest.raises(_Started):
            simulation.run_simulation(FlowerConfig(method="fedncm", clients=2))
        with pytest.raises(_Started):
            simulation.flwr_run({}, num_supernodes=2)
        assert os.environ.get(key) == user  # nothing added to, or left in, this process's environment
    assert seen == [str(runtime_env.RAY_INLINE_BYTES)] * 2 + ["777"] * 2


def test_a_client_app_given_a_lifespan_or_mod_after_building_travels_as_it_is():
    """Any change after make_client_app sealed the app (a lifespan, a mod on the app) makes it travel by value."""
    from ray import cloudpickle

    from privfed.flower import client_app

    for change in ("lifespan", "mod"):
        app = client_app.make_client_app()
        if change == "lifespan":

            @app.lifespan()
            def life(context):  # pragma: no cover - only its registration is checked
                yield

        else:
            app._mods.append(lambda msg, context, call_next: call_next(msg, context))
        raw = cloudpickle.dumps(app)
        assert len(raw) > 5_000, change
        back = cloudpickle.loads(raw)
        assert (back._lifespan is not None) if change == "lifespan" else len(back._mods) == 1
