"""Shared set-up of the attack experiments: digits features, public data, CSV/plot helpers."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np


def load_digits(seed: int = 0) -> dict:
    """Private / test / public digits through the public-trained backbone (cached)."""
    import torch

    from attacks.view import PublicData
    from privfed.data.digits import digits_splits, extract_features, get_backbone

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    sp = digits_splits(seed)
    bb = get_backbone(seed=seed)
    Fpub = extract_features(bb, sp.public_images)
    return {
        "Fp": extract_features(bb, sp.private_images),
        "yp": np.asarray(sp.private_labels),
        "imp": np.asarray(sp.private_images),
        "Ft": extract_features(bb, sp.test_images),
        "yt": np.asarray(sp.test_labels),
        "backbone": bb,
        "public": PublicData(labels=sp.public_labels, features=Fpub, images=sp.public_images),
        "clip": float(np.median(np.linalg.norm(Fpub, axis=1))),
    }


def scenario(d: dict, method: str, clients, **kw):
    import attacks

    return attacks.scenario(
        method,
        d["Fp"],
        d["yp"],
        clients,
        images=d["imp"],
        holdout_features=d["Ft"],
        holdout_labels=d["yt"],
        public=d["public"],
        backbone=d["backbone"],
        **kw,
    )


def write_rows(out: Path, name: str, rows: list[dict], config: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with open(out / f"{name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    (out / f"{name}.json").write_text(json.dumps({"config": config, "rows": rows}, indent=2, default=str))


def markdown(rows: list[dict], cols: list[str], spec: str = ".3f") -> str:
    """A markdown table of ``rows`` with columns ``cols``; floats formatted with ``spec``, missing cells empty."""

    def fmt(v):
        return format(v, spec) if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
