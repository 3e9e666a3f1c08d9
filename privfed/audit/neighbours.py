"""Worst-case neighbouring datasets for the black-box audit (keyword arguments of ``privfed.fit``).

:func:`neighbour_battery` builds the pairs every configuration is audited on (canaries far outside
any clip, a class or client whose only record is the canary, a record that changes chunking, a
whole client at client level); :func:`edge_battery` the rare pairs where a release could differ
deterministically (an empty dataset, a label beyond the data-derived number of classes, a clip or a
record norm near the float range).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Neighbours", "edge_battery", "neighbour_battery"]


@dataclass(frozen=True)
class Neighbours:
    """Two datasets that differ by one unit of the neighbouring relation (``fit`` keyword arguments)."""

    name: str
    d0: dict
    d1: dict


def neighbour_battery(
    level: str = "record",
    *,
    seed: int = 0,
    dim: int = 4,
    num_classes: int = 3,
    num_clients: int = 4,
    per_client: int = 9,
    canary: float = 100.0,
    max_records: int = 20,
    oversized: bool = False,
) -> list[Neighbours]:
    """Worst-case neighbour pairs for ``level`` (``"record"`` or ``"client"``).

    Record level: canaries far outside any clip in several classes and
    directions (class 0 along e1, class 1 along e2, class 2 along -e_d,
    class 1 along the diagonal, which moves every off-diagonal entry of a
    second moment), in a
    class its client lacked, a client's only record, a class's only record,
    and a record that changes how a class would be cut into chunks.  Client
    level: one client's whole data against none (the client still takes part:
    the client set is public), and a client holding ``max_records`` canaries
    of one class along e1 against none (it moves the sums and counts by
    exactly the client-level sensitivity).  ``oversized=True`` adds, at client
    level, a client holding 3 ``max_records`` canaries against none: its
    statistics (second moments included) must be bounded before any sum,
    whatever the protection.
    ``num_classes`` and ``num_clients`` are passed as public parameters.
    """
    rng = np.random.default_rng(seed)
    C, K, d = int(num_classes), int(num_clients), int(dim)
    n = K * per_client
    y = np.arange(n) % C
    k = (np.arange(n) // C) % K
    F = rng.normal(size=(n, d))
    # Client 0 lacks the last class; class C-1 exists elsewhere.
    drop = (k == 0) & (y == C - 1)
    F, y, k = F[~drop], y[~drop], k[~drop]
    pub = {"num_classes": C, "num_clients": K}

    def ds(F_, y_, k_):
        return {"features": F_, "labels": y_, "clients": k_, **pub}

    def e(j, sign=1.0):
        v = np.zeros(d)
        v[j % d] = sign * canary
        return v

    def add(rec, cls, cl):
        return ds(np.vstack([F, rec]), np.append(y, cls), np.append(k, cl))

    base = ds(F, y, k)
    if level == "client":
        keep = k != K - 1
        whole = Neighbours("whole client (zero-out)", ds(F[keep], y[keep], k[keep]), base)
        m = int(max_records)
        cans = np.tile(e(0), (m, 1))
        canary_client = Neighbours(
            f"client of {m} canaries (zero-out)",
            ds(F[keep], y[keep], k[keep]),
            ds(
                np.vstack([F[keep], cans]),
                np.append(y[keep], np.zeros(m, int)),
                np.append(k[keep], np.full(m, K - 1)),
            ),
        )
        out = [whole, canary_client]
        if oversized:
            big = np.tile(e(0), (3 * m, 1))
            out.append(
                Neighbours(
                    f"client of {3 * m} canaries, over max_records (zero-out)",
                    ds(F[keep], y[keep], k[keep]),
                    ds(
                        np.vstack([F[keep], big]),
                        np.append(y[keep], np.zeros(3 * m, int)),
                        np.append(k[keep], np.full(3 * m, K - 1)),
                    ),
                )
            )
        return out
    pairs = [
        Neighbours("canary class 0 along e1", base, add(e(0), 0, 1)),
        Neighbours("canary class 1 along e2", base, add(e(1), 1 % C, 2 % K)),
        Neighbours(f"canary class {C - 1} along -e{d}", base, add(e(d - 1, -1.0), C - 1, 1)),
        Neighbours("canary in a class its client lacked", base, add(e(1), C - 1, 0)),
        Neighbours("canary class 1 along (1, ..., 1)", base, add(np.full(d, canary), 1 % C, 3 % K)),
    ]
    # A client's only record: client K-2 holds one record in D1 and none in D0.
    solo = k != K - 2
    pairs.append(
        Neighbours(
            "a client's only record",
            ds(F[solo], y[solo], k[solo]),
            ds(np.vstack([F[solo], e(2)]), np.append(y[solo], 0), np.append(k[solo], K - 2)),
        )
    )
    # A class's only record: class C-1 absent in D0.
    nolast = y != C - 1
    pairs.append(
        Neighbours(
            "a class's only record",
            ds(F[nolast], y[nolast], k[nolast]),
            ds(np.vstack([F[nolast], e(0)]), np.append(y[nolast], C - 1), np.append(k[nolast], 1)),
        )
    )
    # A record that changes chunking: client 1's class 0 goes from 3 to 4 records (min(M, n // 2) chunks).
    sel = np.flatnonzero((k == 1) & (y == 0))
    keep = np.ones(y.size, bool)
    keep[sel[3:]] = False
    three = ds(F[keep], y[keep], k[keep])
    four = ds(np.vstack([F[keep], F[sel[0]]]), np.append(y[keep], 0), np.append(k[keep], 1))
    pairs.append(Neighbours("a record that changes chunking", three, four))
    return pairs


def edge_battery(
    *,
    dim: int = 4,
    num_classes: int = 3,
    num_clients: int = 2,
    huge: float = 1e155,
    public_sizes: bool = True,
) -> list[Neighbours]:
    """Rare neighbour pairs where a release could differ deterministically between neighbours.

    * an empty dataset against one record;
    * a record whose label is beyond the largest label of the rest, with ``num_classes`` left to the
      data (``public_sizes=False``: the number of classes then changes with the record);
    * a record of norm ``huge`` (default 1e155, whose squared norm overflows float64) against none.

    With ``public_sizes`` (default) ``num_classes`` and ``num_clients`` are passed, as a private
    release should; the label pair drops them whatever ``public_sizes`` says.
    """
    rng = np.random.default_rng(7)
    C, K, d = int(num_classes), int(num_clients), int(dim)
    n = 4 * C * K
    y = np.arange(n) % C
    k = np.arange(n) % K
    F = rng.normal(size=(n, d))
    pub = {"num_classes": C, "num_clients": K} if public_sizes else {}

    def ds(F_, y_, k_, **extra):
        return {"features": F_, "labels": y_, "clients": k_, **pub, **extra}

    one = np.ones((1, d))
    big = np.zeros(d)
    big[0] = huge
    low = y < C - 1  # labels 0..C-2 only: a data-derived C is C - 1 without the record of class C - 1
    return [
        Neighbours(
            "empty dataset against one record",
            {
                "features": np.zeros((0, d)),
                "labels": np.zeros(0, int),
                "clients": np.zeros(0, int),
                "num_classes": C,
                "num_clients": K,
            },
            {
                "features": one,
                "labels": np.zeros(1, int),
                "clients": np.zeros(1, int),
                "num_classes": C,
                "num_clients": K,
            },
        ),
        Neighbours(
            "a label beyond the others with a data-derived num_classes",
            {"features": F[low], "labels": y[low], "clients": k[low], "num_clients": K},
            {
                "features": np.vstack([F[low], one]),
                "labels": np.append(y[low], C - 1),
                "clients": np.append(k[low], 0),
                "num_clients": K,
            },
        ),
        Neighbours(
            f"a record of norm {huge:g} (its squared norm overflows)",
            ds(F, y, k),
            ds(np.vstack([F, big]), np.append(y, 0), np.append(k, 0)),
        ),
    ]
