"""One results record for every command: what ran, on which data, with which guarantee, and what it gave.

Every privfed command (``tradeoff``, ``attack``, ``flower``, and the Flower
ServerApp that ``flwr run`` starts) writes its ``results.json`` through
:func:`write_record`, in one schema (:data:`SCHEMA`, checked by
:func:`check_record`):

==================  ==============================================================
``schema``          ``"privfed.run/1"``
``command``         ``tradeoff``, ``attack`` or ``flower``
``command_line``    the command as typed (or the run config a ServerApp was given)
``complete``        false for the runs kept after an interrupt
``config``          the configuration as run, resolved (``--config`` replays it)
``data``            the data rules: data set, training samples used and unused,
                    test split, partition rule, clients, seeds (:func:`data_rules`)
``guarantees``      the distinct guarantee sentences of the releases
``accuracy``        test accuracy per (method, placement, epsilon), with chance;
                    ``None`` for a command that measures none (attacks)
``bytes``           what one client uploads (mean over the rows), and the wire
``timing``          seconds (``total_s`` at least)
``versions``        Python, the platform and the packages that determine results
``records``         one row per run (method, epsilon, seed, guarantee, upload
                    bytes, accuracy where there is one, the metrics)
``summary``         rows over seeds (commands that sweep), or ``[]``
``warnings``        notes the run raised
==================  ==============================================================
"""

from __future__ import annotations

import contextlib
import math
import platform
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any

from privfed._validation import is_integer
from privfed.errors import ConfigError, InputError

__all__ = [
    "COMMANDS",
    "SCHEMA",
    "UNPROTECTED_ROW",
    "check_record",
    "data_rules",
    "json_text",
    "make_record",
    "versions",
    "write_record",
]

SCHEMA = "privfed.run/1"
COMMANDS = ("tradeoff", "attack", "flower")
#: What a record row of a run without noise says of its release, in every command: no epsilon delivered, no
#: neighbouring relation protected, no mechanism, no noise.
UNPROTECTED_ROW: dict[str, Any] = {
    "epsilon_reported": math.inf,
    "delta": 0.0,
    "level": "none",
    "mechanism": "none",
    "calibration": "-",
    "sigma": 0.0,
    "sigma_counts": 0.0,
    "private": False,
}

#: top-level key -> the types its value may have
_TOP: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "command": (str,),
    "command_line": (str,),
    "complete": (bool,),
    "config": (dict,),
    "data": (dict,),
    "guarantees": (list,),
    "accuracy": (dict, type(None)),
    "bytes": (dict,),
    "timing": (dict,),
    "versions": (dict,),
    "records": (list,),
    "summary": (list,),
    "warnings": (list,),
}
_DATA = (
    "dataset",
    "train_samples",
    "used_samples",
    "unused_samples",
    "test_samples",
    "test_split",
    "partition",
    "clients",
    "seeds",
)
_ROW = ("method", "epsilon", "seed", "guarantee", "upload_bytes")


def versions() -> dict[str, str]:
    """Versions of Python and of the packages that determine results."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in (
        "privfed",
        "numpy",
        "scipy",
        "scikit-learn",
        "torch",
        "torchvision",
        "dp-accounting",
        "opacus",
        "opendp",
        "tenseal",
        "cryptography",
        "flwr",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def _plain(o: Any) -> Any:
    """JSON data from numpy values, paths, dataclass-like objects; inf / NaN as the strings 'inf' / 'nan'."""
    import numpy as np

    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if isinstance(o, np.ndarray):
        return _plain(o.tolist())
    if isinstance(o, (bool, np.bool_)):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, (float, np.floating)):
        v = float(o)
        return v if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else "nan")
    if isinstance(o, (int, str)) or o is None:
        return o
    if hasattr(o, "as_dict"):
        return _plain(o.as_dict())
    return str(o)


def json_text(payload: Any) -> str:
    """JSON text of ``payload`` (numpy values converted; inf/NaN written as strings)."""
    import json

    return json.dumps(_plain(payload), indent=2) + "\n"


def _number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
        isinstance(v, str) and v in ("inf", "-inf", "nan")
    )


def _fraction(v: Any) -> bool:
    """An accuracy (or chance): a number in [0, 1], or 'nan' (none measured); never a bool."""
    if isinstance(v, str):
        return v == "nan"
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (v != v or 0 <= v <= 1)


def _check_row(i: int, row: Any, guarantees: list, measured: bool, where: str) -> None:
    """InputError naming the first thing wrong with row ``i`` of a record's ``records``."""
    if not isinstance(row, dict):
        raise InputError(
            f"{where}: record {i} is a {type(row).__name__}, not a JSON object with {list(_ROW)}"
        )
    lacking = [k for k in _ROW if k not in row]
    if lacking:
        raise InputError(f"{where}: record {i} lacks {lacking}")
    if not isinstance(row["method"], str) or isinstance(row.get("placement"), (list, dict)):
        raise InputError(f"{where}: record {i}'s method or placement is not a name (a string)")
    if not _number(row["epsilon"]) or not is_integer(row["seed"]):
        raise InputError(
            f"{where}: record {i} has a malformed epsilon or seed (epsilon {row['epsilon']!r}, seed "
            f"{row['seed']!r}); epsilon must be a number ('inf' for no noise) and seed an integer, not a bool"
        )
    if not isinstance(row["guarantee"], str):
        raise InputError(f"{where}: record {i}'s guarantee {row['guarantee']!r} is not a sentence (a string)")
    if row["guarantee"] not in guarantees:
        raise InputError(f"{where}: record {i}'s guarantee is not listed in 'guarantees'")
    if measured:
        if row.get("accuracy") is None:
            raise InputError(
                f"{where}: record {i} has no accuracy; a command that measures accuracy needs it in every record"
            )
        if not _fraction(row["accuracy"]):
            raise InputError(f"{where}: record {i}'s accuracy {row['accuracy']!r} is not a number in [0, 1]")
    for key in ("nonprivate_accuracy",):
        if key in row and row[key] is not None and not _fraction(row[key]):
            raise InputError(f"{where}: record {i}'s {key} {row[key]!r} is not a number in [0, 1]")


def check_record(rec: Any, where: str = "results.json") -> dict[str, Any]:
    """``rec`` if it is a privfed run record (:data:`SCHEMA`); InputError naming the first thing wrong."""
    if not isinstance(rec, dict):
        raise InputError(f"{where} is not a privfed run record (a JSON object)")
    if rec.get("schema") != SCHEMA:
        raise InputError(f"{where}: schema {rec.get('schema')!r} is not {SCHEMA!r}")
    for key, types in _TOP.items():
        if key not in rec:
            raise InputError(f"{where}: no {key!r}")
        if not isinstance(rec[key], types):
            raise InputError(f"{where}: {key!r} is a {type(rec[key]).__name__}")
    if rec["command"] not in COMMANDS:
        raise InputError(f"{where}: command {rec['command']!r} is not one of {', '.join(COMMANDS)}")
    missing = [k for k in _DATA if k not in rec["data"]]
    if missing:
        raise InputError(f"{where}: the data rules lack {missing}")
    if "total_s" not in rec["timing"] or "upload_per_client" not in rec["bytes"]:
        raise InputError(f"{where}: timing needs total_s and bytes needs upload_per_client")
    total = rec["timing"]["total_s"]
    if not (isinstance(total, (int, float)) and not isinstance(total, bool) and 0 <= total < math.inf):
        raise InputError(f"{where}: timing total_s {total!r} is not a number of seconds (finite, >= 0)")
    for i, row in enumerate(rec["records"]):
        _check_row(i, row, rec["guarantees"], rec["accuracy"] is not None, where)
    if rec["accuracy"] is not None:
        acc = rec["accuracy"]
        if not {"measured_on", "chance", "values"} <= set(acc) or not isinstance(acc["values"], list):
            raise InputError(f"{where}: 'accuracy' needs measured_on, chance and values")
        if acc["chance"] is not None and not _fraction(acc["chance"]):
            raise InputError(f"{where}: accuracy chance {acc['chance']!r} is not a number in [0, 1]")
        for i, v in enumerate(acc["values"]):
            if not (isinstance(v, dict) and {"method", "epsilon", "mean"} <= set(v)):
                raise InputError(
                    f"{where}: accuracy value {i} is not a JSON object with method, epsilon and mean"
                )
            if not all(_fraction(v[k]) for k in ("mean", "nonprivate_mean") if k in v):
                raise InputError(f"{where}: accuracy value {i}'s mean is not a number in [0, 1]")
    return rec


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    vals = [float(v) for v in values]
    if not vals:
        return math.nan, math.nan
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return m, sd


def make_record(
    *,
    command: str,
    command_line: str,
    config: Mapping[str, Any],
    data: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    timing: Mapping[str, Any],
    summary: Sequence[Mapping[str, Any]] = (),
    measured_on: str | None = None,
    chance: float | None = None,
    wire: Mapping[str, Any] | None = None,
    warnings: Sequence[str] = (),
    complete: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run record (plain JSON data) of one command's run; see the module docstring for its keys.

    ``measured_on`` (the test set's words) turns on the ``accuracy`` section: each
    (method, placement, epsilon) of ``records`` with the mean and spread of its
    ``accuracy`` over seeds, beside ``chance``.
    """
    if command not in COMMANDS:
        raise ConfigError(f"command {command!r} is not one of {', '.join(COMMANDS)}")
    where = f"the {command} run record"
    for name, value in (
        ("config", config),
        ("data", data),
        ("timing", timing),
        ("wire", wire),
        ("extra", extra),
    ):
        if value is not None and not isinstance(value, Mapping):
            raise InputError(f"{where}: {name} is a {type(value).__name__}, not a mapping")
    for name, value in (("records", records), ("summary", summary), ("warnings", warnings)):
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise InputError(f"{where}: {name} is a {type(value).__name__}, not a list")
    records, summary = list(records), list(summary)
    for name, rows_ in (("record", records), ("summary row", summary)):
        for i, r in enumerate(rows_):
            if not isinstance(r, Mapping):
                raise InputError(f"{where}: {name} {i} is a {type(r).__name__}, not a mapping")
    import json

    # checked as plain JSON data (numpy numbers converted), as check_record will read it back
    rows = json.loads(json_text([dict(r) for r in records]))
    guarantees = list(dict.fromkeys(str(r.get("guarantee", "")) for r in rows))
    for i, r in enumerate(rows):
        _check_row(i, r, guarantees, measured_on is not None, where)
    accuracy = None
    if measured_on is not None:
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            groups.setdefault((r["method"], r.get("placement", ""), float(r["epsilon"])), []).append(r)
        values = []
        for (m, place, eps), rs in groups.items():
            mean, sd = _mean_std([r["accuracy"] for r in rs])
            item = {
                "method": m,
                "placement": place,
                "epsilon": eps,
                "mean": mean,
                "std": sd,
                "seeds": len(rs),
            }
            if all("nonprivate_accuracy" in r for r in rs):
                item["nonprivate_mean"] = _mean_std([r["nonprivate_accuracy"] for r in rs])[0]
            delivered = {float(r["epsilon_reported"]) for r in rs if "epsilon_reported" in r}
            if len(delivered) == 1 and all("epsilon_reported" in r for r in rs):
                # the guarantee the runs delivered beside the epsilon asked (dropouts, sampling change it)
                item["epsilon_reported"] = delivered.pop()
            values.append(item)
        accuracy = {"measured_on": measured_on, "chance": chance, "values": values}
    # per variant (method, placement, rounds): a mean over records of a masked and a local release, or of
    # one round and of five, would be the upload of none of them
    ups: dict[tuple, list[float]] = {}
    for r in rows:
        if _number(r.get("upload_bytes")):
            n = r.get("rounds")
            key = (str(r.get("method")), str(r.get("placement")), int(n) if is_integer(n) and n > 0 else 1)
            ups.setdefault(key, []).append(float(r["upload_bytes"]))
    by_variant = [
        {"method": m, "placement": p, "rounds": n, "upload_per_client": sum(v) / len(v)}
        for (m, p, n), v in sorted(ups.items())
    ]
    bytes_ = {
        "upload_per_client": max((b["upload_per_client"] for b in by_variant), default=None),
        "what": "the most bytes one client uploads in a run of this sweep (by_variant: each method, "
        "placement and number of rounds, mean over its records)",
        "by_variant": by_variant,
        **({"wire": dict(wire)} if wire else {}),
    }
    rec = {
        "schema": SCHEMA,
        "command": command,
        "command_line": command_line,
        "complete": bool(complete),
        "config": dict(config),
        "data": dict(data),
        "guarantees": guarantees,
        "accuracy": accuracy,
        "bytes": bytes_,
        "timing": dict(timing),
        "versions": versions(),
        "records": rows,
        "summary": [dict(s) for s in summary],
        "warnings": list(warnings),
        **(dict(extra) if extra else {}),
    }
    rec = json.loads(json_text(rec))  # plain JSON data: what is written is what a reader gets back
    # what write_record would refuse after the run is refused now (a partial record is no finished run)
    return check_record(rec, where) if complete else rec


def write_record(folder: Any, record: Mapping[str, Any], name: str = "results.json") -> None:
    """Write ``record`` into a :class:`~privfed.results.writer.ResultFolder` (atomically), checked first."""
    check_record(dict(record), name)
    text = json_text(record)
    folder.write(name, lambda p: p.write_text(text))


def data_rules(
    dataset: Any,
    *,
    clients: int,
    partition: str,
    alpha: float,
    seeds: Sequence[int],
    clients_of=None,
) -> dict[str, Any]:
    """The run's data defaults in words and counts: the test split, the partition rule, what it leaves unused.

    ``dataset`` is a :class:`privfed.data.FeatureDataset`; ``clients_of(labels, seed)`` returns the
    client of every training sample (-1: unused) for a partition other than
    :func:`privfed.federation.partition` (the attacks' class groups).  Printed in every
    command's header (``data:``) and written into its record, so no default is silent.
    """
    import numpy as np

    meta = getattr(dataset, "meta", None) or {}
    n = int(np.asarray(dataset.train_labels).shape[0])
    n_test = (
        int(np.asarray(dataset.test_labels).shape[0])
        if getattr(dataset, "test_labels", None) is not None
        else 0
    )
    if "test_split" in meta:
        test = meta["test_split"]
    elif dataset.name == "digits":
        split = meta.get("split", {})
        test = (
            f"{split.get('test', n_test)} test images held out (20 % of digits, stratified, seed "
            f"{meta.get('seed', 0)}); {split.get('public', '?')} public images train the backbone"
        )
    else:
        test = "the dataset's own test split"
    seed = int(seeds[0]) if len(seeds) else 0
    if clients_of is not None:
        k, rule = clients_of(dataset.train_labels, seed)
    else:
        from privfed.federation import partition as make_partition

        natural = getattr(dataset, "train_clients", None) if partition == "natural" else None
        part = make_partition(
            dataset.train_labels, clients, partition, alpha=alpha, rng=seed, natural=natural
        )
        k = part.clients
        if partition == "natural" and part.num_clients != clients:  # the file's split sets K, not --clients
            clients = part.num_clients
            rule_natural = (
                f"natural (the file's own clients array, {clients} clients; --clients does not apply)"
            )
        else:
            rule_natural = "natural (the file's own clients array)"
        rule = {
            "dirichlet": f"dirichlet alpha {alpha:g} (FedNCM/FedCOF: each client gets floor(N/K) = {n // max(clients, 1)} samples)",
            "dirichlet-class": f"dirichlet-class alpha {alpha:g}",
            "natural": rule_natural,
        }.get(partition, partition)
        if getattr(dataset, "train_clients", None) is not None and partition != "natural":
            rule += "; the file's clients array is NOT used (pass --partition natural to use it)"
    k = np.asarray(k)
    used = int(np.count_nonzero(k >= 0))
    if clients_of is not None:  # the attacks' class groups: the groups the labels allowed are its clients
        clients = int(k.max()) + 1 if used else 0
    # what the partition of the first seed leaves thin, stated rather than hidden: clients without a sample
    # or with one, and classes no used sample trains (the head never learns them)
    sizes = np.bincount(k[k >= 0], minlength=int(clients)) if used else np.zeros(int(clients), int)
    labels = np.asarray(dataset.train_labels)
    untrained = sorted(set(np.unique(labels).tolist()) - set(np.unique(labels[k >= 0]).tolist()))
    return {
        "dataset": dataset.name,
        "test_split": test,
        "test_samples": n_test,
        "partition": rule,
        "clients": int(clients),
        "seeds": [int(s) for s in seeds],
        "train_samples": n,
        "used_samples": used,
        "unused_samples": n - used,
        "empty_clients": int(np.count_nonzero(sizes == 0)),
        "single_sample_clients": int(np.count_nonzero(sizes == 1)),
        "untrained_classes": [int(c) for c in untrained],
    }
