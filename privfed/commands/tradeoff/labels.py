"""A sweep row's words: where the noise went, its calibration, its noise and the repairs the method made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from privfed.commands.common import placement_word
from privfed.commands.tradeoff.config import PLACEMENT_LABEL, TradeoffConfig
from privfed.notes import repairs as note_repairs

__all__ = ["calibration_label", "noise_label", "placement_label", "repair_facts", "repairs_text"]


def placement_label(key: str, method: Any, report: Any) -> str:
    """Where the noise was added, as the report states it (or as the settings imply)."""
    derived = "local" if key == "trusted" and getattr(method, "per_client", False) else PLACEMENT_LABEL[key]
    return placement_word(getattr(report, "placement", None), derived)


def calibration_label(cfg: TradeoffConfig, report: Any) -> str:
    if cfg.count_noise in ("laplace", "geometric"):
        return "pure"
    if cfg.count_noise == "uniform":
        return "none (no DP)"
    if cfg.count_noise == "gaussian":
        return "analytic"
    cal = str(getattr(report, "calibration", "") or cfg.calibration)
    return cal if cal in ("analytic", "classic") else cfg.calibration


def noise_label(cfg: TradeoffConfig, report: Any, eps: float) -> str:
    sig = getattr(report, "sigma", {}) or {}
    if cfg.count_noise == "laplace":
        return f"counts: Laplace b={1 / eps:.4g}"
    if cfg.count_noise == "geometric":
        return f"counts: geometric p=exp(-{eps:g})"
    if cfg.count_noise == "uniform":
        return f"counts: U(+-{1 - eps:.3g} n)"
    if cfg.count_noise == "gaussian":
        return f"counts: sigma={sig.get('counts', float('nan')):.4g}"
    return f"sigma {sig.get('sums', float('nan')):.4g} / {sig.get('counts', float('nan')):.4g}"


def repair_facts(notes: Sequence[str]) -> tuple[int | None, list[str]]:
    """What a method (or a count-noise rule) did to noisy statistics: (pairs dropped, other repairs).

    Read from the facts the notes carry (:class:`privfed.notes.Note`), never from their text.
    """
    return note_repairs(notes)


def repairs_text(pairs: float | None, kinds: Sequence[str]) -> str:
    parts = [f"{pairs:.4g} pairs dropped"] if pairs else []
    return ", ".join([*parts, *kinds])
