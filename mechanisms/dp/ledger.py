"""Budget ledger: what each release did, and the report computed from it.

Following dp-accounting's separation of *what a mechanism does* (a frozen
event) from *how its cost is counted* (an accountant), every noisy release
appends one :class:`ReleaseEvent` per statistic block to a
:class:`PrivacyLedger`.  The (eps, delta) a :class:`PrivacyReport` states is
always recomputed from the ledger by :func:`mechanisms.dp.accounting.ledger_epsilon`,
never copied from the target the mechanism was calibrated for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from mechanisms.dp.calibration import as_real, check_rounds
from privfed._validation import is_integer
from privfed.errors import ConfigError

__all__ = ["NEIGHBOURING", "PrivacyLedger", "PrivacyReport", "ReleaseEvent", "format_up"]


def format_up(x: float, digits: int = 4) -> str:
    """``x`` printed with ``digits`` significant figures, rounded UP (towards +inf).

    A printed epsilon or delta must never be below the true one: ``f"{x:.4g}"``
    rounds to nearest (1.00005 prints as 1).  The rounding is done on the
    shortest decimal that reads back as ``x`` (``repr``), so the printed number
    is >= ``x`` up to the float's last bit, and a delta given as 1e-05 prints
    as 1e-05; a value within 1e-12 (relative) of a shorter decimal (the
    accountants' numerical resolution: 0.10000000000002274) prints as it.  ``inf``
    and ``nan`` print as ``inf`` / ``nan``; trailing zeros are dropped as
    ``%g`` does.
    """
    from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal

    x = float(x)
    if not math.isfinite(x) or x == 0:
        return format(x, "g")
    d = Decimal(repr(x))
    q = Decimal(1).scaleb(d.adjusted() - digits + 1)
    r = d.quantize(q, rounding=ROUND_CEILING)
    near = d.quantize(q, rounding=ROUND_HALF_EVEN)
    if abs(d - near) <= abs(d) * Decimal("1e-12"):  # within the accountants' numerical resolution
        r = near
    exp = r.adjusted()  # rounding up may carry into the next power of ten (9.9999 -> 10)
    if -4 <= exp < digits:
        text = format(r, "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    mant = (r.scaleb(-exp)).normalize()
    text = format(mant, "f")
    return f"{text}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"


#: Neighbouring relations the ledger understands.
NEIGHBOURING = {
    "record": "add or remove one record (sample) of one client",
    "client": (
        "replace one client's whole data by none (zero-out): the client still takes part (its statistics "
        "zeros, any share of distributed noise still added), so which clients take part is public"
    ),
}

#: Noise kinds and what ``scale`` means for each.
_KINDS = {
    "gaussian": "standard deviation sigma of N(0, sigma^2) per coordinate",
    "laplace": "scale b of Laplace(0, b) per coordinate",
    "geometric": "epsilon of the two-sided geometric P(k) ~ exp(-epsilon |k|)",
    "uniform": "half-width factor (1 - eps) of U(-(1 - eps) n, (1 - eps) n): no DP guarantee",
    "none": "no noise (epsilon = inf): no DP guarantee",
}


@dataclass(frozen=True)
class ReleaseEvent:
    """One noisy release of one statistic block.

    Parameters
    ----------
    mechanism : str
        ``gaussian``, ``laplace``, ``geometric``, ``uniform`` or ``none``.
    block : str
        The statistic (``sums``, ``counts``, ``second``).
    sensitivity : float
        L2 sensitivity (Gaussian) or L1 sensitivity (Laplace / geometric)
        under ``relation``.
    scale : float
        The noise parameter (see ``_KINDS``).
    relation : str
        ``record`` or ``client`` (:data:`NEIGHBOURING`).
    rounds : int
        How many times this identical release is made (composition).
    sampling_rate : float
        Poisson client-participation rate q of each round (1 = every round).
    release_id : int
        Blocks of one release share an id: they are sampled together and
        compose as one mechanism on the concatenated statistic.
    """

    mechanism: str
    block: str
    sensitivity: float
    scale: float
    relation: str = "record"
    rounds: int = 1
    sampling_rate: float = 1.0
    release_id: int = 0

    def __post_init__(self) -> None:
        if self.mechanism not in _KINDS:
            raise ConfigError(f"unknown noise mechanism {self.mechanism!r}; choose from {sorted(_KINDS)}")
        if self.relation not in NEIGHBOURING:
            raise ConfigError(f"relation must be one of {sorted(NEIGHBOURING)}, got {self.relation!r}")
        try:  # numbers, never strings or bools read as them
            for name in ("sensitivity", "scale", "sampling_rate"):
                object.__setattr__(self, name, as_real(getattr(self, name)))
        except (TypeError, ValueError):
            raise ConfigError(
                f"sensitivity, scale and sampling_rate must be numbers, got {self.sensitivity!r}, {self.scale!r}, "
                f"{self.sampling_rate!r}"
            ) from None
        if not (self.sensitivity >= 0 and self.scale >= 0):
            raise ConfigError(
                f"sensitivity and scale must be >= 0, got sensitivity={self.sensitivity}, scale={self.scale}"
            )
        if math.isinf(self.sensitivity) and math.isinf(self.scale):  # their ratio, the event's mu, is NaN
            raise ConfigError(
                "sensitivity and scale are both infinite: the event states no privacy loss at all"
            )
        if not is_integer(self.release_id):  # blocks group by it: "x" or 1.5 would group with nothing
            raise ConfigError(f"release_id must be an integer, got release_id={self.release_id!r}")
        object.__setattr__(self, "rounds", check_rounds(self.rounds))
        if not 0 < self.sampling_rate <= 1:
            raise ConfigError(f"sampling_rate must lie in (0, 1], got sampling_rate={self.sampling_rate}")

    @property
    def private(self) -> bool:
        """Whether the event carries a DP guarantee on its own."""
        if self.mechanism in ("uniform", "none"):
            return False
        return self.sensitivity == 0 or self.scale > 0

    @property
    def gdp_mu(self) -> float:
        """mu of one round of a Gaussian event (Delta / sigma)."""
        if self.mechanism != "gaussian":
            raise ConfigError(f"gdp_mu is defined for Gaussian events only, not {self.mechanism!r}")
        if self.sensitivity == 0:
            return 0.0
        return math.inf if self.scale == 0 else self.sensitivity / self.scale


class PrivacyLedger:
    """An append-only list of :class:`ReleaseEvent`."""

    def __init__(self) -> None:
        self.events: list[ReleaseEvent] = []
        self._next_id = 0

    def new_release(self) -> int:
        """A fresh release id (blocks released together share it)."""
        self._next_id += 1
        return self._next_id

    def record(self, event: ReleaseEvent) -> ReleaseEvent:
        self.events.append(event)
        return event

    def reset(self) -> None:
        """Forget every event (only for an independent, simulated repetition)."""
        self.events.clear()

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        return f"PrivacyLedger({len(self.events)} events)"


@dataclass(frozen=True)
class PrivacyReport:
    """What a release guarantees, computed from its ledger.

    Attributes
    ----------
    epsilon, delta : float
        The guarantee the accountant computed from the ledger (``inf`` when
        there is none).
    level : str
        ``record`` or ``client``.
    mechanism : str
        Name of the mechanism.
    calibration : str
        How sigma was chosen (``analytic``, ``classic``, ``accountant:...``).
    sigma : dict
        Noise scale per block.
    sensitivity : dict
        Sensitivity per block under the neighbouring relation.
    rounds : int
    sampling_rate : float
    accountant : str
        Which accountant computed ``epsilon``.
    guarantee : str
        One sentence: "(eps, delta)-DP at record level ..." or
        "NO DP GUARANTEE: ...".
    target_epsilon : float
        The epsilon the noise was calibrated for.
    notes : tuple of str
        Assumptions (trusted aggregator, noise split across clients, ...).
    placement : str
        Who added the noise in this run: ``local`` (each client, full noise),
        ``central`` (a trusted aggregator, on the sum), ``distributed``
        (clients' shares under secure aggregation), or ``none``.
    simulation : bool
        True when the noise came from a seed or a caller's Generator: the run
        is a reproducible simulation whose noise can be replayed, not a release.
    protects : str
        What the guarantee covers (``"all released statistics"``, or e.g.
        ``"class counts only"`` when other statistics are sent in clear).
    """

    epsilon: float
    delta: float
    level: str
    mechanism: str
    calibration: str
    sigma: dict
    sensitivity: dict
    rounds: int
    sampling_rate: float
    accountant: str
    guarantee: str
    target_epsilon: float = math.nan
    num_events: int = 0
    notes: tuple = field(default_factory=tuple)
    placement: str = "none"
    simulation: bool = False
    protects: str = "all released statistics"

    @property
    def is_private(self) -> bool:
        """Whether EVERY released statistic carries the stated (finite) guarantee."""
        return (
            not self.guarantee.startswith("NO DP GUARANTEE")
            and math.isfinite(self.epsilon)
            and self.protects == "all released statistics"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (inf/nan as strings)."""

        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return str(v)
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            return v

        return {k: clean(v) for k, v in asdict(self).items()}

    def __str__(self) -> str:
        return self.guarantee
