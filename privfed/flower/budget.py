"""A Flower node's lifetime privacy budget: its operator sets it, the node charges every release it makes
to it, keeps what it spent in a ledger file that survives restarts, and refuses a release that would go
beyond it.

Node config (``flower-supernode --node-config``; all three or none)::

    dp-budget-epsilon=4 dp-budget-delta=1e-5 dp-budget-ledger="/var/lib/privfed/budget.json"

The ledger is made once by the operator (``python -m privfed.flower.budget init FILE``), never by the
node: a node whose configured ledger is missing, unreadable or corrupt refuses every DP release, because
a fresh ledger would forget what it spent.  ``python -m privfed.flower.budget show FILE --epsilon E
--delta D`` prints what a ledger holds.

What is charged.  Every DP release the node takes part in -- a plain upload with its own noise, its
clipped statistics for a trusted server that noises the sum, its noise share in a masked or CKKS sum,
each round of multi-round FedLog, in any run, for any method -- is charged the GDP mu of the release's
declared parameters (sensitivity and noise, :func:`mechanisms.dp.filter.release_mu`, at record level:
the budget protects each record the node holds), before any value computed from the node's data leaves
it.  The charge is written to the ledger (atomically, under a file lock) before the reply is sent, so a
crash never loses it.  Under secure aggregation the noise of the sum comes from every node's share: the
node charges the fewest shares a sum it is part of can carry (the roster's threshold t, less the
roster's declared colluders), and, on masking, settles the charge at the unmask stage, once t signatures
confirm the uploader list it signed, to the shares of its part of those uploaders, less the declared
colluders (a list the server merely names settles nothing).

Why the composition holds although the server picks every release after seeing the last:
:mod:`mechanisms.dp.filter` (the GDP filter of Smith & Thakurta 2022).  A refusal depends only on public
values -- the release's declared parameters and what the node has spent, itself a function of earlier
declared parameters -- never on the node's data, so a server learns nothing from it that it did not
choose.  A release without DP noise has no guarantee the budget could charge: a node with a budget
refuses it.

Persistence sits behind :class:`BudgetStore` (``load``, and ``transact``: one atomic read-check-write of
the charged releases, failing closed).  :class:`FileBudgetStore` keeps them in the ``dp-budget`` section of
a node ledger file (:class:`privfed.results.ledger.NodeLedger`: the same file layer, integrity check,
lock and atomic write as the secure-aggregation ledger).  The budget's file is bound to no roster: a
budget protects the node's data, which outlives any one federation, so a new roster does not reset it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import sys
from collections.abc import Callable

import numpy as np

from mechanisms.dp.calibration import as_real
from mechanisms.dp.filter import GaussianFilter, release_mu
from mechanisms.dp.ledger import ReleaseEvent, format_up
from mechanisms.secagg.crypto import ProtocolAbort
from privfed.errors import ConfigError, PrivfedError
from privfed.flower.values import misspelt_node_key
from privfed.results.ledger import UNBOUND_ROSTER, NodeLedger

__all__ = [
    "NODE_KEYS",
    "SECTION",
    "BudgetRefusal",
    "BudgetStore",
    "FileBudgetStore",
    "MemoryBudgetStore",
    "NodeBudget",
    "init_ledger",
    "main",
    "node_budget",
]

#: The node-config keys of a budget (all three or none).
NODE_KEYS = ("dp-budget-epsilon", "dp-budget-delta", "dp-budget-ledger")
#: The budget's section of its node ledger file, and that section's version.
SECTION = "dp-budget"
VERSION = 1
#: How the operator creates a budget's ledger file (named in every error).
CREATE = "python -m privfed.flower.budget init FILE"


class BudgetRefusal(ProtocolAbort):
    """A node refuses a release its lifetime budget cannot charge (one line, public values only)."""


# ------------------------------------------------------------------------------------------- storage
class BudgetStore:
    """Where a node's charged releases live.

    ``load()`` returns the list of releases charged so far (dicts, see :meth:`NodeBudget.charge`) or
    raises :class:`~privfed.errors.ConfigError` when the store is missing, unreadable or corrupt (never an
    empty list in its place); ``transact(change)`` applies ``change(releases) -> new releases`` (None: left
    as they are; it may raise to refuse, leaving the store as it was) as one atomic read-check-write, and
    returns the releases as stored.  ``where`` names the store in messages.
    """

    where = "the budget store"

    def load(self) -> list[dict]:
        raise NotImplementedError

    def transact(self, change: Callable[[list[dict]], list[dict] | None]) -> list[dict]:
        raise NotImplementedError


class MemoryBudgetStore(BudgetStore):
    """A store in memory (tests, and callers that keep the list elsewhere)."""

    where = "the in-memory budget store"

    def __init__(self, releases: list[dict] | None = None) -> None:
        self.releases = [dict(r) for r in (releases or [])]

    def load(self) -> list[dict]:
        return [dict(r) for r in self.releases]

    def transact(self, change: Callable[[list[dict]], list[dict] | None]) -> list[dict]:
        new = change(self.load())
        if new is not None:
            self.releases = [dict(r) for r in new]
        return self.load()


def _check_release(r, i: int, where: str) -> dict:
    def bad(why: str) -> ConfigError:
        return ConfigError(
            f"{where} is corrupt (release {i}: {why}); restore it from a backup: a node never starts over"
        )

    if not isinstance(r, dict):
        raise bad("not an object")
    for key, kind in (("id", str), ("run", str), ("what", str), ("events", list)):
        if not isinstance(r.get(key), kind):
            raise bad(f"{key!r} missing or of the wrong type")
    for key in ("mu", "declared_mu"):
        v = r.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise bad(f"{key!r} must be a finite number >= 0")
    try:
        [ReleaseEvent(**e) for e in r["events"]]
    except (TypeError, PrivfedError) as exc:
        raise bad(f"an event does not read back: {exc}") from None
    return r


class FileBudgetStore(BudgetStore):
    """The releases in the ``dp-budget`` section of a node ledger file (:class:`~privfed.results.ledger.NodeLedger`).

    The file layer refuses a missing, unreadable, damaged or edited file (its SHA-256) and writes under an
    exclusive lock through a fsynced temporary sibling renamed into place; this store refuses a ledger
    without a budget section and a release that does not read back.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.ledger = NodeLedger(path, UNBOUND_ROSTER, setting="dp-budget-ledger", create=CREATE)
        self.path = self.ledger.path
        self.where = f"the budget ledger {str(self.path)!r}"

    def _releases(self, records: dict) -> list[dict]:
        releases = records.get("releases")
        if not isinstance(releases, list):
            raise ConfigError(
                f"{self.where} holds no budget (no {SECTION!r} section: not a budget ledger); its operator "
                f"creates one with {CREATE}"
            )
        return [_check_release(r, i, self.where) for i, r in enumerate(releases)]

    def load(self) -> list[dict]:
        return self._releases(self.ledger.read(SECTION, VERSION))

    def transact(self, change: Callable[[list[dict]], list[dict] | None]) -> list[dict]:
        def on_disk(records: dict) -> dict | None:
            new = change(self._releases(records))
            return None if new is None else {"releases": list(new)}

        return self._releases(self.ledger.update(SECTION, on_disk, version=VERSION))


def init_ledger(path: str | os.PathLike) -> pathlib.Path:
    """The operator's step: create an empty ledger at ``path`` (refused if a file is there already)."""
    if not str(path).strip():  # it would name the working folder
        raise ConfigError("FILE is empty: name the ledger file to create, e.g. budget.json")
    p = pathlib.Path(path).expanduser()
    if not p.parent.is_dir():
        raise ConfigError(f"the folder {str(p.parent)!r} does not exist; create it first")
    NodeLedger.create(
        p,
        UNBOUND_ROSTER,
        sections={SECTION: (VERSION, {"releases": []})},
        setting="dp-budget-ledger",
        create=CREATE,
    )
    return p


# ------------------------------------------------------------------------------------------- the budget
def _plain(event) -> dict:
    """A release event as the ledger's JSON holds it: its fields, numpy scalars as Python numbers."""
    fields = dataclasses.asdict(event) if isinstance(event, ReleaseEvent) else dict(event)
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in fields.items()}


class NodeBudget:
    """One node's lifetime budget: the filter, the store, and the node's name in its refusals.

    Every release is charged through :meth:`charge` (which refuses, or writes the charge before it
    returns); :meth:`settle` lowers a charge once the noise actually present is known; :meth:`status`
    is what the node tells a server about its budget.
    """

    def __init__(self, filt: GaussianFilter, store: BudgetStore, node) -> None:
        self.filter, self.store, self.node = filt, store, node

    @classmethod
    def from_node_config(cls, node_config, node) -> NodeBudget | None:
        """The budget its node config sets (None when it sets none; ConfigError when it sets only part)."""
        given = [k for k in NODE_KEYS if k in node_config]
        if not given:
            return None
        if len(given) < len(NODE_KEYS):
            missing = [k for k in NODE_KEYS if k not in node_config]
            raise ConfigError(
                f"node {node}'s node config sets {given} but not {missing}: a budget needs its epsilon, delta and "
                "ledger file (dp-budget-epsilon=E dp-budget-delta=D dp-budget-ledger=FILE)"
            )
        try:
            if any(isinstance(node_config[k], bool) for k in NODE_KEYS[:2]):
                raise TypeError("true is no epsilon of 1")
            eps, delta = float(node_config[NODE_KEYS[0]]), float(node_config[NODE_KEYS[1]])
        except (TypeError, ValueError):
            raise ConfigError(
                f"node {node}'s dp-budget-epsilon and dp-budget-delta must be numbers, got "
                f"{node_config[NODE_KEYS[0]]!r} and {node_config[NODE_KEYS[1]]!r}"
            ) from None
        return cls(GaussianFilter(eps, delta), FileBudgetStore(str(node_config[NODE_KEYS[2]])), node)

    def _factor(self, verb: str, release: str, factor) -> float:
        """``factor`` as a finite number > 0, else a ConfigError before the ledger is touched: an infinite mu
        would leave a ledger no later read accepts, and 0 would charge nothing."""
        try:
            out = as_real(factor)
        except (TypeError, ValueError):
            out = math.nan
        if not (math.isfinite(out) and out > 0):
            raise ConfigError(
                f"node {self.node} cannot {verb} release {release!r} at {factor!r} times its declared noise's "
                f"mu (a finite number > 0 is needed); its ledger {self.store.where} is left as it was"
            )
        return out

    def _mus(self, releases: list[dict]) -> list[float]:
        return [float(r["mu"]) for r in releases]

    def ready(self) -> None:
        """Refuse now (ConfigError naming the ledger) if the store cannot be read."""
        self.store.load()

    def refuse(self, what: str, why: str, stage: str, deviation: str) -> BudgetRefusal:
        return BudgetRefusal(
            f"node {self.node} refuses {what}: {why}", node=self.node, stage=stage, deviation=deviation
        )

    def charge(
        self,
        *,
        release: str,
        run: str,
        what: str,
        events: list[dict],
        stage: str,
        factor: float = 1.0,
        simulation: bool = False,
        noise: str = "",
    ) -> float:
        """Charge one release (its ``events``, mu times ``factor``) or raise :class:`BudgetRefusal`.

        ``factor`` scales the declared mu to the least noise the release can carry (a secure sum with
        fewer shares than calibrated); ``noise`` names where its noise came from (the node's backend, or
        the trusted server), kept with the charge.  The charge is committed to the store before this
        returns.  Returns the mu charged.
        """
        for name, value in (
            ("release", release),
            ("run", run),
            ("what", what),
            ("stage", stage),
            ("noise", noise),
        ):
            # written to the ledger, whose reader takes text only: never stored
            if not isinstance(value, str):
                raise ConfigError(
                    f"node {self.node} cannot charge a release whose {name} is {value!r}: it must be text; its "
                    f"ledger {self.store.where} is left as it was"
                )
        events = list(events) if isinstance(events, (list, tuple)) or hasattr(events, "__next__") else events
        try:
            declared = release_mu(events, self.filter.unit)
        except ConfigError as exc:
            raise self.refuse(
                what, f"its lifetime budget cannot charge it ({exc})", stage, "uncharged"
            ) from None
        factor = self._factor("charge", release, factor)
        mu = declared * factor

        def add(releases: list[dict]) -> list[dict]:
            spent = self._mus(releases)
            if any(r["id"] == release for r in releases):
                raise self.refuse(what, "it charged this release once already", stage, "repeated-release")
            if not self.filter.admits(spent, mu):
                f = self.filter
                raise self.refuse(
                    what,
                    f"its lifetime privacy budget (epsilon={format_up(f.epsilon)}, delta={format_up(f.delta)}, "
                    f"record level) would be exceeded: epsilon={format_up(f.spent_epsilon(spent))} is spent over "
                    f"{len(spent)} release(s), this release alone is epsilon={format_up(f.release_epsilon(mu))} "
                    f"(GDP mu={format_up(mu)}), and the largest release it still admits is epsilon="
                    f"{format_up(f.remaining_epsilon(spent))}; its operator sets the budget "
                    "(node config dp-budget-epsilon)",
                    stage,
                    "over-budget",
                )
            return [
                *releases,
                {
                    "id": release,
                    "run": run,
                    "what": what,
                    "events": [_plain(e) for e in events],
                    "declared_mu": declared,
                    "mu": mu,
                    "settled": factor == 1.0,
                    "simulation": bool(simulation),
                    "noise": str(noise),
                },
            ]

        self.store.transact(add)
        return mu

    def settle(self, release: str, factor: float) -> float:
        """Set a charged release to ``factor`` times its declared mu (the noise its sum really carried)."""
        mu = self._factor("settle", release, factor)

        def lower(releases: list[dict]) -> list[dict]:
            for r in releases:
                if r["id"] == release:
                    new = float(r["declared_mu"]) * mu
                    # a charge is the least noise the release can carry: it only falls
                    if new > float(r["mu"]):
                        raise ConfigError(
                            f"node {self.node} cannot settle release {release!r} at mu={format_up(new)}: it was "
                            f"charged mu={format_up(float(r['mu']))}, the most it can have spent, and a settle only "
                            f"lowers a charge; its ledger {self.store.where} is left as it was"
                        )
                    r["mu"] = new
                    r["settled"] = True
                    return releases
            raise ConfigError(
                f"node {self.node} has no charged release {release!r} to settle in {self.store.where}"
            )

        return next(float(r["mu"]) for r in self.store.transact(lower) if r["id"] == release)

    def status(self, run: str | None = None) -> dict:
        """What the node spent (in total and in ``run``) and has left: numbers its releases' parameters fix."""
        releases = self.store.load()
        spent = self._mus(releases)
        mine = [float(r["mu"]) for r in releases if run is not None and r["run"] == run]
        f = self.filter
        return {
            "budgeted": True,
            "unit": f.unit,
            "epsilon": f.epsilon,
            "delta": f.delta,
            "releases": len(spent),
            "spent_epsilon": f.spent_epsilon(spent),
            "releases_run": len(mine),
            "spent_epsilon_run": f.spent_epsilon(mine),
            "remaining_epsilon": f.remaining_epsilon(spent),
        }


def node_budget(context) -> NodeBudget | None:
    """The budget of the node whose Flower ``context`` this is (None when its node config sets none; a
    ConfigError when a key of it, or any other the node reads, is misspelt and so would be left out)."""
    if (misspelt := misspelt_node_key(context.node_config)) is not None:
        raise misspelt
    return NodeBudget.from_node_config(context.node_config, context.node_id)


# ------------------------------------------------------------------------------------------- command
def _print_charges(releases: list[dict]) -> None:
    for r in releases:
        noise = r.get("noise") or "?"
        print(f"  {r['run'][:16] or '-':16}  mu={r['mu']:.6g}  noise={noise:6}  {r['what']}")


def main(argv: list[str] | None = None) -> int:
    """``python -m privfed.flower.budget init FILE`` / ``show FILE [--epsilon E --delta D]``."""
    ap = argparse.ArgumentParser(
        prog="python -m privfed.flower.budget",
        description="A Flower node's lifetime privacy budget ledger: create it once, read it any time.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("init", help="create an empty ledger (refused if FILE exists)").add_argument("file")
    show = sub.add_parser("show", help="print what a ledger holds against a budget")
    show.add_argument("file")
    # the ledger holds the charges, not the budget (that is the node config's dp-budget-epsilon/-delta):
    # without the two the charges and their composed mu are shown, with them what is left too
    show.add_argument("--epsilon", type=float, default=None, help="the node's dp-budget-epsilon (optional)")
    show.add_argument("--delta", type=float, default=None, help="the node's dp-budget-delta (optional)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "init":
            print(f"created {init_ledger(args.file)}: set dp-budget-ledger to it in the node config")
            return 0
        if (args.epsilon is None) != (args.delta is None):
            given, missing = ("--epsilon", "--delta") if args.delta is None else ("--delta", "--epsilon")
            raise ConfigError(
                f"{given} needs {missing} too (the node config's dp-budget-epsilon and dp-budget-delta), "
                "or give neither to see the charges alone"
            )
        if args.epsilon is None:
            releases = FileBudgetStore(args.file).load()
            mu = GaussianFilter.spent_mu([float(r["mu"]) for r in releases])
            print(
                f"{len(releases)} release(s) charged: composed mu={format_up(mu)} (Gaussian DP, record level); "
                "give --epsilon and --delta (the node's dp-budget-epsilon and dp-budget-delta) to see what is left"
            )
            _print_charges(releases)
            return 0
        if not (math.isfinite(args.epsilon) and args.epsilon > 0):  # the lifetime budget a node keeps
            raise ConfigError(
                f"--epsilon is the node's lifetime budget: a finite number > 0, got {args.epsilon:g}"
            )
        budget = NodeBudget(GaussianFilter(args.epsilon, args.delta), FileBudgetStore(args.file), "-")
        st = budget.status()
        print(
            f"{st['releases']} release(s) charged: epsilon={format_up(st['spent_epsilon'])} spent of "
            f"{format_up(st['epsilon'])} at delta={format_up(st['delta'])} (record level); the largest release "
            f"still admitted is epsilon={format_up(st['remaining_epsilon'])}"
        )
        _print_charges(budget.store.load())
    except PrivfedError as exc:
        print(f"python -m privfed.flower.budget: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover - the command's entry point
    sys.exit(main())
