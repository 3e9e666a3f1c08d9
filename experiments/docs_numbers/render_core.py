"""Blocks computed on the spot: the methods table, the first command, the quickstart, calibration, audits."""

from __future__ import annotations

import contextlib
import functools
import io
import pathlib
import tempfile
import warnings

import numpy as np

from experiments.docs_numbers.sources import digits_dataset, template


@functools.cache
def _accuracies(extra: tuple = ()) -> dict:
    """label -> (accuracies over the 5 seeds, mean upload bytes, method class) on the methods-table setting."""
    import privfed
    from experiments.methods_table import VARIANTS
    from privfed.federation import partition

    ds = digits_dataset()
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


ORDERINGS = template("orderings")


def orderings() -> str:
    """The orderings bullets under the methods table; refuses to write a claim the numbers contradict."""
    acc = _accuracies(extra=(("fed3r-within", (("gamma", 0.0),)),))
    m = {label: float(np.mean(a)) for label, (a, _, _) in acc.items()}
    ds = digits_dataset()
    values = dict(
        fedcof=m["fedcof"],
        fedncm=m["fedncm"],
        fed3r=m["fed3r"],
        within=m["fed3r-within"],
        within0=m["fed3r-within (gamma=0.0)"],
        dead=int(np.sum(~np.any(ds.train_features != 0, axis=0))),
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


def protections() -> str:
    """Which protection each method supports, asked of the public API: a tiny fit of every method under each
    protection (no hand-kept marks; a refusal is a "no" with the reason the API gives)."""
    import numpy as np

    import privfed
    from mechanisms import GaussianMechanism
    from mechanisms.secagg import PairwiseMasking
    from privfed.errors import PrivfedError
    from privfed.methods import Method

    rng = np.random.default_rng(0)
    F, y, k = rng.normal(size=(60, 3)), np.arange(60) % 2, np.arange(60) % 4

    def cell(name: str, **protection) -> str:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the numpy backend's floating-point note
                head = privfed.fit(name, F, y, k, num_classes=2, num_clients=4, random_state=0, **protection)
        except PrivfedError as exc:
            return f"no ({str(exc).split(';')[0].removeprefix(f'method {name!r} ')})"
        privacy = protection.get("privacy")
        if privacy is not None and privacy.trusted_aggregator and "(central)" not in head.privacy.guarantee:
            return "no (needs every client's statistics: the noise stays on each upload)"
        return "yes"

    lines = [
        "| method | uploads | DP, noise on each upload | DP, trusted aggregator | secure aggregation (mask) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in privfed.methods.available():
        cls = privfed.methods.get_class(name)
        blocks = tuple(b for b in ("sums", "counts", "second") if b in cls.requires) or ("sums", "counts")
        dp = {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, "blocks": blocks}
        how = f" with blocks={blocks}" if "second" in blocks else ""
        local = cell(name, privacy=GaussianMechanism(**dp))
        trusted = cell(name, privacy=GaussianMechanism(**dp, trusted_aggregator=True))
        secure = cell(name, secure_agg=PairwiseMasking())
        if secure == "yes" and type.__getattribute__(cls, "secure_aggregate") is not Method.secure_aggregate:
            secure = "yes (its own two-round protocol)"
        row = [local + (how if local == "yes" else ""), trusted + (how if trusted == "yes" else ""), secure]
        lines.append(f"| {name} | {', '.join(sorted(cls.requires))} | {' | '.join(row)} |")
    return "\n".join(lines) + "\n"


#: The README's first command, as run here (with a temporary --out and no progress bar).
COMMAND_1 = ["--method", "fedlog", "--eps", "0.1", "--seeds", "5"]


def command_1() -> str:
    """What ``python -m privfed.tradeoff --method fedlog --eps 0.1 --seeds 5`` prints."""
    from mechanisms.dp.backends import NumpyNoise
    from privfed.commands import tradeoff

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


SNIPPET = template("snippet")


def snippet() -> str:
    """The README's code snippet, run: the value its comment quotes is the one it computes."""
    code = SNIPPET.split("```python\n", 1)[1].rsplit("```", 1)[0]
    code = code.replace(
        "head.score(ds.test_features, ds.test_labels)", "score = head.score(ds.test_features, ds.test_labels)"
    )
    code = code.replace("print(private.privacy.guarantee)", "guarantee = private.privacy.guarantee")
    ns: dict = {}
    exec(compile(code.replace("{score}", ""), "<README snippet>", "exec"), ns)  # noqa: S102 - our own text
    return SNIPPET.replace("{score}", f"{ns['score']:.3f}")


AUDIT = template("audit")


def audit_figures() -> str:
    """The audit bullet: the suite's audits (tests/audit/test_audit.py's mechanisms and seeds), rerun."""
    import time
    import warnings

    from tests.audit.test_audit import DRAWS, GaussianMechanism, HalvedNoise, NoClipping, SecondWithC, _run

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
        lo1=min(lb(real1)),
        hi1=max(lb(real1)),
        claim1=real1["sums"].claimed_mu,
        halved1=float(np.mean(lb(halved1))),
        noclip1=float(np.mean([noclip1["sums"].mu_lb, noclip1["second"].mu_lb])),
        lo4=min(lb(real4)),
        hi4=max(lb(real4)),
        claim4=real4["sums"].claimed_mu,
        c4=c4["second"].mu_lb,
    )


CALIBRATION = template("calibration")


def calibration() -> str:
    """The calibration bullet: analytic and classic σ, and the ε the classic σ really gives."""
    from mechanisms.dp.calibration import analytic_sigma, classic_sigma, gdp_epsilon

    return CALIBRATION.format(
        analytic=analytic_sigma(1.0, 1e-5),
        classic=classic_sigma(1.0, 1e-5),
        classic2=gdp_epsilon(1.0 / classic_sigma(2.0, 1e-5, warn=False), 1e-5),
    )


DROPOUTS = template("dropouts")


def dropouts() -> str:
    """The report bullet's dropout example, computed by the pipeline's own secure-sum accounting."""
    from mechanisms.dp.calibration import gdp_epsilon, gdp_mu

    clients, present, delta = 10, 6, 1e-5
    share = present / clients
    eps = gdp_epsilon(gdp_mu(1.0, delta) / np.sqrt(share), delta)
    return DROPOUTS.format(present=present, clients=clients, share=share, eps=eps)


SAMPLING = template("sampling")


def sampling() -> str:
    """The client-sampling bullet: one sampled release through privfed.fit, its report and its μ."""
    import warnings

    import privfed
    from mechanisms import GaussianMechanism
    from mechanisms.dp.calibration import gdp_epsilon

    q = 0.01
    mech = GaussianMechanism(
        epsilon=1.0,
        delta=1e-5,
        clip=1.0,
        level="client",
        max_records=20,
        trusted_aggregator=True,
        sampling_rate=q,
    )
    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(size=(60, 4)))
    y, k = np.arange(60) % 3, np.arange(60) % 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=6, privacy=mech, random_state=0)
    return SAMPLING.format(q=q, mu=mech.mu, eps_plain=gdp_epsilon(mech.mu, 1e-5), eps=head.privacy.epsilon)
