"""A sweep's records as data and text: the CSV columns, the summary over seeds and the console table.

One table for one-shot and multi-round (``--rounds``) runs alike: the same
columns (accuracy on the test set, the non-private accuracy beside it, what
one client uploads), the below-chance note, and the guarantees condensed:
one line per distinct guarantee sentence (its epsilon and delta those of
each row's columns), the rows naming theirs (G1, G2, ...).
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privfed.commands.common import data_line
from privfed.commands.tradeoff.attack_columns import ATTACK_HEADLINE, STRONGEST_ATTACKS
from privfed.commands.tradeoff.config import PLACEMENT_LABEL
from privfed.commands.tradeoff.labels import repairs_text

__all__ = [
    "RECORD_KEYS",
    "TABLE_LEGEND",
    "below_chance_line",
    "condense_guarantees",
    "data_line",
    "format_table",
    "guarantee_lines",
    "headline_keys",
    "record_fields",
    "summarise",
    "write_csv",
]

#: CSV / JSON record keys, in order.
RECORD_KEYS = (
    "method",
    "placement",
    "protocol",
    "mechanism",
    "level",
    "epsilon",
    "epsilon_reported",
    "delta",
    "calibration",
    "private",
    "protects",
    "seed",
    "rounds",
    "accuracy",
    "nonprivate_accuracy",
    "sigma",
    "sigma_counts",
    "noise",
    "clip",
    "count_noise",
    "secure_agg",
    "upload_bytes",
    "guarantee",
    "pairs_dropped",
    "repairs",
    "notes",
)


# ---------------------------------------------------------------- outputs
def _mean(values) -> float:
    a = np.array([float(v) for v in values], dtype=float)
    if a.size and (np.isfinite(a).all() or np.all(a == a[0])):  # every seed's inf (no noise) is inf, not NaN
        return float(a.mean())
    return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (method, placement, epsilon)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(
            (r["method"], int(r.get("rounds", 1) or 1), r.get("placement", ""), r["epsilon"]), []
        ).append(r)
    out = []
    morder = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in records))}
    porder = {label: i for i, label in enumerate(["none", *PLACEMENT_LABEL.values()])}
    for (m, rounds, place, eps), rs in sorted(
        groups.items(),
        key=lambda kv: (
            morder[kv[0][0]],
            -kv[0][1],
            not math.isfinite(kv[0][3]),
            porder.get(kv[0][2], 9),
            float(kv[0][3]),
        ),
    ):
        acc = np.array([r["accuracy"] for r in rs])
        acc0 = np.array([r["nonprivate_accuracy"] for r in rs])
        pairs = [r["pairs_dropped"] for r in rs if np.isfinite(r.get("pairs_dropped", np.nan))]
        kinds = list(
            dict.fromkeys(k for r in rs for k in str(r.get("repair_kinds", "") or "").split("; ") if k)
        )
        rep = repairs_text(float(np.mean(pairs)) if pairs else None, kinds)
        out.append(
            dict(
                method=m,
                placement=place,
                protocol=rs[0].get("protocol", rs[0].get("secure_agg", "none")),
                epsilon=eps,
                epsilon_reported=_mean(r.get("epsilon_reported", eps) for r in rs),
                private=bool(rs[0].get("private", math.isfinite(eps))),
                # what the release's guarantee covers: nothing in a run without one (its records carry none)
                protects=rs[0].get("protects", ""),
                seeds=len(rs),
                accuracy_mean=float(acc.mean()),
                accuracy_std=float(acc.std(ddof=1)) if len(rs) > 1 else 0.0,
                nonprivate_mean=float(acc0.mean()),
                nonprivate_std=float(acc0.std(ddof=1)) if len(rs) > 1 else 0.0,
                delta=rs[0]["delta"],
                sigma=rs[0]["sigma"],
                sigma_counts=rs[0]["sigma_counts"],
                noise=rs[0].get("noise", ""),
                calibration=rs[0]["calibration"],
                level=rs[0]["level"],
                rounds=rounds,
                mechanism=rs[0]["mechanism"],
                count_noise=rs[0].get("count_noise"),
                upload_bytes=float(np.mean([r["upload_bytes"] for r in rs])),
                guarantee=rs[0]["guarantee"],
                repairs=rep,
                pairs_dropped=float(np.mean(pairs)) if pairs else float("nan"),
                **{
                    k: float(np.nanmean([r.get(k, np.nan) for r in rs]))
                    if not all(np.isnan(r.get(k, np.nan)) for r in rs)
                    else float("nan")
                    for k in headline_keys(rs)
                },
                **(
                    {"personalised_mean": _mean(r["personalised_accuracy"] for r in rs)}
                    if all("personalised_accuracy" in r for r in rs)
                    else {}
                ),
                **{
                    f"attack_{a}_strongest": "/".join(
                        dict.fromkeys(str(r[f"attack_{a}_strongest"]) for r in rs)
                    )
                    for a in STRONGEST_ATTACKS
                    if any(f"attack_{a}_strongest" in r for r in rs)
                },
            )
        )
    return out


#: The multi-round run's attack on the sequence of its releases (privfed.rounds' observer): its AUC column.
SEQUENCE_ATTACK = "attack_sequence_auc"


def headline_keys(rows: list[dict[str, Any]]) -> list[str]:
    keys = {k for r in rows for k in r}
    out = [f"attack_{a}_{m}" for a, m in ATTACK_HEADLINE.items() if f"attack_{a}_{m}" in keys]
    return out + ([SEQUENCE_ATTACK] if SEQUENCE_ATTACK in keys else [])


def _eps_cell(s: dict[str, Any]) -> str:
    if not math.isfinite(s["epsilon"]):
        return "inf"
    if not s.get("private", True):
        rep = s.get("epsilon_reported", math.inf)
        if isinstance(rep, float) and math.isfinite(rep) and "counts" in str(s.get("protects", "")):
            return f"{s['epsilon']:g} (counts only)"  # the means go in clear: no guarantee for the release
        return f"NO DP ({s['epsilon']:g})"
    from mechanisms.dp.ledger import format_up

    rep = s.get("epsilon_reported", s["epsilon"])
    if isinstance(rep, float) and math.isfinite(rep) and format_up(rep) != f"{s['epsilon']:g}":
        return f"{format_up(rep)} (asked {s['epsilon']:g})"  # rounded up: never below the ledger's epsilon
    return f"{s['epsilon']:g}"


TABLE_LEGEND = (
    "placement: where the noise is added (local = each client; secure sum = shares under secure aggregation; "
    "trusted aggregator = the server, once)\n"
    "eps: computed by the ledger ('asked' when the calibration gives another); delta 0 = pure DP; "
    "NO DP = a heuristic without a guarantee (its nominal parameter in brackets); counts only = count noise, "
    "the means in clear: no guarantee for the release as a whole\n"
    "noise: Gaussian sigma on sums / counts, or the count-noise law; repairs: what the method did to noisy "
    "statistics; guarantee: the line under the table that the row's release carries; --help lists every column"
)


def _acc(mean: float, std: float, seeds: int) -> str:
    return f"{mean:.4f} ± {std:.4f}" if seeds > 1 else f"{mean:.4f}"


def format_table(summary: list[dict[str, Any]], guarantee_ids: Sequence[str] | None = None) -> str:
    """The console table: one row per method x rounds x placement x eps (mean ± std over seeds).

    ``guarantee_ids`` (from :func:`condense_guarantees`) adds the column naming each row's guarantee.
    """
    show_rounds = any(s["rounds"] != 1 for s in summary)
    show_pers = any("personalised_mean" in s for s in summary)
    head = [
        "method",
        *(["rounds"] if show_rounds else []),
        "placement",
        "protocol",
        "eps",
        "accuracy",
        *(["personalised"] if show_pers else []),
        "non-private",
        "delta",
        "noise",
        "calibration",
        "level",
        "repairs",
        "bytes/client",
        *(["guarantee"] if guarantee_ids is not None else []),
    ]
    rows = []
    for i, s in enumerate(summary):
        noised = math.isfinite(s["epsilon"])
        rep = s.get("epsilon_reported", s["epsilon"])
        bounded = noised and (s.get("private", True) or (isinstance(rep, float) and math.isfinite(rep)))
        rows.append(
            [
                s["method"],
                *([str(s["rounds"])] if show_rounds else []),
                s.get("placement", ""),
                s.get("protocol", ""),
                _eps_cell(s),
                _acc(s["accuracy_mean"], s["accuracy_std"], s["seeds"]),
                *(
                    [f"{s['personalised_mean']:.4f}" if "personalised_mean" in s else "-"]
                    if show_pers
                    else []
                ),
                _acc(s["nonprivate_mean"], s["nonprivate_std"], s["seeds"]),
                f"{s['delta']:g}" if bounded else "-",
                (s.get("noise") or "-") if noised else "none",
                s["calibration"] if noised else "-",
                s["level"] if noised else "-",
                s.get("repairs") or "-",
                f"{s['upload_bytes']:,.0f}",
                *([guarantee_ids[i]] if guarantee_ids is not None else []),
            ]
        )
    att = headline_keys(summary)
    if att:
        label = {
            **{
                f"attack_{a}_{m}": f"{a} {m}" + (" (strongest)" if a in STRONGEST_ATTACKS else "")
                for a, m in ATTACK_HEADLINE.items()
            },
            SEQUENCE_ATTACK: "attack AUC (all rounds)",
        }
        head = [*head, *(label[k] for k in att)]
        fmt = lambda v: "-" if not np.isfinite(v) else f"{v:.3f}"  # noqa: E731

        def name(s: dict, k: str) -> str:
            a = k.split("_")[1]
            return f" {s[f'attack_{a}_strongest']}" if s.get(f"attack_{a}_strongest") else ""

        rows = [[*r, *(fmt(s.get(k, float("nan"))) + name(s, k) for k in att)] for r, s in zip(rows, summary)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


#: "(eps, delta)-DP" in a guarantee sentence, where the table's eps and delta columns say the same.
_BUDGET = re.compile(r"\((?P<eps>[0-9.eE+-]+), (?P<delta>[0-9.eE+-]+)\)-DP")


def _template(s: dict[str, Any]) -> str:
    """The row's guarantee with its (eps, delta) written (ε, δ) when they are exactly the row's columns."""
    text = str(s.get("guarantee", ""))
    m = _BUDGET.search(text)
    if not m or not s.get("private", True):
        return text
    try:
        eps, delta = float(m["eps"]), float(m["delta"])
    except ValueError:
        return text
    if eps != _eps_number(s) or delta != float(s["delta"]):
        return text  # the sentence says something the columns do not: keep it whole
    return text[: m.start()] + "(ε, δ)-DP" + text[m.end() :]


def _eps_number(s: dict[str, Any]) -> float:
    """The number the eps column shows (the ledger's epsilon rounded up, or the asked one)."""
    cell = _eps_cell(s)
    return float(cell.split(" ")[0]) if cell not in ("inf",) and not cell.startswith("NO DP") else math.nan


def condense_guarantees(summary: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(the guarantee column of each summary row, the lines under the table): one line per distinct guarantee.

    A guarantee that differs between rows only by its (eps, delta), which the rows' eps and delta columns
    show, is printed once with (ε, δ) in their place; the rows name it (G1, G2, ...).  Rows without noise
    say ``none``.
    """
    ids: list[str] = []
    texts: dict[str, str] = {}
    for s in summary:
        if not math.isfinite(s["epsilon"]) or not s.get("guarantee"):
            ids.append("none")
            continue
        t = _template(s)
        if t not in texts:
            texts[t] = f"G{len(texts) + 1}"
        ids.append(texts[t])
    lines = []
    if texts:
        lines.append("guarantees (ε, δ: each row's eps and delta columns):")
        lines += [f"  {g}: {t}" for t, g in texts.items()]
    return ids, lines


def guarantee_lines(summary: list[dict[str, Any]], methods: Sequence[str] = ()) -> list[str]:
    """The lines under the table: one per distinct guarantee (see :func:`condense_guarantees`)."""
    return condense_guarantees(summary)[1]


def record_fields(records: list[dict[str, Any]]) -> list[str]:
    """CSV columns: the documented ones first, then any extra (attack metrics) sorted."""
    return [*RECORD_KEYS, *sorted({k for r in records for k in r} - set(RECORD_KEYS))]


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    """Write ``records`` as a CSV to ``path`` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.privfed-tmp")
    fields = record_fields(records)
    try:
        with tmp.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            for r in records:
                w.writerow({k: r.get(k, "") for k in fields})
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def below_chance_line(summary: list[dict[str, Any]], num_classes: int) -> str | None:
    """A note naming the rows whose mean accuracy is below chance (1/C), with the reason, or None."""
    chance = 1.0 / max(int(num_classes), 1)
    below = [s for s in summary if s["accuracy_mean"] < chance]
    if not below:
        return None

    def label(s: dict[str, Any]) -> str:
        return (
            s["method"]
            + (f" x{s['rounds']} rounds" if s.get("rounds", 1) != 1 else "")
            + f" {s['placement'] or 'none'} eps={s['epsilon']:g}"
        )

    def reason(s: dict[str, Any]) -> str:
        if s.get("seeds", 2) < 2:
            return (
                "one seed gives no spread to judge it by: at these budgets the noise may swamp the few records "
                "each client holds (run --seeds 5 to see the spread, or try a larger --eps)"
            )
        if s["private"] and s["accuracy_mean"] + s["accuracy_std"] >= chance:
            return (
                "chance lies within the spread over seeds: at these budgets the noise swamps the few records "
                "each client holds, so the head guesses"
            )
        return (
            "below chance beyond the spread over seeds: the head is worse than guessing (a failed fit or noise "
            "far above the signal); check the data and --param, or try a larger --eps"
        )

    groups: dict[str, list[str]] = {}  # each row under its own reason (a mixed list had one reason for all)
    for s in below:
        groups.setdefault(reason(s), []).append(label(s))
    parts = [f"{', '.join(rows)}: {why}" for why, rows in groups.items()]
    return f"note: below chance (1/{int(num_classes)} = {chance:.2g}) in " + "; in ".join(parts)
