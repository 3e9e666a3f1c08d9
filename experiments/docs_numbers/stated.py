"""Numbers the pages may state outside the blocks: inputs, versions and constants checked against the code."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from experiments.docs_numbers.sources import ROOT, committed, digits_dataset

#: A number that looks measured: a decimal, or a number with a unit of size, time, ratio or share.
_MEASURED = re.compile(
    r"(?<![\w.^-])\d+(?:,\d{3})*(?:\.\d+)?(?:\s?(?:%|×|x\b|dB\b|ms\b|s\b|min\b|kB\b|KB\b|MB\b|GB\b|GiB\b|MiB\b))"
    r"|(?<![\w.^-])\d+\.\d+(?![\w.])"
)


#: Numbers the README may state outside the blocks: inputs, versions and constants, never results.
#: Each maps to why it is not a measurement; a constant maps to (why, a check against the code), and
#: tests/docs/test_readme.py runs every check.
def _weights_kb() -> bool:
    return round((ROOT / "privfed" / "data" / "digits_cnn_seed0.npz").stat().st_size / 1000) == 152


def _ray_inline() -> bool:
    from privfed.flower.runtime_env import RAY_INLINE_BYTES

    return RAY_INLINE_BYTES == 4 * 2**20


def _dense_limit() -> bool:
    import privfed.stats

    return (
        "PRIVFED_DENSE_VIEW_LIMIT" in __import__("os").environ or privfed.stats.DENSE_VIEW_LIMIT == 2 * 2**30
    )


def _npz_limit() -> bool:
    from privfed.data import npzfile

    return npzfile.DEFAULT_MAX_BYTES == 2**30


def _checkpoint() -> bool:
    from privfed.commands import attack, tradeoff

    return tradeoff.CHECKPOINT_S == attack.CHECKPOINT_S == 30.0


def _inat_dense_gib() -> bool:  # (K, C, d) float64 class sums at the iNat-120K shape
    return round(9275 * 1203 * 1280 * 8 / 2**30) == 106


def _paper_upload() -> bool:  # the FedCOF paper's App. H figures, reproduced by the byte model
    from tests.methods.test_upload import INAT, mb

    return round(mb("fedncm", **INAT), 1) == 279.5 and round(mb("fed3r", **INAT), 1) == 61064.1


def _scale_cap() -> bool:
    from tests.release import test_scale

    return (
        test_scale.CAP == 160 * 2**20
        and round(8 * test_scale.K * test_scale.C * test_scale.D / 1e9, 2) == 1.23
    )


def _claimed_mu() -> bool:  # the audits' claim at eps = 4, delta = 1e-5
    from mechanisms.dp.calibration import gdp_mu

    return f"{gdp_mu(4.0, 1e-5):.3f}" == "0.925"


def _sampled_claim() -> bool:  # the audit sweep's claimed eps with Poisson sampling at q = 0.25
    res = committed("experiments", "audit_sweep_results.json")
    claims = {
        f"{r['claimed_eps']:.3f}"
        for r in res["rows"]
        if "sampled" in r["configuration"]
        and r.get("claimed_eps") is not None
        and r["verdict"] == "statistical"
    }
    return claims == {"3.997"} and res["sampling"] == 0.25


@functools.cache
def _fedlog_small_features() -> bool:  # the reliability bullet: FedLog on digits features x 1e-3
    import privfed
    from privfed.federation import partition

    ds = digits_dataset()
    F, y, k = partition(ds.train_labels, 100, "dirichlet", alpha=0.1, rng=0).apply(
        ds.train_features, ds.train_labels
    )
    small = privfed.fit("fedlog", F * 1e-3, y, k).score(ds.test_features * 1e-3, ds.test_labels)
    auto = privfed.fit("fedlog", F * 1e-3, y, k, feature_scale="auto").score(
        ds.test_features * 1e-3, ds.test_labels
    )
    return f"{small:.3f}" == "0.100" and f"{auto:.3f}" == "0.955"


def _flower_timeout() -> bool:  # the Flower command's default stage timeout: base + per node
    from privfed.commands.flower import TIMEOUT_BASE_S, TIMEOUT_PER_NODE_S

    return TIMEOUT_BASE_S == 120.0 and TIMEOUT_PER_NODE_S == 10.0


def _test_fraction() -> bool:  # the held-out share of digits and of a feature file without test arrays
    from privfed.data import digits, npzfile

    return digits.TEST_FRACTION == npzfile.DEFAULT_TEST_FRACTION == 0.2


STATED: dict[str, object] = {
    "20 %": ("the held-out test fraction", _test_fraction),
    "20%": ("the held-out test fraction", _test_fraction),
    "120 s": ("the Flower command's base stage timeout", _flower_timeout, "by default 120 s plus 10 s per"),
    "10 s": (
        "the Flower command's stage timeout per node",
        _flower_timeout,
        "by default 120 s plus 10 s per",
    ),
    "1.41": "pinned flwr (1.41.0)",
    "0.925": ("the claimed mu of the audits at eps = 4", _claimed_mu, "μ = 0.925"),
    "3.997": ("the audit sweep's claimed eps with client sampling", _sampled_claim, "claimed ε = 3.997"),
    "0.25": "the audit sweep's sampling rate (an input)",
    "0.100": ("FedLog on features x 1e-3", _fedlog_small_features, "accuracy 0.100, or 0.955"),
    "0.955": (
        "FedLog on features x 1e-3 with feature_scale='auto'",
        _fedlog_small_features,
        "accuracy 0.100, or 0.955",
    ),
    "1%": "a false-positive rate (an input)",
    "2KB": "a formula (2 K B)",
    "8×": "the digits' image size",
    "40 dB": "the PSNR cap (an input of the metric)",
    "3.11": "Python version",
    "3.10": "minimum Python (pyproject requires-python)",
    "2.14.1": "pinned torch",
    "0.29.1": "pinned torchvision",
    "1.41.0": "pinned flwr",
    "25.0": "pinned packaging",
    "2.1": "minimum torch",
    "0.05": "an input eps",
    "0.1": "an input eps / Dirichlet alpha",
    "0.2": "an input eps",
    "0.3": "Dirichlet alpha",
    "0.5": "an input eps / alpha / chance level",
    "0.9": "an input eps",
    "1.0": "an input eps",
    "2.0": "an input eps",
    "0.01": "the FedLog paper's delta",
    "2.5": "an invalid input in an example",
    "3.7": "an invalid input in an example",
    "4.5": "a section number of the FedLog paper",
    "3.1": "a theorem number of the FedLog paper",
    "152 KB": ("the shipped weights' size", _weights_kb),
    "2 GiB": ("privfed.stats.DENSE_VIEW_LIMIT", _dense_limit),
    "4 MiB": ("privfed.flower.runtime_env.RAY_INLINE_BYTES", _ray_inline, "Ray's inline limit to 4 MiB"),
    "1 GiB": ("privfed.data.npzfile.DEFAULT_MAX_BYTES", _npz_limit),
    "30 s": ("the commands' checkpoint interval", _checkpoint),
    "106 GiB": ("(K, C, d) float64 at the iNat-120K shape", _inat_dense_gib),
    "279.5 MB": ("the FedCOF paper's figure, reproduced", _paper_upload),
    "61,064.1 MB": ("the FedCOF paper's figure, reproduced", _paper_upload),
    "160 MB": ("tests/release/test_scale.py's memory cap", _scale_cap),
    "1.23 GB": ("tests/release/test_scale.py's dense class sums", _scale_cap),
    "64 ×": "digits' feature width (d × d)",
    "2 ×": "the memory target's factor",
}


def stated_checks() -> dict[str, Callable[[], bool]]:
    """The constants the README states, each with its check against the code."""
    return {tok: v[1] for tok, v in STATED.items() if isinstance(v, tuple)}


def outside_blocks(readme: str) -> list[tuple[int, str, str]]:
    """(line number, token, line) for every measured-looking number outside the blocks and code fences."""
    found = []
    in_block = in_fence = False
    for i, line in enumerate(readme.splitlines(), 1):
        if line.startswith("<!-- readme-numbers:"):
            in_block = True
            continue
        if line.startswith("<!-- /readme-numbers:"):
            in_block = False
            continue
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_block or in_fence:
            continue
        for m in _MEASURED.finditer(line.replace("`", " ")):
            found.append((i, m.group(0), line))
    return found


def unexplained(readme: str, stated: dict[str, str] | None = None) -> list[str]:
    """Numbers outside the blocks that are neither generated nor stated inputs/constants."""
    stated = STATED if stated is None else stated

    def ok(tok: str, line: str) -> bool:
        v = stated.get(tok)
        if v is None:
            return False
        return not (
            isinstance(v, tuple) and len(v) > 2 and v[2] not in line
        )  # a constant only where it is stated

    return [
        f"line {i}: {tok!r} in {line.strip()[:100]!r}"
        for i, tok, line in outside_blocks(readme)
        if not ok(tok, line)
    ]
