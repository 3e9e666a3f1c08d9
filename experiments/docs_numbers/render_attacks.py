"""Blocks of the attacks: inversion, singleton exposure, tracing, second moments."""

from __future__ import annotations

import math

from experiments.docs_numbers.sources import ROOT, committed, record, template


def _inversion() -> tuple[dict, object]:
    import importlib.util

    res = committed("docs", "attacks-inversion.json")
    spec = importlib.util.spec_from_file_location(
        "attacks_inversion", ROOT / "experiments" / "attacks_inversion.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return res, mod


INVERSION = template("inversion")


def inversion_reading(r: dict) -> str:
    """'X (SE s; chance c, n-guess prior p)' and how X stands against chance, from one record row.

    "at chance" is written only when X is within two standard errors of chance.
    """
    x, se, ch, pr = (
        r[k]
        for k in ("identification", "identification_se", "chance_identification", "baseline_identification")
    )
    text = f"{x:.3f} (SE {se:.3f}; chance {ch:.3f}, {r['n']}-guess prior {pr:.3f})"
    if x == 0:
        return text + ": no record identified"
    z = (x - ch) / se if se > 0 else (math.inf if x > ch else -math.inf if x < ch else 0.0)
    if abs(z) <= 2:
        return text + ", within two standard errors of chance: at chance"
    return text + (
        f", {z:.1f} standard errors above chance" if z > 0 else f", {-z:.1f} standard errors below chance"
    )


def inversion() -> str:
    """The inversion table and its readings, from docs/attacks-inversion.json (experiments/attacks_inversion.py)."""
    res, mod = _inversion()
    rows = res["rows"]
    by = {(r["setting"], r["n"]): r for r in rows}
    table = "\n".join("  " + line for line in mod.readme_table(rows))
    broken = []
    for r in rows:  # the strongest is the maximum over every attack of the suite that applies
        ids = [
            r[f"{name}:identification"]
            for name in mod.SUITE_ORDER
            if r.get(f"{name}:identification") == r.get(f"{name}:identification")
        ]
        if not ids or abs(r["identification"] - max(ids)) > 1e-12:
            broken.append(
                f"{r['setting']} n={r['n']}: strongest {r['identification']} is not the suite's maximum"
            )
    if broken:
        raise RuntimeError(f"the README's inversion readings no longer hold: {broken}; rewrite the text")
    n1, n2, n4, n8, n16 = (by[("clean", n)] for n in (1, 2, 4, 8, 16))
    dps = [r for r in rows if r["setting"].startswith("dp")]
    sec = [r for r in rows if r["setting"] == "secure sum"]
    cgs = next(r for r in rows if r["setting"] == "mean + G")

    def lines(group, what):
        return "".join(
            f"  * {what(r)}: the strongest attack in privfed ({r['strongest']}) reaches\n"
            f"    {inversion_reading(r)}, {r['delta_psnr']:+.1f} dB over the prior.\n"
            for r in group
        )

    dec = res["config"].get("feature_decoder", {})
    sets = dec.get("set_decoders")
    if not sets:
        raise RuntimeError(
            "docs/attacks-inversion.json records no set decoder (steps, validation loss); regenerate it with "
            "experiments/attacks_inversion.py"
        )
    v = dict(
        cells=res["config"]["cells"],
        command=res["config"]["command"],
        table=table,
        dec_steps=dec.get("steps_trained", "?"),
        dec_val=dec.get("validation_mse", float("nan")),
        set_ns=" / ".join(sets),
        set_steps=" / ".join(str(sets[n]["steps_trained"]) for n in sets),
        set_val=" / ".join(f"{sets[n]['validation_mse']:.4f}" for n in sets),
        n1=n1["identification"],
        n1_name=n1["strongest"],
        n1_imgs=n1["images_scored"],
        n2_reading=inversion_reading(n2),
        n2_name=n2["strongest"],
        n2_imgs=n2["images_scored"],
        n4_reading=inversion_reading(n4),
        n4_name=n4["strongest"],
        n4_imgs=n4["images_scored"],
        n2_dpsnr=n2["delta_psnr"],
        n4_dpsnr=n4["delta_psnr"],
        n8_reading=inversion_reading(n8),
        n8_name=n8["strongest"],
        n16_reading=inversion_reading(n16),
        n16_name=n16["strongest"],
        dp_lines=lines(
            dps, lambda r: f"Record-level DP at ε = {r['setting'].split('=')[-1]}, means of {r['n']}"
        ),
        secure_lines=lines(
            sec,
            lambda r: (
                f"Secure sum of clients holding {r['n']} record(s) each (the server sees "
                f"only the class totals over all clients)"
            ),
        ),
        cgs_n=cgs["n"],
        cgs_name=cgs["strongest"],
        cgs_reading=inversion_reading(cgs),
        cgs_dpsnr=cgs["delta_psnr"],
        cgs_joint=max(cgs[f"{k}:identification"] for k in ("joint", "joint-fit", "joint-wide")),
    )
    return INVERSION.format(**v)


def singleton_exposure() -> str:
    """The singleton bullet, from experiments/attacks_singleton.py's record."""
    rec = record("attacks_singleton")
    rows = rec["data"]["rows"]
    ten = {r["alpha"]: r for r in rows if r["scheme"] == "dirichlet" and r["samples_per_client"] == 10}
    iid = next(r for r in rows if r["scheme"] == "iid")
    lap = [r["exposed_laplace_eps1"] for r in rows if r["exposed_clean"] > 0]
    return (
        "* **Singleton exposure.** A client that holds one sample of a class uploads\n"
        '  that sample\'s raw feature as a "mean", and the attack recovers it exactly.\n'
        f"  With 10 samples per client ({ten[0.1]['clients']} clients), the share of exposed samples is "
        f"{ten[0.1]['exposed_clean']:.1%} at\n"
        f"  Dirichlet α = 0.1, {ten[0.3]['exposed_clean']:.1%} at α = 0.3, {ten[1.0]['exposed_clean']:.1%} at α = 1, "
        f"and {iid['exposed_clean']:.0%} under IID\n"
        f"  ({iid['clients']} clients of {iid['samples_per_client']} samples; `{rec['command']}`, "
        f"{rec['data']['config']['seeds']} seeds).\n"
        f"  Laplace count noise at ε = 1 still leaves {min(lap):.1%}–{max(lap):.1%} exposed, because the\n"
        "  means go in clear.\n"
    )


def tracing_tables() -> str:
    """The membership section's tables, from experiments/attacks_tracing.py's record."""
    rec = record("attacks_tracing")
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
        out.append(
            f"  | {r['n']} | {r['strongest_attack']} | {r['auc']:.3f} | {r['tpr@0.01']:.3f} | {r['tpr@0.001']:.3f} | "
            f"{r['inner:auc']:.3f} | {r['lrt:auc']:.3f} | {r['lrt+support-aggregate:auc']:.3f} | {r['learned:auc']:.3f} |"
        )
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
        out.append(
            f"  | {eps} | {r['strongest_attack']} | {r['auc']:.3f} | {r['tpr@0.01']:.3f} | {bound} | "
            f"{r['learned:auc']:.3f} |"
        )
    z = {r["z"]: r for r in d["dp"]}
    out += [
        "",
        "  Under Gaussian DP with noise multiplier z (n = 1), every test, the support tests included (their",
        "  tolerance is 4σ of the sum's noise), stays under the GDP bound Φ(1/(z√2)): the strongest reaches",
        f"  {z[0.5]['strongest_auc']:.3f} ≤ {z[0.5]['auc_bound']:.3f} at z = 0.5 and "
        f"{z[1.0]['strongest_auc']:.3f} ≤ {z[1.0]['auc_bound']:.3f} at z = 1.",
        "",
    ]
    bad = [
        r
        for r in d["local"]
        if math.isfinite(float(r["eps"])) and r["auc"] > r["auc_bound"] + 3 * r["auc_se"]
    ]
    bad += [r for r in d["dp"] if r["strongest_auc"] > r["auc_bound"] + 3 * r[f"{r['strongest']}_auc_se"]]
    if bad:
        raise RuntimeError(f"a recorded tracing AUC is above its GDP bound: {bad}")
    return "\n".join(out)


def second_moments() -> str:
    """The second-moment bullet, from experiments/attacks_second_moment.py's record."""
    rec = record("attacks_second_moment")
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
        + " / ".join(f"{unm[n]['identification']:.2f}" for n in ns)
        + " and relative error "
        + " / ".join(f"{unm[n]['relative_error']:.2f}" for n in ns)
        + f" at n = {' / '.join(map(str, ns))}\n"
        f"  ({unm[ns[0]]['clients']} clients per n; `{rec['command']}`).\n"
    )


ROUNDS_INVERSION = template("rounds-inversion")


def rounds_inversion() -> str:
    """Inversion against the multi-round FedLog release, from docs/attacks-rounds-inversion.json."""
    res = committed("docs", "attacks-rounds-inversion.json")
    rows, cfg = res["rows"], res["config"]
    checks = cfg["checks"]
    bad = [
        c
        for c in checks
        if not c["rounds_identical"] or c["max_rel_error"] > 1e-9 or c["max_rel_error_vs_features"] > 1e-5
    ]
    if bad:
        raise RuntimeError(f"the recorded uploads are not the multi-round release: {bad}; rerun the script")
    suite = ("pixel", "learned", "set", "joint", "joint-fit", "joint-wide", "per-cell")
    for r in rows:
        ids = [
            r[f"{k}:identification"] for k in suite if r[f"{k}:identification"] == r[f"{k}:identification"]
        ]
        if abs(r["identification"] - max(ids)) > 1e-12:
            raise RuntimeError(
                f"{r['setting']} ({r['clients']} clients): strongest is not the suite's maximum"
            )
    table = [
        "  | clients | release | records per cell (median) | strongest | identification (SE) | guesses | "
        "prior | chance | ΔPSNR over the prior (SE) |",
        "  | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines = []
    for r in rows:
        guesses = round(r["reconstructions"] / r["cells"])
        release = "each client's upload" if r["setting"] == "uploads" else "secure sum"
        table.append(
            f"  | {r['clients']} | {release} | {r['median_records_per_cell']:g} | {r['strongest']} | "
            f"{r['identification']:.3f} ({r['identification_se']:.3f}) | {guesses} | "
            f"{r['baseline_identification']:.3f} | {r['chance_identification']:.3f} | "
            f"{r['delta_psnr']:+.2f} dB ({r['delta_psnr_se']:.2f}) |"
        )
        where = (
            f"{r['clients']} clients, each client's upload (median {r['median_records_per_cell']:g} "
            f"record{'' if r['median_records_per_cell'] == 1 else 's'} per released cell)"
            if r["setting"] == "uploads"
            else f"{r['clients']} clients, secure sum (the class totals only)"
        )
        lines.append(
            f"  * Multi-round FedLog, {where}: the strongest attack in privfed ({r['strongest']}) reaches\n"
            f"    {inversion_reading({**r, 'n': guesses})}.\n"
        )
    return ROUNDS_INVERSION.format(
        rounds=checks[0]["rounds"],
        rel=(
            "exactly"
            if max(c["max_rel_error"] for c in checks) == 0
            else f"to a relative {max(c['max_rel_error'] for c in checks):.0e}"
        ),
        rel_f=max(c["max_rel_error_vs_features"] for c in checks),
        cells=cfg["cells"],
        command=cfg["command"],
        table="\n".join(table),
        lines="".join(lines),
    )
