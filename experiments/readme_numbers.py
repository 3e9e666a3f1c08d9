"""Regenerate the numbers README.md quotes, and check or rewrite them.

Every block of numbers in the README that is cheap to compute lives between
two markers::

    <!-- readme-numbers:NAME tol=T -->
    ...generated text...
    <!-- /readme-numbers:NAME -->

and is produced by one function here (see :data:`BLOCKS`).  Results are
seeded and deterministic on one software stack, so the check compares every
number in a block as printed, exactly when ``tol=0`` (the default) and
within ``T`` (absolute, in the printed units) otherwise.  Parts that depend
on the machine (run times, the result folder's time stamp) are masked out of
the comparison and kept as they stand in the README when writing.  Numbers
that are slow or machine-dependent (the benchmarks, the attack sweeps) are
not in any block: their scripts in ``experiments/`` regenerate them.

    python -m experiments.readme_numbers --check          # exit 1 when the README disagrees
    python -m experiments.readme_numbers --write          # rewrite every block in place
    python -m experiments.readme_numbers --show NAME      # print one regenerated block
    python -m experiments.readme_numbers --list

Set ``PRIVFED_CACHE`` to keep the digits features between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import json
import math
import pathlib
import re
import sys
import tempfile
from collections.abc import Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
if str(ROOT) not in sys.path:  # the blocks import experiments.* and the tests' own constants
    sys.path.insert(0, str(ROOT))

_OPEN = re.compile(r"<!-- readme-numbers:(?P<name>[\w-]+)(?P<attrs>[^>]*?)-->\n")
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")



def _committed(*parts: str) -> dict:
    """A results file an experiment commits (its path relative to the repository root)."""
    return json.loads(ROOT.joinpath(*parts).read_text(encoding="utf-8"))

# -- the blocks -------------------------------------------------------------------------------------
def _digits():
    from privfed.data import load_dataset

    return load_dataset("digits")


@functools.lru_cache(maxsize=None)
def _accuracies(extra: tuple = ()) -> dict:
    """label -> (accuracies over the 5 seeds, mean upload bytes, method class) on the methods-table setting."""
    import privfed
    from experiments.methods_table import VARIANTS
    from privfed.federation import partition

    ds = _digits()
    parts = [partition(ds.train_labels, 100, "dirichlet", alpha=0.1, rng=s) for s in range(5)]
    out = {}
    for name, params in [*VARIANTS, *((n, dict(p)) for n, p in extra)]:
        accs, upload = [], []
        for seed, part in enumerate(parts):
            F, y, k = part.apply(ds.train_features, ds.train_labels)
            head = privfed.fit(name, F, y, k, num_classes=ds.num_classes, random_state=seed, **params)
            accs.append(head.score(ds.test_features, ds.test_labels))
            upload.append(head.upload_bytes["per_client"])
        label = name + ("" if not params else " (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")")
        out[label] = (np.array(accs), float(np.mean(upload)), privfed.methods.get_class(name))
    return out


def methods_table() -> str:
    """The methods table: every method on digits, 100 clients, Dirichlet 0.1, 5 seeds, no privacy."""
    lines = [
        "| method | accuracy (mean ± std) | upload bytes / client | uploads | server needs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, (accs, upload, cls) in _accuracies().items():
        lines.append(
            f"| {label} | {np.mean(accs):.4f} ± {np.std(accs, ddof=1):.4f} | {upload:,.0f} | "
            f"{', '.join(sorted(cls.requires))} | {'per client' if cls.per_client else 'sums only'} |"
        )
    return "\n".join(lines) + "\n"


ORDERINGS = """\
* **FedCOF is clearly above FedNCM** ({fedcof:.3f} vs {fedncm:.3f}). It uploads the same
  bytes and its estimated within-class covariances pay off.
* **FedCOF is close to Fed3R**, and above it here: {fedcof:.3f} vs {fed3r:.3f}.
* **fed3r-within is at least as good as fed3r** ({within:.3f} vs {fed3r:.3f}). It takes
  FedCOF's per-class shrinkage γ (default 1, as FedCOF). It then equals
  `fedcof-oracle` exactly, with every upload a sum, so it is compatible with
  secure aggregation. With γ = 0 it falls to {within0:.3f}, because {dead} of the {d}
  ReLU features are dead on digits and G has to be pseudo-inverted.
"""


def orderings() -> str:
    """The orderings bullets under the methods table; refuses to write a claim the numbers contradict."""
    acc = _accuracies(extra=(("fed3r-within", (("gamma", 0.0),)),))
    m = {label: float(np.mean(a)) for label, (a, _, _) in acc.items()}
    ds = _digits()
    values = dict(
        fedcof=m["fedcof"], fedncm=m["fedncm"], fed3r=m["fed3r"], within=m["fed3r-within"],
        within0=m["fed3r-within (gamma=0.0)"], dead=int(np.sum(~np.any(ds.train_features != 0, axis=0))),
        d=ds.dim,
    )
    claims = {
        "FedCOF above FedNCM": values["fedcof"] > values["fedncm"],
        "FedCOF above Fed3R": values["fedcof"] > values["fed3r"],
        "fed3r-within >= fed3r": values["within"] >= values["fed3r"],
        "fed3r-within equals fedcof-oracle": np.array_equal(acc["fed3r-within"][0], acc["fedcof-oracle"][0]),
        "gamma = 0 is worse": values["within0"] < values["within"],
    }
    broken = [c for c, ok in claims.items() if not ok]
    if broken:
        raise RuntimeError(f"the README's orderings no longer hold: {broken}; rewrite the text")
    return ORDERINGS.format(**values)


#: The README's first command, as run here (with a temporary --out and no progress bar).
COMMAND_1 = ["--method", "fedlog", "--eps", "0.1"]


def command_1() -> str:
    """What ``python -m privfed.tradeoff --method fedlog --eps 0.1`` prints."""
    from mechanisms.backends import NumpyNoise
    from privfed import tradeoff

    warned, NumpyNoise._warned = NumpyNoise._warned, False  # print what a fresh process prints
    try:
        return _run_command_1(tradeoff)
    finally:
        NumpyNoise._warned = warned


def _run_command_1(tradeoff) -> str:
    with tempfile.TemporaryDirectory(prefix="readme-numbers-") as tmp:
        out = pathlib.Path(tmp) / "run"
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = tradeoff.main([*COMMAND_1, "--quiet", "--out", str(out)])
        if rc not in (0, None):
            raise RuntimeError(f"privfed.tradeoff exited {rc}: {buf.getvalue()}")
        text = buf.getvalue().replace(str(out), "results/tradeoff-<time>")
    return "```\n" + text.rstrip("\n") + "\n```\n"


SNIPPET = '''```python
import privfed
from privfed.data import load_dataset
from privfed.federation import partition
from mechanisms import GaussianMechanism

ds = load_dataset("digits")                       # or "file:feats.npz", "cifar100" (+ backbone=...)
part = partition(ds.train_labels, 100, "dirichlet", alpha=0.1, rng=0)
F, y, k = part.apply(ds.train_features, ds.train_labels)

head = privfed.fit("fedcof", F, y, k, gamma=1.0)  # weight (C, d), bias (C,), predict, score
head.score(ds.test_features, ds.test_labels)      # {score} (seed 0)
head.upload_bytes, head.notes                      # communication; what the method reported or repaired

mech = GaussianMechanism(epsilon=2.0, delta=1e-5, clip=31.4)   # record level, analytic calibration
private = privfed.fit("fedlog", F, y, k, privacy=mech, random_state=0)
print(private.privacy.guarantee)                   # computed from the ledger, never typed in twice
```
'''


def snippet() -> str:
    """The README's code snippet, run: the value its comment quotes is the one it computes."""
    code = SNIPPET.split("```python\n", 1)[1].rsplit("```", 1)[0]
    code = code.replace("head.score(ds.test_features, ds.test_labels)", "score = head.score(ds.test_features, ds.test_labels)")
    code = code.replace("print(private.privacy.guarantee)", "guarantee = private.privacy.guarantee")
    ns: dict = {}
    exec(compile(code.replace("{score}", ""), "<README snippet>", "exec"), ns)  # noqa: S102 - our own text
    return SNIPPET.replace("{score}", f"{ns['score']:.3f}")


AUDIT = """\
* **Audits.** Every block of every DP mechanism is audited in the suite
  (`privfed.audit`). A canary record sits above the clip bound, and the
  lower bound μ_lb comes from Clopper–Pearson intervals with a Bonferroni
  correction. μ_lb stays under the claim for the real mechanism, and
  deliberately broken variants are caught: noise halved, clipping skipped,
  second moment calibrated with c instead of c², counts left un-noised.
  With {draws:,} draws per side, an audit takes about {seconds:.1f} s. At ε = 1 the
  real mechanism's μ_lb is {lo1:.2f}–{hi1:.2f} against a claim of {claim1:.3f}. Halving the
  noise gives about {halved1:.2f}, so it is caught, and skipping clipping gives
  about {noclip1:.1f}. At ε = 4 the real mechanism gives {lo4:.2f}–{hi4:.2f} against {claim4:.3f}.
  Calibrating the second moment with c instead of c² gives {c4:.2f} there.
"""


def audit_figures() -> str:
    """The audit bullet: the suite's audits (tests/test_audit.py's mechanisms and seeds), rerun."""
    import time
    import warnings

    from tests.test_audit import DRAWS, GaussianMechanism, HalvedNoise, NoClipping, SecondWithC, _run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        real1 = _run(GaussianMechanism, 1.0, seed=10)
        seconds = time.perf_counter() - t
        real4 = _run(GaussianMechanism, 4.0, seed=40)
        halved1 = _run(HalvedNoise, 1.0, seed=11)
        noclip1 = _run(NoClipping, 1.0, seed=12)
        c4 = _run(SecondWithC, 4.0, seed=13)
    lb = lambda res: [r.mu_lb for r in res.values()]  # noqa: E731
    return AUDIT.format(
        draws=DRAWS,
        seconds=seconds,
        lo1=min(lb(real1)), hi1=max(lb(real1)), claim1=real1["sums"].claimed_mu,
        halved1=float(np.mean(lb(halved1))),
        noclip1=float(np.mean([noclip1["sums"].mu_lb, noclip1["second"].mu_lb])),
        lo4=min(lb(real4)), hi4=max(lb(real4)), claim4=real4["sums"].claimed_mu,
        c4=c4["second"].mu_lb,
    )


CALIBRATION = """\
* **Calibration.** By default σ comes from the exact analytic Gaussian
  (Balle and Wang): σ(ε = 1, δ = 1e-5, Δ = 1) = {analytic:.4f}. The FedLog paper's
  classic bound ({classic:.4f} there) is available as `calibration="classic"`,
  with a warning above ε = 1. The ledger recomputes the ε that the classic
  σ actually gives: {classic2:.3f} for a nominal ε = 2. Rounds compose exactly in
  GDP. With client subsampling, a PLD, PRV or RDP accountant is used
  (dp-accounting and opacus).
"""


def calibration() -> str:
    """The calibration bullet: analytic and classic σ, and the ε the classic σ really gives."""
    from mechanisms.calibration import analytic_sigma, classic_sigma, gdp_epsilon

    return CALIBRATION.format(
        analytic=analytic_sigma(1.0, 1e-5), classic=classic_sigma(1.0, 1e-5),
        classic2=gdp_epsilon(1.0 / classic_sigma(2.0, 1e-5, warn=False), 1e-5),
    )


DROPOUTS = """\
* **ε, δ** are composed over the releases that happened: one `fit` is one
  release; `rounds=T` only sets σ so that T releases meet the target. Under
  secure aggregation ε is recomputed from the noise shares that reached the
  sum: U uploads of σ²/(K − t) carry U/(K − t)·σ², so with more than t
  dropouts ε rises and the report says how many shares were present ({present} of
  {clients} at t = 0: {share:.1f}σ², ε = {eps:.2f} for a target of 1).
"""


def dropouts() -> str:
    """The report bullet's dropout example, computed by the pipeline's own secure-sum accounting."""
    from mechanisms.calibration import gdp_epsilon, gdp_mu

    clients, present, delta = 10, 6, 1e-5
    share = present / clients
    eps = gdp_epsilon(gdp_mu(1.0, delta) / np.sqrt(share), delta)
    return DROPOUTS.format(present=present, clients=clients, share=share, eps=eps)


# -- blocks rendered from recorded results (slow experiments; see experiments/recorded.py) -------------
def _record(name: str) -> dict:
    from experiments import recorded

    return recorded.load(name)


def _at(rows: list[dict], eps: float) -> dict:
    for r in rows:
        if float(r["epsilon"]) == eps:
            return r
    raise KeyError(f"no eps={eps} in the record")


READINGS = """\
How to read these curves ({seeds} seeds; the x-axis is the ε the ledger reports;
`{command}` regenerates them):

* **FedLog.** Once the noise goes on the sum, through a trusted aggregator
  or split across clients under secure aggregation, FedLog is at {c2:.2f} by
  ε = 2 (trusted aggregator; {m2:.2f} split) and at {c4:.3f} by ε = 4, against its
  non-private {np_:.3f}. It is at {c1:.2f} at ε = 1 and {c05:.2f} at ε = 0.5 (trusted aggregator).
* **Classic calibration.** The FedLog paper's classic calibration adds more
  noise than it needs: {k1:.2f} at a nominal ε = 1, whose σ really gives
  ε = {k1eps:.2f}, against {c1:.2f} for the analytic one at ε = 1. The plot places it at
  the ε the ledger computes.
* **Local noise.** When each client noises its own upload (no trust in the
  server), the server sees K noisy copies. That costs more than an order
  of magnitude in ε: central noise reaches {c1:.2f} at ε = 1, local noise
  reaches {l16:.2f} only at ε = 16.
* **Record-level DP with local noise.** This is the honest default
  protection against the server, and it is hard on 100 clients with about
  9 samples each. FedCOF needs every client's means, so each mean carries
  noise of order σ/n_kc: it is at {cof16:.2f} at ε = 16 against {cof_np:.3f} without noise.
* **Methods that upload G.** Fed3R, fed3r-within and FedCGS also pay for
  the second moment's sensitivity c². With the clip set to the median
  public feature norm (c ≈ {clip:.0f}), c² ≈ {clip2:.0f} dominates. This hits fed3r-within
  hardest, because it subtracts two noisy matrices ({w16:.2f} at ε = 16, against
  {r16:.2f} for Fed3R). Choose a smaller `--clip` for them.
* **Count-only noise** (FedCOF App. I.1) costs little accuracy: Laplace count
  noise keeps {lap01:.3f} at ε = 0.1 against {cn_np:.3f}. It protects only the counts and
  reports exactly that. The uniform heuristic costs nothing because it protects
  nothing.
"""


def readings() -> str:
    """The trade-off readings under the FedLog plot, from the recipes' record."""
    from privfed.tradeoff import digits_public_clip

    rec = _record("recipes")
    d = rec["data"]
    fl, rd, cn = d["fedlog-dp"], d["record-dp"], d["count-noise"]
    central = fl["central noise, analytic (trusted aggregator)"]
    classic = fl["central noise, classic bound (FedLog paper)"]
    mask = fl["noise split under secure aggregation (mask)"]
    local = fl["local noise (each client, no trust)"]
    acc = lambda rows, e: float(_at(rows, e)["accuracy_mean"])  # noqa: E731
    v = dict(
        seeds=int(central[0]["seeds"]), command=rec["command"],
        c2=acc(central, 2.0), m2=acc(mask, 2.0), c4=acc(central, 4.0), np_=acc(central, float("inf")),
        c1=acc(central, 1.0), c05=acc(central, 0.5), k1=acc(classic, 1.0),
        k1eps=float(_at(classic, 1.0)["epsilon_reported"]), l16=acc(local, 16.0),
        cof16=acc(rd["fedcof"], 16.0), cof_np=acc(rd["fedcof"], float("inf")),
        w16=acc(rd["fed3r-within"], 16.0), r16=acc(rd["fed3r"], 16.0),
        lap01=acc(cn["laplace"], 0.1), cn_np=acc(cn["laplace"], float("inf")),
        clip=digits_public_clip(),
    )
    v["clip2"] = v["clip"] ** 2
    claims = {
        "classic below analytic at nominal eps 1": v["k1"] < v["c1"] and v["k1eps"] < 1.0,
        "local at 16 not above central at 1 by much": v["l16"] <= v["c1"] + 0.05,
        "fed3r-within below fed3r at 16": v["w16"] < v["r16"],
        "count noise costs little": v["cn_np"] - v["lap01"] < 0.05,
    }
    broken = [c for c, ok in claims.items() if not ok]
    if broken:
        raise RuntimeError(f"the README's trade-off readings no longer hold: {broken}; rewrite the text")
    return READINGS.format(**v)


NOISE_AWARE = """\
* **Noise-aware estimation** (`fedcof` with `noise_var=`, and
  `mechanisms.noise_aware`). Noise of known variance inflates FedCOF's
  spread of client means by σ²/(K_c − 1)·(Σ_k 1/n_kc − K_c/N_c). The server
  can subtract that bias and project G back to the PSD cone.
  `{command}` measures what this buys on digits
  (FedCOF, {clients} clients, {seeds} seeds). Debiasing cuts the covariance error by only
  {cut_lo:.0f}–{cut_hi:.0f}% and lowers accuracy: at ε = 8, {p8:.3f} plain against {a8:.3f} debiased. The bias
  acts as a ridge that the noisy class sums need. Dropping (client, class)
  pairs whose noisy count is under {thr:g} standard deviations cuts the
  covariance error {drop_lo:.0f}–{drop_hi:.0f}× and helps at large ε: at ε = 16, {d16:.3f} against
  {p16:.3f}. Debiasing is therefore offered, not the default.
"""


def noise_aware() -> str:
    """The noise-aware estimation bullet, from experiments/noise_aware.py's record."""
    rec = _record("noise_aware")
    cfg, rows = rec["data"]["config"], rec["data"]["rows"]
    eps = sorted({float(r["epsilon"]) for r in rows})
    mean = lambda key, e: float(np.mean([r[key] for r in rows if float(r["epsilon"]) == e]))  # noqa: E731
    cut = [100 * (1 - mean("cov_err_aware", e) / mean("cov_err_plain", e)) for e in eps]
    drop = [mean("cov_err_plain", e) / mean("cov_err_drop", e) for e in eps]
    v = dict(
        command=rec["command"], clients=cfg["clients"], seeds=cfg["seeds"], thr=cfg["threshold"],
        cut_lo=min(cut), cut_hi=max(cut), drop_lo=min(drop), drop_hi=max(drop),
        p8=mean("acc_plain", 8.0), a8=mean("acc_aware", 8.0), d16=mean("acc_drop", 16.0), p16=mean("acc_plain", 16.0),
    )
    if not (v["a8"] < v["p8"] and v["d16"] > v["p16"] and max(cut) < 10):
        raise RuntimeError("the README's noise-aware reading no longer holds; rewrite the text")
    return NOISE_AWARE.format(**v)


def _sci(x: float) -> str:
    """1.2e-8 style, one decimal."""
    m, e = f"{x:.1e}".split("e")
    return f"{m}e{int(e)}"


def secagg_table() -> str:
    """The secure-aggregation cost table, from experiments/bench_secagg.py's record (machine-dependent)."""
    rec = _record("bench_secagg")
    cfg, rows = rec["data"]["config"], rec["data"]["rows"]
    by = {(r["protocol"], r["variant"]): r for r in rows}
    plain = by[("plain", "float64 sum")]
    full = by[("mask", "complete graph")]
    drop = by[("mask", "complete graph, 10% drop before upload")]
    plus = next(r for (p_, v), r in by.items() if p_ == "mask" and v.startswith("SecAgg+"))
    ckks = next((r for (p_, _), r in by.items() if p_ == "ckks"), None)
    K, D = cfg["clients"], cfg["values"]
    lines = [
        f"`{rec['command']}`: {K} clients × {D:,} floats, the least CPU seconds of {cfg['repeats']} runs "
        f"(machine-dependent: {rec['machine']['cpus']} cores, load {rec['machine']['load_average'][0]:.1f} when recorded):",
        "",
        f"| protocol | CPU s (all {K} clients + server) | vs plain sum + raw PRG | upload bytes / client | max abs error |",
        "| --- | --- | --- | --- | --- |",
        f"| plain float64 sum | {plain['cpu_s']:.4f} | – | {plain['upload_bytes_per_client']:,.0f} | 0 |",
        f"| masking, complete graph | {full['cpu_s']:.2f} (PRG alone {full['prg_only_cpu_s']:.2f}, X25519 alone "
        f"{full['x25519_only_cpu_s']:.2f}) | **{full['ratio_to_plain_plus_prg']:.2f}×** | "
        f"{full['upload_bytes_per_client']:,.0f} | {_sci(full['max_abs_error'])} (bound K·2⁻³³ = {_sci(full['error_bound'])}) |",
        f"| masking, 10% drop before upload | {drop['cpu_s']:.2f} | {drop['ratio_to_plain_plus_prg']:.2f}× | "
        f"{drop['upload_bytes_per_client']:,.0f} | {_sci(drop['max_abs_error'])} |",
        f"| masking, SecAgg+ ({cfg['neighbours']} neighbours) | {plus['cpu_s']:.2f} | "
        f"{plus['ratio_to_plain_plus_prg']:.2f}× | {plus['upload_bytes_per_client']:,.0f} | {_sci(plus['max_abs_error'])} |",
    ]
    if ckks is not None:
        lines.append(
            f"| CKKS, N = 8192, [60, 40, 40, 60], 2⁴⁰ | encrypt {ckks['per_client_ms']:.0f} ms / client, sum "
            f"{ckks['sum_s']:.1f} s, decrypt {ckks['decrypt_s']:.2f} s | – | {ckks['upload_bytes_per_client']:,.0f} "
            f"({ckks['ciphertexts_per_client']} ciphertexts, {ckks['upload_bytes_per_client'] / D:.0f} B a value) | "
            f"{_sci(ckks['max_abs_error'])} |"
        )
    lines += [
        "",
        f"The complete graph is bounded below by its {full['x25519_agreements']:,} X25519 agreements",
        f"({full['x25519_only_cpu_s']:.2f} s): every client needs a mask key and a channel key with every other",
        "client. The work that grows with vector size alone (masking and unmasking)",
        f"is {full['ratio_without_fixed']:.1f}× the PRG cost."
        + ("" if ckks is None else
           f" CKKS costs {ckks['upload_bytes_per_client'] / plain['upload_bytes_per_client']:.0f}× the bytes of a "
           "plain float32 upload."),
        "",
    ]
    return "\n".join(lines)


def bench_tradeoff_table() -> str:
    """The sweep's speed table, from experiments/bench_tradeoff.py's record (machine-dependent)."""
    rec = _record("bench_tradeoff")
    r = rec["data"]
    m = rec["machine"]
    return (
        f"Median of {r['repeats']} runs, back to back (`{rec['command']}`; machine-dependent: "
        f"{m['cpus']} cores, load {m['load_average'][0]:.1f} when recorded):\n"
        "\n"
        f"| sweep ({r['runs']} runs: 5 methods × 10 ε × 5 seeds, digits, 100 clients) | seconds | ratio to `privfed.tradeoff` |\n"
        "| --- | --- | --- |\n"
        f"| `privfed.tradeoff` (statistics once per seed and method) | {r['sweep_s_median']:.2f} | 1.00 |\n"
        f"| baseline: `privfed.fit` per run, one BLAS thread | {r['naive_1thread_s_median']:.2f} | "
        f"{r['speedup_vs_1thread']:.2f} |\n"
        f"| baseline: `privfed.fit` per run, default BLAS threads | {r['naive_s_median']:.2f} | {r['speedup']:.2f} |\n"
        "\n"
        f"Reusing the clipped statistics is worth {r['speedup_vs_1thread']:.2f}× on the same BLAS threads; the rest of\n"
        f"the {r['speedup']:.2f}× against `privfed.fit` with default BLAS threads comes from threading on\n"
        "64 × 64 matrices, not from the sweep, which runs its small d × d algebra on one BLAS thread.\n"
    )


def _fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def flower_bytes() -> str:
    """Bytes on the wire per protocol on Flower, from experiments/bench_flower.py's record."""
    part = _record("bench_flower")["data"]["protocols"]
    rows, cfg = part["rows"], part["config"]
    out = [
        f"Bytes up per node, {cfg['clients']} digits nodes (d = 64, C = 10), ratio to plain float64 in the same run "
        f"(`python {part['command'].removeprefix('python ')}`):",
        "",
        "| method | protocol | bytes up / node | vs plain float64 | fit model / node | array payload / node |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['method']} | {r['protocol']} | {r['bytes_up_per_node']:,.0f} | {r['vs_plain_float64']:.2f} | "
            f"{_fmt(r['fit_model_bytes_per_node'], ',.0f')} | {_fmt(r['payload_bytes_per_node'], ',.0f')} |"
        )
    return "\n".join(out) + "\n"


def flower_audit() -> str:
    """End-to-end audits of the Flower DP paths, from experiments/bench_flower.py's record."""
    part = _record("bench_flower")["data"]["audit"]
    rows = part["rows"]
    r0 = rows[0]
    out = [
        f"fedncm, ε = {r0['claimed_eps']:g} (claimed μ = {r0['claimed_mu']:.3f}), {r0['draws']} fresh draws a side "
        f"(`python {part['command'].removeprefix('python ')}`, the audit part):",
        "",
        "| path | neighbour pair | μ lower bound | flagged |",
        "|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['path']} | {r['pair']} | {r['mu_lb']:.3f} | {'yes' if r['flagged'] else 'no'} |")
    broken = [r for r in rows if r["path"].startswith("BROKEN")]
    real = [r for r in rows if not r["path"].startswith("BROKEN")]
    if not (all(r["flagged"] for r in broken) and not any(r["flagged"] for r in real)):
        raise RuntimeError("the Flower audit record no longer says what the README says: every real path passes, "
                           "every broken one is flagged")
    return "\n".join(out) + "\n"


def flower_cost() -> str:
    """Start-up, scale and server memory on Flower, from experiments/bench_flower.py's record (machine-dependent)."""
    data = _record("bench_flower")["data"]
    m, sc, mem = data["methods"], data["scale"], data["memory"]
    mr = m["rows"]
    runs = mr["runs"]
    later = [r["server_seconds"] for r in runs[1:]]
    load = sc["machine"]["load_average"]
    by_d = {(r["d"], r["clients"]): r for r in mem["rows"]}
    dmax = max(r["d"] for r in mem["rows"])
    ks = sorted(r["clients"] for r in mem["rows"] if r["d"] == dmax)
    a, b = by_d[(dmax, ks[0])], by_d[(dmax, ks[-1])]
    out = [
        f"`python {sc['command'].removeprefix('python ')}` (machine-dependent: {sc['machine']['cpus']} cores, "
        f"{sc['config']['num_cpus']} Ray CPUs, load {load[0]:.1f} when recorded):",
        "",
        "| | " + " | ".join(f"{r['clients']:,} nodes" for r in sc["rows"]) + " |",
        "|---|" + "---|" * len(sc["rows"]),
        "| fedncm wall time, whole simulation (synthetic d = 64, 20 samples a node) | "
        + " | ".join(f"{r['simulation_wall_s']:.1f} s" for r in sc["rows"]) + " |",
        "| largest difference from a direct sum | " + " | ".join(f"{r['max_abs_diff_vs_direct_sum']:.1e}" for r in sc["rows"]) + " |",
        "",
        f"Start-up dominates: on {mr['clients']} digits nodes (every method plain, then masked, CKKS, compact, DP and",
        f"Flower SecAgg+ runs, {len(runs)} in one simulation) the first head came {mr['first_head_s']:.1f} s after launch;",
        f"the {len(later)} further runs on the same nodes took {min(later):.1f}–{max(later):.1f} s each of server time.",
        f"Server peak memory (fed3r, traced) grows with d², not with the number of nodes: d = {dmax} peaked at",
        f"{a['server_peak_traced_bytes'] / 1e6:.1f} MB with {ks[0]} nodes and {b['server_peak_traced_bytes'] / 1e6:.1f} MB "
        f"with {ks[-1]} (holding every reply would take {a['K_d2_bytes'] / 1e6:.0f} MB and {b['K_d2_bytes'] / 1e6:.0f} MB).",
        "",
    ]
    return "\n".join(out)


def audit_sweep_table() -> str:
    """The audit sweep's table, rendered by experiments/audit_sweep.py from its committed results."""
    from experiments import audit_sweep

    res = _committed("experiments", "audit_sweep_results.json")
    return audit_sweep.readme_table(res).strip("\n") + "\n"


SAMPLING = """\
* **Client sampling.** `GaussianMechanism(..., level="client", trusted_aggregator=True,
  sampling_rate=q)` samples clients for real: at each release the trusted aggregator keeps every
  client's upload in the sum independently with probability q, drawn from fresh OS entropy (from the
  seed in a seeded run, which the report calls a simulation), and releases neither which clients nor
  how many. Every client still uploads to the trusted aggregator, so bytes say nothing about the
  sample. The report credits amplification by Poisson subsampling: dp-accounting's PLD accountant on
  a `PoissonSampledDpEvent` of the Gaussian. Example: q = {q:g} at a target ε = 1 gives μ = {mu:.2f} per
  release, i.e. ({eps_plain:.2f}, 1e-5) without sampling, and ({eps:.3f}, 1e-5) with it. q < 1 is refused
  where amplification does not hold: with local noise and under secure aggregation the server sees
  who uploads; at record level the rest of a client's data shows in the sum whether that client was
  sampled, so client sampling amplifies only δ there.
"""


def sampling() -> str:
    """The client-sampling bullet: one sampled release through privfed.fit, its report and its μ."""
    import warnings

    import privfed
    from mechanisms import GaussianMechanism
    from mechanisms.calibration import gdp_epsilon

    q = 0.01
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, level="client", max_records=20,
                             trusted_aggregator=True, sampling_rate=q)
    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(size=(60, 4)))
    y, k = np.arange(60) % 3, np.arange(60) % 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=6, privacy=mech, random_state=0)
    return SAMPLING.format(q=q, mu=mech.mu, eps_plain=gdp_epsilon(mech.mu, 1e-5), eps=head.privacy.epsilon)


def _bench_scale() -> tuple[dict, object]:
    from experiments import bench_scale

    return _committed("experiments", "bench_scale.json"), bench_scale


def bench_scale_tables() -> str:
    """The scale benchmark's tables, rendered by experiments/bench_scale.py from its recorded run."""
    res, bs = _bench_scale()
    return bs.render(res).rstrip("\n") + "\n"


SCALE_READINGS = """\
Reading the tables (ratios within the one recorded run):

* Every method runs at the iNat-120K shape in {rss_lo:.2f}–{rss_hi:.2f} GiB peak RSS, {bud_lo:.2f}–{bud_hi:.2f} of the
  target 2 (N d + M d + d²) floats plus the input.
* Client statistics take {cli_lo:.2f}–{cli_hi:.2f}× their bound (one pass of the group sum, plus XᵀX over the
  samples for the second-moment methods), servers {srv_lo:.2f}–{srv_hi:.2f}× theirs, whole fits {fit_lo:.2f}–{fit_hi:.2f}×:
  {within}.
* A server's bound is what its head must cost: XᵀX over the rows it reads (the M pairs for FedCOF, the
  C class means where the between-class scatter is formed), one Cholesky and, for every head G⁻¹B, the
  triangular solves of its d × C right-hand side ({solve_ratio:.1f}× the Cholesky here, 6 C / d of its flops).
* Against the seeds' per-client loop, FedCOF (with its server looped as Eq. 6 is written) is {cof_loop:.0f}×
  faster ({mm_loop:.0f}× with 4 means, {cof_gemm:.0f}× against a per-class GEMM loop) and the oracle {orc_loop:.0f}×.
  For the sum-only methods ({sumonly}) the loop itself is only
  {lb_lo:.1f}–{lb_hi:.1f}× slower than their bound (loop / bound): their per-client Python work is small next to
  the pass over the data every implementation makes, so an implementation at the bound is that much
  faster and no more, short of the 20× target; privfed's fits are {lf_lo:.1f}–{lf_hi:.1f}× faster.
* Record-level DP with local noise streams: fedncm's release costs {dp_lo:.2f}–{dp_hi:.2f}× drawing its noise alone,
  FedCOF's {cdp_lo:.2f}–{cdp_hi:.2f}× the noise plus XᵀX over its kept cells ({kept:.0%} of the K C cells keep a positive
  noisy count); scaled to iNat-120K that is about {ncm_min:.0f} and {cof_min:.0f} minutes. Memory above the input does
  not grow with the number of clients beyond FedCOF's K C noisy counts.
* Fitted exponents: fit time grows as M^{m_lo:.2f}–M^{m_hi:.2f} (linear in the pairs, not in K·C), as
  K^{k_lo:.2f}–K^{k_hi:.2f} at fixed M and N, and as d^{d_lo:.2f}–d^{d_hi:.2f} over d = {d_first}–{d_last} (the d² terms, XᵀX and
  the solves, against the N d group sum).
"""


def scale_readings() -> str:
    """The readings under the scale tables, from the recorded run; refuses a claim the run contradicts."""
    res, bs = _bench_scale()
    N, M, d = res["shape"]["N"], res["shape"]["M"], res["d"]
    K, C = res["shape"]["K"], res["shape"]["C"]
    budget = 2 * (N * d + M * d + d * d) * 8
    rows = {r["method"]: r for r in res["rows"] if "error" not in r}
    q = {m: bs.method_ratios(r, res["bound"], budget) for m, r in rows.items()}
    sumonly = [m for m in rows if q[m]["loop_fit"] < 20]
    curves = res["curves"]
    mexp = [c["exponent"] for c in curves if c["curve"].startswith("M")]
    kexp = [c["exponent"] for c in curves if c["curve"].startswith("K")]
    dcur = [c for c in curves if c["curve"] == "d"]
    dps = [r for r in res["local_dp"] if "error" not in r]
    ncm = [r for r in dps if r.get("method", "fedncm") == "fedncm"]
    cof = [r for r in dps if r.get("method") == "fedcof"]
    over = [f"{m} ({part} {q[m][key]:.2f}×)" for m in rows for part, key in (("client", "client_bound"),
                                                                            ("server", "server_bound"))
            if q[m][key] > 1.5]
    within = ("every client step and every server is within the 1.5× target" if not over else
              "within the 1.5× target except " + ", ".join(over))
    v = dict(
        rss_lo=min(r["peak_rss"] for r in rows.values()) / 2**30, rss_hi=max(r["peak_rss"] for r in rows.values()) / 2**30,
        bud_lo=min(x["rss_budget"] for x in q.values()), bud_hi=max(x["rss_budget"] for x in q.values()),
        cli_lo=min(x["client_bound"] for x in q.values()), cli_hi=max(x["client_bound"] for x in q.values()),
        srv_lo=min(x["server_bound"] for x in q.values()), srv_hi=max(x["server_bound"] for x in q.values()),
        fit_lo=min(x["fit_bound"] for x in q.values()), fit_hi=max(x["fit_bound"] for x in q.values()),
        within=within, solve_ratio=res["bound"]["solve_C_s"] / res["bound"]["cholesky_s"],
        cof_loop=q["fedcof"]["loop_fit"], mm_loop=q["fedcof-mm4"]["loop_fit"], cof_gemm=q["fedcof"]["class_gemm_loop_fit"],
        orc_loop=q["fedcof-oracle"]["loop_fit"], sumonly=", ".join(sumonly),
        lb_lo=min(q[m]["loop_bound"] for m in sumonly), lb_hi=max(q[m]["loop_bound"] for m in sumonly),
        lf_lo=min(q[m]["loop_fit"] for m in sumonly), lf_hi=max(q[m]["loop_fit"] for m in sumonly),
        dp_lo=min(r["run_s"] / r["noise_s"] for r in ncm), dp_hi=max(r["run_s"] / r["noise_s"] for r in ncm),
        cdp_lo=min(r["run_s"] / (r["noise_s"] + r["xtx_s"]) for r in cof),
        cdp_hi=max(r["run_s"] / (r["noise_s"] + r["xtx_s"]) for r in cof),
        kept=max(cof, key=lambda r: r["clients"])["kept_rows"] / (max(r["clients"] for r in cof) * C),
        ncm_min=max(ncm, key=lambda r: r["clients"])["run_s"] * K / max(r["clients"] for r in ncm) / 60,
        cof_min=max(cof, key=lambda r: r["clients"])["run_s"] * K / max(r["clients"] for r in cof) / 60,
        m_lo=min(mexp), m_hi=max(mexp), k_lo=min(kexp), k_hi=max(kexp),
        d_lo=min(c["exponent"] for c in dcur), d_hi=max(c["exponent"] for c in dcur),
        d_first=dcur[0]["x"][0], d_last=dcur[0]["x"][-1],
    )
    claims = {
        "every method within the memory target": v["bud_hi"] <= 1.0,
        "FedCOF and the oracle >= 20x the loop": min(v["cof_loop"], v["mm_loop"], v["orc_loop"]) >= 20,
        "the methods under 20x cannot reach it": bool(sumonly) and v["lb_hi"] < 20,
        "linear in M": 0.6 <= v["m_lo"] and v["m_hi"] <= 1.3,
        "flat in K": v["k_hi"] <= 0.3,
        "local DP near its bound": v["dp_hi"] <= 1.5 and v["cdp_hi"] <= 1.5,
        "local DP memory flat in K": all(
            (max(g, key=lambda r: r["clients"])["peak_rss"] - max(g, key=lambda r: r["clients"])["rss_input"])
            < 1.5 * (min(g, key=lambda r: r["clients"])["peak_rss"] - min(g, key=lambda r: r["clients"])["rss_input"])
            for g in (ncm, cof)),
    }
    broken = [c for c, ok in claims.items() if not ok]
    if broken:
        raise RuntimeError(f"the README's scale readings no longer hold: {broken}; rewrite the text")
    return SCALE_READINGS.format(**v)


# -- FedLog over rounds (experiments/results/fedlog_rounds.json, written by experiments/fedlog_rounds.py) --
def _fedlog() -> dict:
    return _committed("experiments", "results", "fedlog_rounds.json")


def _kb(b: float) -> str:
    return f"{b / 1e6:#.3g} MB" if b >= 1e6 else f"{b / 1e3:#.3g} kB"


FEDLOG_TRAINING = """\
### What training buys on digits ({clients} clients, 2 classes each, {rounds} rounds, {epochs} local epochs, seed 0)

Regenerate: `{command}` (the `compare` part; about 25 minutes for every part on a loaded 2-core machine)

| bodies | method | personalised acc. | common-test acc. | upload / round (all clients) | upload, {rounds} rounds |
|---|---|---|---|---|---|
{table}
FedLog uploads m C + 1 = {floats} floats per client per round ({bytes_client} bytes), {share:.1f} % of
FedAvg's {params:,}-parameter model. Seeded runs are bit-reproducible on CPU; the recorded run's
heterogeneous comparison (four methods) took {cpu:.0f} s of CPU time.

How to read it:

* Training does improve on the one-shot frozen head in personalised accuracy:
  with heterogeneous bodies by {gain_het:.0f} points (the frozen public bodies of the three
  families live in *different* feature spaces, so one head cannot serve them;
  training against the shared head aligns them, the paper's point), with one
  architecture by {gain_cnn:.1f} points (error {err1:.3f} -> {err2:.3f}).
* It is no better than local-only training here ({h_fl:.3f} vs {h_lo:.3f} heterogeneous,
  {c_fl:.3f} vs {c_lo:.3f} with cnn bodies). Each client holds two classes and is tested
  on those two: a two-class digits problem that a few dozen local samples already
  solve. The common-test column shows the price: every trained body
  maps any input into its own two classes ({common:.2f} on the 10-class test), while
  the one-shot frozen head keeps {os_het:.2f} (heterogeneous) / {os_cnn:.3f} (cnn). The paper
  reports only the personalised number.
"""


def fedlog_training() -> str:
    res = _fedlog()
    cfg = res["config"]
    by = {(r["families"], r["method"]): r for r in res["compare"] if r["seed"] == 0}
    R = cfg["rounds"]
    names = {"fedlog": f"FedLog, {R} rounds", "oneshot": "one-shot frozen FedLog", "local": "local only",
             "fedavg": "FedAvg"}
    rows = []
    for fam, label in (("cnn+cnn-narrow+mlp", "cnn + cnn-narrow + mlp"), ("cnn", "cnn only")):
        for m in ("fedlog", "oneshot", "local", "fedavg"):
            r = by[(fam, m)]
            lab = "(cnn on every client)" if (m == "fedavg" and fam != "cnn") else label
            per, tot = r["upload_bytes_per_round"], r["upload_bytes_total"]
            total = "0" if tot == 0 else _kb(tot) + (" (once)" if m == "oneshot" and fam != "cnn" else "")
            rows.append(f"| {lab} | {names[m]} | {r['personalised']:.3f} | {r['common']:.3f} | "
                        f"{'0' if per == 0 else _kb(per)} | {total} |")
    K = cfg["clients"]
    fl = by[("cnn+cnn-narrow+mlp", "fedlog")]
    per_client = fl["upload_bytes_per_round"] / K
    params = by[("cnn", "fedavg")]["upload_bytes_per_round"] / (4 * K)
    h, c = "cnn+cnn-narrow+mlp", "cnn"
    v = dict(
        clients=K, rounds=R, epochs=cfg["local_epochs"], command=res["command"].replace(" --quiet", ""),
        table="\n".join(rows) + "\n", floats=int(per_client / 4), bytes_client=int(per_client),
        share=100 * per_client / 4 / params, params=int(params), cpu=fl["cpu_seconds"],
        gain_het=100 * (by[(h, "fedlog")]["personalised"] - by[(h, "oneshot")]["personalised"]),
        gain_cnn=100 * (by[(c, "fedlog")]["personalised"] - by[(c, "oneshot")]["personalised"]),
        err1=1 - by[(c, "oneshot")]["personalised"], err2=1 - by[(c, "fedlog")]["personalised"],
        h_fl=by[(h, "fedlog")]["personalised"], h_lo=by[(h, "local")]["personalised"],
        c_fl=by[(c, "fedlog")]["personalised"], c_lo=by[(c, "local")]["personalised"],
        common=by[(h, "fedlog")]["common"], os_het=by[(h, "oneshot")]["common"], os_cnn=by[(c, "oneshot")]["common"],
    )
    claims = {"training beats one-shot": v["gain_het"] > 0 and v["gain_cnn"] > 0,
              "no better than local (heterogeneous)": v["h_fl"] <= v["h_lo"],
              "trained bodies lose the common test": v["common"] < v["os_het"]}
    broken = [k for k, ok in claims.items() if not ok]
    if broken:
        raise RuntimeError(f"the README's FedLog readings no longer hold: {broken}; rewrite the text")
    return FEDLOG_TRAINING.format(**v)


def fedlog_composition() -> str:
    """The paper's per-round eps composed exactly (GDP of the classic sigma), computed here."""
    from mechanisms.calibration import classic_sigma, gdp_epsilon

    delta = 0.01
    lines = ["| per-round eps (paper) | one release alone, exactly | 10 releases | 20 releases | 101 releases |",
             "|---|---|---|---|---|"]
    for eps in (0.1, 1.0):
        mu = 1.0 / classic_sigma(eps, delta, warn=False)
        cells = [gdp_epsilon(mu * math.sqrt(r), delta) for r in (1, 10, 20, 101)]
        fmt = [f"{cells[0]:.2g}" if cells[0] < 0.1 else f"{cells[0]:.3f}"] + [
            f"{x:.3f}" if x < 1 else f"{x:#.3g}" for x in cells[1:]]
        lines.append(f"| {eps:g} | " + " | ".join(fmt) + " |")
    many = gdp_epsilon(math.sqrt(101) / classic_sigma(1.0, delta, warn=False), delta)
    lines += ["", f"(delta = {delta:g}; the classic bound is loose, so a handful of releases stay below",
              f'the stated eps, but 101 releases at "eps = 1" are eps = {many:.1f}.)']
    return "\n".join(lines) + "\n"


FEDLOG_DP = """\
Results (seed 0; {clients} clients, {rounds} rounds, E = {epochs}, heterogeneous bodies, b = {clip:g},
delta = {delta:g}, central noise; non-private FedLog: {nonpriv:.3f} personalised):

| eps | paper's DP: per-round eps -> composed eps | its accuracy | total-budget, upload bound (valid): accuracy at total eps |
|---|---|---|---|
{table}
Note that at per-round eps >= 10 the classic sigma does not even deliver its per-round eps: one
release is exactly {e10:.1f}-DP at a stated 10 ({e100:.0f} at a stated 100).

On {records} records the paper's noise at per-round eps = 0.1 already destroys the head (the paper's
CIFAR-10 has 50,000 records: its sums are {ratio:.0f}x larger against the same noise). The valid
calibration for trained bodies leaves chance accuracy at every budget here: one record may move a
whole upload, so the noise is {noise:.0f}x Theorem 3.1's.
"""


def _eps_txt(x: float) -> str:
    return f"{x:#.3g}" if x < 100 else f"{x:.0f}"


def fedlog_dp() -> str:
    from privfed.data import load_dataset

    res = _fedlog()
    cfg = res["config"]
    by = {(r["mode"], r["epsilon"]): r for r in res["dp"] if r["seed"] == 0}
    rows = []
    for eps in [e for e in cfg["eps"] if math.isfinite(e)]:
        p, t = by[("paper", eps)], by[("total-upload-bound", eps)]
        rows.append(f"| {eps:g} | {eps:g} -> {_eps_txt(p['composed_epsilon'])} | {p['personalised']:.3f} | "
                    f"{t['personalised']:.3f} |")
    nonpriv = by[("non-private", math.inf)]["personalised"]
    records = load_dataset("digits").train_labels.size
    t1 = by[("total-upload-bound", 1.0)]
    return FEDLOG_DP.format(
        clients=cfg["clients"], rounds=cfg["rounds"], epochs=cfg["local_epochs"], clip=cfg["clip"],
        delta=cfg["delta"], nonpriv=nonpriv, table="\n".join(rows) + "\n",
        e10=by[("paper", 10.0)]["per_round_epsilon_exact"], e100=by[("paper", 100.0)]["per_round_epsilon_exact"],
        records=records, ratio=50000 / records, noise=t1["sensitivity"] / by[("paper", 1.0)]["sensitivity"],
    )


FEDLOG_ATTACKS = """\
Frozen public cnn bodies (Theorem 3.1's sensitivity holds), {clients} clients, {rounds} rounds, b = {clip:g},
delta = {delta:g}, {pairs} pairs (an AUC of {pairs} pairs has sd <= {sd:.3f}):

| calibration | eps | composed eps | AUC, one round | AUC, {rounds} rounds | bound, one release | bound, {rounds} releases |
|---|---|---|---|---|---|---|
{table}
(`calibration` "paper": the classic sigma for eps = 1 every round, frozen bodies, so the guarantee is formal.)

How to read it:

* The signal accumulates: {rounds} releases give the differencing attack AUC {t4_seq:.3f} against {t4_one:.3f} for one
  (eps = 4 total), as GDP composition says (mu_total = mu sqrt R).
* Under the paper's per-round calibration the sequence attack ({p_seq:.3f}) beats what the stated per-round
  eps = 1 allows one release ({p_b1:.3f}) and stays under the composed bound ({p_b:.3f}): the per-round eps is not
  the protocol's guarantee; the composed eps ({p_eps:.2f}) is.
* Without noise (trained bodies, the server sees each client's upload), tracing reaches AUC {tr_het:.3f} on one
  round (heterogeneous; {tr_cnn:.3f} cnn). Summing the rounds' likelihood ratios gives nothing more
  ({sq_het:.3f} / {sq_cnn:.3f}): the other records repeat in every release. The rounds' *changes* carry new signal
  (the member's own feature moves as its body trains on it): {in_het:.3f} / {in_cnn:.3f}. With {pairs} pairs that
  gain is within a few standard errors: suggestive, not established.
* The DP runs above with trained bodies: under the valid total calibration every attack is at chance
  (differencing AUC {chance} at eps {eps_list}); under the paper's calibration the attack reaches {paper1:.3f}
  at a stated eps = 1 per round and {paper10:.1f} at eps >= 10 (no formal bound there).
"""


def fedlog_attacks() -> str:
    res = _fedlog()
    cfg = res["config"]
    at = {(r["calibration"], r["epsilon"]): r for r in res["attack"] if r["seed"] == 0}
    rows = []
    for (cal, eps), r in at.items():
        rows.append(f"| {cal} | {eps:g} | {r['composed_epsilon']:.3f} | {r['differencing_replay_first_round_auc']:.3f} | "
                    f"{r['differencing_replay_sequence_auc']:.3f} | {r['auc_bound_one_release']:.3f} | {r['auc_bound']:.3f} |")
    cmp_ = {(r["families"], r["method"]): r for r in res["compare"] if r["seed"] == 0}
    het, cnn = cmp_[("cnn+cnn-narrow+mlp", "fedlog")], cmp_[("cnn", "fedlog")]
    dp = {(r["mode"], r["epsilon"]): r for r in res["dp"] if r["seed"] == 0}
    fin = [e for e in cfg["eps"] if math.isfinite(e)]
    pairs = next(iter(at.values()))["pairs"]
    t4, p1 = at[("total", 4.0)], at[("paper", 1.0)]
    return FEDLOG_ATTACKS.format(
        clients=cfg["clients"], rounds=cfg["rounds"], clip=cfg["clip"], delta=cfg["delta"], pairs=pairs,
        sd=math.sqrt(1 / (4 * pairs)),
        table="\n".join(rows) + "\n", t4_seq=t4["differencing_replay_sequence_auc"],
        t4_one=t4["differencing_replay_first_round_auc"], p_seq=p1["differencing_replay_sequence_auc"],
        p_b1=p1["auc_bound_one_release"], p_b=p1["auc_bound"], p_eps=p1["composed_epsilon"],
        tr_het=het["tracing_first_round_auc"], tr_cnn=cnn["tracing_first_round_auc"],
        sq_het=het["tracing_sequence_auc"], sq_cnn=cnn["tracing_sequence_auc"],
        in_het=het["tracing_increments_auc"], in_cnn=cnn["tracing_increments_auc"],
        chance=" / ".join(f"{dp[('total-upload-bound', e)]['attack_auc_sequence']:.2f}" for e in fin),
        eps_list=" / ".join(f"{e:g}" for e in fin),
        paper1=dp[("paper", 1.0)]["attack_auc_sequence"], paper10=dp[("paper", 10.0)]["attack_auc_sequence"],
    )


# -- attacks ------------------------------------------------------------------------------------------
def _inversion() -> tuple[dict, object]:
    import importlib.util
    res = _committed("docs", "attacks-inversion.json")
    spec = importlib.util.spec_from_file_location("attacks_inversion", ROOT / "experiments" / "attacks_inversion.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return res, mod


INVERSION = """\
  {cells} cells per setting (numbers: docs/attacks-inversion.json, written by
  `{command}`; the feature decoder trained {dec_steps} steps, until its validation loss stopped improving
  (validation MSE {dec_val:.4f}); about half an hour on a loaded 2-core machine when the decoders train, minutes
  once they are cached by hash). Each reading is what the strongest attack in privfed reaches, next to chance
  and the n-guess prior: a claim only as strong as the attacks tried.

{table}

  * A single-record mean is inverted: the strongest attack in privfed ({n1_name}) identifies {n1:.0%} of
    {n1_imgs} images.
  * Means of 2 and 4 are not safe from a server that knows n: at n = 2 the strongest attack in privfed
    ({n2_name}, {n2_imgs} records) reaches {n2_reading};
    at n = 4 ({n4_name}, {n4_imgs} records) {n4_reading};
    {n2_dpsnr:+.1f} / {n4_dpsnr:+.1f} dB over the prior.
  * At n = 8 the strongest attack in privfed ({n8_name}) reaches {n8_reading};
    at n = 16 ({n16_name}) {n16_reading}.
{dp_lines}{secure_lines}  * Mean plus second moment (FedCGS, {cgs_n} records per client): the strongest attack in privfed
    ({cgs_name}) reaches {cgs_reading}, {cgs_dpsnr:+.1f} dB over the prior
    (the joint attacker matching G as well: {cgs_joint:.3f}).
"""


def inversion_reading(r: dict) -> str:
    """'X (SE s; chance c, n-guess prior p)' and how X stands against chance, from one record row.

    "at chance" is written only when X is within two standard errors of chance.
    """
    x, se, ch, pr = (r[k] for k in ("identification", "identification_se", "chance_identification",
                                    "baseline_identification"))
    text = f"{x:.3f} (SE {se:.3f}; chance {ch:.3f}, {r['n']}-guess prior {pr:.3f})"
    if x == 0:
        return text + ": no record identified"
    z = (x - ch) / se if se > 0 else (math.inf if x > ch else -math.inf if x < ch else 0.0)
    if abs(z) <= 2:
        return text + ", within two standard errors of chance: at chance"
    return text + (f", {z:.1f} standard errors above chance" if z > 0 else
                   f", {-z:.1f} standard errors below chance")


def inversion() -> str:
    """The inversion table and its readings, from docs/attacks-inversion.json (experiments/attacks_inversion.py)."""
    res, mod = _inversion()
    rows = res["rows"]
    by = {(r["setting"], r["n"]): r for r in rows}
    table = "\n".join("  " + line for line in mod.readme_table(rows))
    broken = []
    for r in rows:  # the strongest is the maximum over every attack of the suite that applies
        ids = [r[f"{name}:identification"] for name in mod.SUITE_ORDER if r.get(f"{name}:identification") ==
               r.get(f"{name}:identification")]
        if not ids or abs(r["identification"] - max(ids)) > 1e-12:
            broken.append(f"{r['setting']} n={r['n']}: strongest {r['identification']} is not the suite's maximum")
    if broken:
        raise RuntimeError(f"the README's inversion readings no longer hold: {broken}; rewrite the text")
    n1, n2, n4, n8, n16 = (by[("clean", n)] for n in (1, 2, 4, 8, 16))
    dps = [r for r in rows if r["setting"].startswith("dp")]
    sec = [r for r in rows if r["setting"] == "secure sum"]
    cgs = next(r for r in rows if r["setting"] == "mean + G")

    def lines(group, what):
        return "".join(f"  * {what(r)}: the strongest attack in privfed ({r['strongest']}) reaches\n"
                       f"    {inversion_reading(r)}, {r['delta_psnr']:+.1f} dB over the prior.\n" for r in group)

    dec = res["config"].get("feature_decoder", {})
    v = dict(
        cells=res["config"]["cells"], command=res["config"]["command"], table=table,
        dec_steps=dec.get("steps_trained", "?"), dec_val=dec.get("validation_mse", float("nan")),
        n1=n1["identification"], n1_name=n1["strongest"], n1_imgs=n1["images_scored"],
        n2_reading=inversion_reading(n2), n2_name=n2["strongest"], n2_imgs=n2["images_scored"],
        n4_reading=inversion_reading(n4), n4_name=n4["strongest"], n4_imgs=n4["images_scored"],
        n2_dpsnr=n2["delta_psnr"], n4_dpsnr=n4["delta_psnr"],
        n8_reading=inversion_reading(n8), n8_name=n8["strongest"],
        n16_reading=inversion_reading(n16), n16_name=n16["strongest"],
        dp_lines=lines(dps, lambda r: f"Record-level DP at ε = {r['setting'].split('=')[-1]}, means of {r['n']}"),
        secure_lines=lines(sec, lambda r: f"Secure sum of clients holding {r['n']} record(s) each (the server sees "
                                          f"only the class totals over all clients)"),
        cgs_n=cgs["n"], cgs_name=cgs["strongest"], cgs_reading=inversion_reading(cgs), cgs_dpsnr=cgs["delta_psnr"],
        cgs_joint=max(cgs["joint:identification"], cgs["joint-fit:identification"]),
    )
    return INVERSION.format(**v)


def singleton_exposure() -> str:
    """The singleton bullet, from experiments/attacks_singleton.py's record."""
    rec = _record("attacks_singleton")
    rows = rec["data"]["rows"]
    ten = {r["alpha"]: r for r in rows if r["scheme"] == "dirichlet" and r["samples_per_client"] == 10}
    iid = next(r for r in rows if r["scheme"] == "iid")
    lap = [r["exposed_laplace_eps1"] for r in rows if r["exposed_clean"] > 0]
    return (
        "* **Singleton exposure.** A client that holds one sample of a class uploads\n"
        "  that sample's raw feature as a \"mean\", and the attack recovers it exactly.\n"
        f"  With 10 samples per client, the share of exposed samples is {ten[0.1]['exposed_clean']:.1%} at\n"
        f"  Dirichlet α = 0.1, {ten[0.3]['exposed_clean']:.1%} at α = 0.3, {ten[1.0]['exposed_clean']:.1%} at α = 1, "
        f"and {iid['exposed_clean']:.0%} under IID\n"
        f"  ({iid['samples_per_client']} samples per client; `{rec['command']}`, {rec['data']['config']['seeds']} seeds).\n"
        f"  Laplace count noise at ε = 1 still leaves {min(lap):.1%}–{max(lap):.1%} exposed, because the\n"
        "  means go in clear.\n"
    )


def tracing_tables() -> str:
    """The membership section's tables, from experiments/attacks_tracing.py's record."""
    rec = _record("attacks_tracing")
    d = rec["data"]
    out = [
        f"  Clean class means of n records (`{rec['command']}`; {d['views'][0]['n_pos']} member / holdout pairs",
        "  per view), the strongest test per view and each test of the suite (FedNCM, one class of n records",
        "  per client, members paired with same-class holdouts):",
        "",
        "  | n | strongest | AUC | TPR@1% | TPR@0.1% | inner | lrt | lrt + support (aggregate) | learned |",
        "  | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in d["views"]:
        out.append(f"  | {r['n']} | {r['strongest_attack']} | {r['auc']:.3f} | {r['tpr@0.01']:.3f} | {r['tpr@0.001']:.3f} | "
                   f"{r['inner:auc']:.3f} | {r['lrt:auc']:.3f} | {r['lrt+support-aggregate:auc']:.3f} | {r['learned:auc']:.3f} |")
    out += [
        "",
        "  FedNCM on 20 Dirichlet(0.1) clients, record-level local Gaussian DP (δ = 1e-5), the strongest of",
        "  the suite against the GDP bound Φ(μ/√2) of the release:",
        "",
        "  | ε | strongest | AUC | TPR@1% | GDP bound | learned |",
        "  | --- | --- | --- | --- | --- | --- |",
    ]
    for r in d["local"]:
        eps = "∞" if not math.isfinite(float(r["eps"])) else f"{float(r['eps']):g}"
        bound = "1" if not math.isfinite(float(r["eps"])) else f"{r['auc_bound']:.3f}"
        out.append(f"  | {eps} | {r['strongest_attack']} | {r['auc']:.3f} | {r['tpr@0.01']:.3f} | {bound} | "
                   f"{r['learned:auc']:.3f} |")
    z = {r["z"]: r for r in d["dp"]}
    out += [
        "",
        "  Under Gaussian DP with noise multiplier z (n = 1), every test, the support tests included (their",
        "  tolerance is 4σ of the sum's noise), stays under the GDP bound Φ(1/(z√2)): the strongest reaches",
        f"  {z[0.5]['strongest_auc']:.3f} ≤ {z[0.5]['auc_bound']:.3f} at z = 0.5 and "
        f"{z[1.0]['strongest_auc']:.3f} ≤ {z[1.0]['auc_bound']:.3f} at z = 1.",
        "",
    ]
    bad = [r for r in d["local"] if math.isfinite(float(r["eps"])) and r["auc"] > r["auc_bound"] + 3 * r["auc_se"]]
    bad += [r for r in d["dp"] if r["strongest_auc"] > r["auc_bound"] + 3 * r[f"{r['strongest']}_auc_se"]]
    if bad:
        raise RuntimeError(f"a recorded tracing AUC is above its GDP bound: {bad}")
    return "\n".join(out)


def second_moments() -> str:
    """The second-moment bullet, from experiments/attacks_second_moment.py's record."""
    rec = _record("attacks_second_moment")
    d = rec["data"]
    clean = {r["n"]: r for r in d["subspace"] if r["sigma_second"] == 0}
    exact = max(n for n, r in clean.items() if r["auc"] >= 0.999)
    big = max(clean)
    unm = {r["n"]: r for r in d["unmixing"] if not r["with_sums"]}
    ns = [n for n in sorted(unm) if n > 1]
    noisy = {r["sigma_second"]: r for r in d["subspace"] if r["n"] == 1 and r["sigma_second"] > 0}
    s_half = min(s for s, r in noisy.items() if r["auc"] < 0.55)
    return (
        "* **Second moments** (Fed3R, FedCGS and fed3r-within upload G_k).\n"
        f"  Subspace membership has AUC {clean[exact]['auc']:.3f} on a clean G up to n = {exact} samples per\n"
        f"  client and {clean[big]['auc']:.2f} at n = {big}; under noise of σ = {s_half:g} on G it is {noisy[s_half]['auc']:.2f} "
        "even at n = 1.\n"
        "  Symmetric NMF (16 starts, the best finished by bounded L-BFGS-B) unmixes G_k into the individual\n"
        "  post-ReLU features of FedCGS clients: identification "
        + " / ".join(f"{unm[n]['identification']:.2f}" for n in ns) + " and relative error "
        + " / ".join(f"{unm[n]['relative_error']:.2f}" for n in ns) + f" at n = {' / '.join(map(str, ns))}\n"
        f"  ({unm[ns[0]]['clients']} clients per n; `{rec['command']}`).\n"
    )


@dataclasses.dataclass(frozen=True)
class Block:
    make: Callable[[], str]
    fast: bool
    what: str
    #: Regexes of machine-dependent spans, masked in the check and kept from the README when writing.
    volatile: tuple[str, ...] = ()


BLOCKS: dict[str, Block] = {
    "methods-table": Block(methods_table, True, "methods table (experiments/methods_table.py's numbers)"),
    "orderings": Block(orderings, True, "the orderings under the methods table (and their claims, checked)"),
    "command-1": Block(
        command_1,
        True,
        "the first command's printed output",
        volatile=(r"results/tradeoff-[^/\s]*/", r"\(\d+(?:\.\d+)? s\)"),
    ),
    "snippet": Block(snippet, True, "the code snippet, run, with the score its comment quotes"),
    "calibration": Block(calibration, True, "the calibration bullet (analytic and classic sigma, the classic sigma's real eps)"),
    "dropouts": Block(dropouts, True, "the report bullet's dropout example (eps from the noise shares present)"),
    "tradeoff-readings": Block(readings, True, "the trade-off readings (from experiments/results/recipes.json)"),
    "noise-aware": Block(noise_aware, True, "the noise-aware bullet (from experiments/results/noise_aware.json)"),
    "secagg-cost": Block(secagg_table, True, "the secure-aggregation cost table (experiments/results/bench_secagg.json)"),
    "bench-tradeoff": Block(bench_tradeoff_table, True, "the sweep's speed table (experiments/results/bench_tradeoff.json)"),
    "flower-bytes": Block(flower_bytes, True, "bytes per protocol on Flower (experiments/results/bench_flower.json)"),
    "flower-audit": Block(flower_audit, True, "audits of the Flower DP paths (experiments/results/bench_flower.json)"),
    "flower-cost": Block(flower_cost, True, "start-up, scale and memory on Flower (experiments/results/bench_flower.json)"),
    "audit-sweep": Block(audit_sweep_table, True, "the audit sweep's table (experiments/audit_sweep_results.json)"),
    "sampling": Block(sampling, True, "the client-sampling bullet (one sampled release through privfed.fit)"),
    "bench-scale": Block(bench_scale_tables, True, "the scale benchmark's tables (experiments/bench_scale.json)"),
    "scale-readings": Block(scale_readings, True, "the readings under the scale tables (experiments/bench_scale.json)"),
    "fedlog-training": Block(fedlog_training, True, "FedLog over rounds: training (experiments/results/fedlog_rounds.json)"),
    "fedlog-composition": Block(fedlog_composition, True, "the paper's per-round eps composed exactly (computed)"),
    "fedlog-dp": Block(fedlog_dp, True, "FedLog over rounds under DP (experiments/results/fedlog_rounds.json)"),
    "fedlog-attacks": Block(fedlog_attacks, True, "FedLog attacks across rounds (experiments/results/fedlog_rounds.json)"),
    "inversion": Block(inversion, True, "the inversion table and readings (docs/attacks-inversion.json)"),
    "singleton": Block(singleton_exposure, True, "the singleton bullet (experiments/results/attacks_singleton.json)"),
    "tracing": Block(tracing_tables, True, "the membership tables (experiments/results/attacks_tracing.json)"),
    "second-moments": Block(second_moments, True, "the second-moment bullet (experiments/results/attacks_second_moment.json)"),
    "audit": Block(
        audit_figures, True, "the DP audit figures (the suite's audits, rerun)", volatile=(r"about \d+(?:\.\d+)? s\.",)
    ),
}


# -- reading, comparing, writing ----------------------------------------------------------------------
@dataclasses.dataclass
class Found:
    name: str
    tol: float
    start: int  # offset of the block's text (after the opening marker)
    end: int  # offset of the closing marker
    text: str


def find_blocks(readme: str) -> dict[str, Found]:
    """The marked blocks of ``readme`` by name."""
    out: dict[str, Found] = {}
    for m in _OPEN.finditer(readme):
        name = m.group("name")
        close = f"<!-- /readme-numbers:{name} -->"
        end = readme.find(close, m.end())
        if end < 0:
            raise ValueError(f"README block {name!r} has no closing marker {close!r}")
        attrs = dict(kv.split("=", 1) for kv in m.group("attrs").split() if "=" in kv)
        out[name] = Found(name, float(attrs.get("tol", 0)), m.end(), end, readme[m.end() : end])
    return out


def _mask(text: str, volatile) -> str:
    for pattern in volatile:
        text = re.sub(pattern, "<machine>", text)
    return text


def numbers(text: str) -> list[str]:
    """Every number in ``text`` as printed (thousands separators kept)."""
    return _NUMBER.findall(text)


def compare(name: str, readme_text: str, new_text: str, tol: float = 0.0, volatile=()) -> list[str]:
    """Differences between a README block and its regenerated text (empty when they agree)."""
    old, new = _mask(readme_text, volatile), _mask(new_text, volatile)
    a, b = numbers(old), numbers(new)
    problems = []
    if len(a) != len(b):
        problems.append(f"{name}: the README block has {len(a)} numbers, the regenerated one {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        try:
            dx = abs(float(x.replace(",", "")) - float(y.replace(",", "")))
        except ValueError:  # pragma: no cover - the regex only matches numbers
            dx = float("inf")
        if not dx <= tol:
            problems.append(f"{name}: number {i + 1} is {x} in the README, {y} regenerated (tolerance {tol:g})")
    if not problems and re.sub(_NUMBER, "#", old) != re.sub(_NUMBER, "#", new):
        import difflib

        diff = [
            line for line in difflib.unified_diff(old.splitlines(), new.splitlines(), "README", "regenerated", n=0, lineterm="")
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        problems.append(f"{name}: the text around the numbers differs from the regenerated text: " + " | ".join(diff[:6]))
    return problems


def _keep_volatile(old: str, new: str, volatile) -> str:
    """``new`` with its machine-dependent spans replaced by the README's, where both have them."""
    for pattern in volatile:
        olds = re.findall(pattern, old)
        if olds and len(olds) == len(re.findall(pattern, new)):
            it = iter(olds)
            new = re.sub(pattern, lambda m: next(it), new)
    return new


def regenerate(names=None, fast_only: bool = False) -> dict[str, str]:
    chosen = [n for n in BLOCKS if (names is None or n in names) and (BLOCKS[n].fast or not fast_only)]
    return {n: BLOCKS[n].make() for n in chosen}


def check(readme: str, fresh: dict[str, str]) -> list[str]:
    found = find_blocks(readme)
    problems = []
    for name, text in fresh.items():
        if name not in found:
            problems.append(f"{name}: no '<!-- readme-numbers:{name} -->' block in the README")
            continue
        f = found[name]
        problems += compare(name, f.text, text, f.tol, BLOCKS[name].volatile)
    return problems


def write(readme: str, fresh: dict[str, str]) -> str:
    found = find_blocks(readme)
    for name in sorted(fresh, key=lambda n: -found[n].start if n in found else 0):
        if name not in found:
            raise SystemExit(f"README has no '<!-- readme-numbers:{name} -->' block; add the markers first")
        f = found[name]
        text = _keep_volatile(f.text, fresh[name], BLOCKS[name].volatile)
        readme = readme[: f.start] + text + readme[f.end :]
    return readme


# -- numbers outside the blocks -----------------------------------------------------------------------
#: A number that looks measured: a decimal, or a number with a unit of size, time, ratio or share.
_MEASURED = re.compile(
    r"(?<![\w.^-])\d+(?:,\d{3})*(?:\.\d+)?(?:\s?(?:%|×|x\b|dB\b|ms\b|s\b|min\b|kB\b|KB\b|MB\b|GB\b|GiB\b|MiB\b))"
    r"|(?<![\w.^-])\d+\.\d+(?![\w.])"
)

#: Numbers the README may state outside the blocks: inputs, versions and constants, never results.
#: Each maps to why it is not a measurement; a constant maps to (why, a check against the code), and
#: tests/test_readme.py runs every check.
def _weights_kb() -> bool:
    return round((ROOT / "privfed" / "data" / "digits_cnn_seed0.npz").stat().st_size / 1000) == 152


def _dense_limit() -> bool:
    import privfed.stats

    return "PRIVFED_DENSE_VIEW_LIMIT" in __import__("os").environ or privfed.stats.DENSE_VIEW_LIMIT == 2 * 2**30


def _npz_limit() -> bool:
    from privfed.data import npzfile

    return npzfile.DEFAULT_MAX_BYTES == 2**30


def _checkpoint() -> bool:
    from privfed import attack, tradeoff

    return tradeoff.CHECKPOINT_S == attack.CHECKPOINT_S == 30.0


def _inat_dense_gib() -> bool:  # (K, C, d) float64 class sums at the iNat-120K shape
    return round(9275 * 1203 * 1280 * 8 / 2**30) == 106


def _paper_upload() -> bool:  # the FedCOF paper's App. H figures, reproduced by the byte model
    from tests.test_upload import INAT, mb

    return round(mb("fedncm", **INAT), 1) == 279.5 and round(mb("fed3r", **INAT), 1) == 61064.1


def _scale_cap() -> bool:
    from tests import test_scale

    return test_scale.CAP == 160 * 2**20 and round(8 * test_scale.K * test_scale.C * test_scale.D / 1e9, 2) == 1.23


def _claimed_mu() -> bool:  # the audits' claim at eps = 4, delta = 1e-5
    from mechanisms.calibration import gdp_mu

    return f"{gdp_mu(4.0, 1e-5):.3f}" == "0.925"


def _sampled_claim() -> bool:  # the audit sweep's claimed eps with Poisson sampling at q = 0.25
    res = _committed("experiments", "audit_sweep_results.json")
    claims = {f"{r['claimed_eps']:.3f}" for r in res["rows"] if "sampled" in r["configuration"]
              and r.get("claimed_eps") is not None and r["verdict"] == "statistical"}
    return claims == {"3.997"} and res["sampling"] == 0.25


@functools.lru_cache(maxsize=None)
def _fedlog_small_features() -> bool:  # the reliability bullet: FedLog on digits features x 1e-3
    import privfed
    from privfed.federation import partition

    ds = _digits()
    F, y, k = partition(ds.train_labels, 100, "dirichlet", alpha=0.1, rng=0).apply(ds.train_features, ds.train_labels)
    small = privfed.fit("fedlog", F * 1e-3, y, k).score(ds.test_features * 1e-3, ds.test_labels)
    auto = privfed.fit("fedlog", F * 1e-3, y, k, feature_scale="auto").score(ds.test_features * 1e-3, ds.test_labels)
    return f"{small:.3f}" == "0.100" and f"{auto:.3f}" == "0.955"


STATED: dict[str, object] = {
    "0.925": ("the claimed mu of the audits at eps = 4", _claimed_mu, "μ = 0.925"),
    "3.997": ("the audit sweep's claimed eps with client sampling", _sampled_claim, "claimed ε = 3.997"),
    "0.25": "the audit sweep's sampling rate (an input)",
    "0.100": ("FedLog on features x 1e-3", _fedlog_small_features, "accuracy 0.100, or 0.955"),
    "0.955": ("FedLog on features x 1e-3 with feature_scale='auto'", _fedlog_small_features, "accuracy 0.100, or 0.955"),
    "1%": "a false-positive rate (an input)", "2KB": "a formula (2 K B)", "8×": "the digits' image size",
    "40 dB": "the PSNR cap (an input of the metric)",
    "3.11": "Python version",
    "2.14.1": "pinned torch", "0.29.1": "pinned torchvision", "1.41.0": "pinned flwr", "25.0": "pinned packaging",
    "2.1": "minimum torch",
    "0.05": "an input eps", "0.1": "an input eps / Dirichlet alpha", "0.2": "an input eps", "0.3": "Dirichlet alpha",
    "0.5": "an input eps / alpha / chance level", "0.9": "an input eps", "1.0": "an input eps", "2.0": "an input eps",
    "0.01": "the FedLog paper's delta", "2.5": "an invalid input in an example", "3.7": "an invalid input in an example",
    "4.5": "a section number of the FedLog paper", "3.1": "a theorem number of the FedLog paper",
    "152 KB": ("the shipped weights' size", _weights_kb),
    "2 GiB": ("privfed.stats.DENSE_VIEW_LIMIT", _dense_limit),
    "1 GiB": ("privfed.data.npzfile.DEFAULT_MAX_BYTES", _npz_limit),
    "30 s": ("the commands' checkpoint interval", _checkpoint),
    "106 GiB": ("(K, C, d) float64 at the iNat-120K shape", _inat_dense_gib),
    "279.5 MB": ("the FedCOF paper's figure, reproduced", _paper_upload),
    "61,064.1 MB": ("the FedCOF paper's figure, reproduced", _paper_upload),
    "160 MB": ("tests/test_scale.py's memory cap", _scale_cap),
    "1.23 GB": ("tests/test_scale.py's dense class sums", _scale_cap),
    "64 ×": "digits' feature width (d × d)", "2 ×": "the memory target's factor",
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
        return not (isinstance(v, tuple) and len(v) > 2 and v[2] not in line)  # a constant only where it is stated

    return [f"README line {i}: {tok!r} in {line.strip()[:100]!r}" for i, tok, line in outside_blocks(readme)
            if not ok(tok, line)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="compare the README's blocks with regenerated ones")
    g.add_argument("--write", action="store_true", help="rewrite the README's blocks")
    g.add_argument("--show", metavar="NAME", help="print one regenerated block")
    g.add_argument("--list", action="store_true", help="list the blocks")
    p.add_argument("--only", metavar="LIST", help="comma-separated block names")
    p.add_argument("--readme", default=str(README), help="the README to check or write")
    args = p.parse_args(argv)
    if args.list:
        for name, b in BLOCKS.items():
            print(f"{name:15s} {'fast' if b.fast else 'slow'}  {b.what}")
        return 0
    if args.show:
        if args.show not in BLOCKS:
            raise SystemExit(f"unknown block {args.show!r}; choose from {sorted(BLOCKS)}")
        print(BLOCKS[args.show].make(), end="")
        return 0
    names = None if not args.only else args.only.split(",")
    path = pathlib.Path(args.readme)
    readme = path.read_text(encoding="utf-8")
    fresh = regenerate(names)
    if args.write:
        path.write_text(write(readme, fresh), encoding="utf-8")
        print(f"rewrote {len(fresh)} block(s) of {path}: {', '.join(fresh)}")
        return 0
    problems = check(readme, fresh)
    for line in problems:
        print(line)
    print(f"{len(fresh) - len({p.split(':')[0] for p in problems})} of {len(fresh)} block(s) agree")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
