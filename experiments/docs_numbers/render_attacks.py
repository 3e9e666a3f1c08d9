"""Blocks of the attacks: inversion, singleton exposure, tracing, second moments."""

from __future__ import annotations

import math

from experiments.docs_numbers.sources import ROOT, committed, record, template


def _inversion() -> tuple[dict, object]:
    import importlib.util
    res = committed("docs", "attacks-inversion.json")
    spec = importlib.util.spec_from_file_location("attacks_inversion", ROOT / "experiments" / "attacks_inversion.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return res, mod


INVERSION = template("inversion")


def inversion() -> str:
    """The inversion table and its readings, from docs/attacks-inversion.json (experiments/attacks_inversion.py)."""
    from scipy.stats import binomtest

    res, mod = _inversion()
    rows = res["rows"]
    by = {(r["setting"], r["n"]): r for r in rows}
    table = "\n".join("  " + line for line in mod.readme_table(rows))
    n1, n2, n4, n8 = (by[("clean", n)] for n in (1, 2, 4, 8))
    dps = [r for r in rows if r["setting"].startswith("dp")]
    cgs = next(r for r in rows if r["setting"] == "mean + G")
    k4 = round(n4["identification"] * n4["images_scored"])
    v = dict(
        cells=res["config"]["cells"], command=res["config"]["command"], table=table,
        n1_learned=n1["learned:identification"], n1_imgs=n1["images_scored"], n1_pixel=n1["pixel:identification"],
        n2_set=n2["set:identification"], n2_imgs=n2["images_scored"],
        n2_ratio=n2["set:identification"] / n2["baseline_identification"],
        n4_set=n4["set:identification"], n4_imgs=n4["images_scored"],
        n4_ratio=n4["set:identification"] / n4["baseline_identification"],
        n4_p=binomtest(k4, n4["images_scored"], n4["baseline_identification"], alternative="greater").pvalue,
        n2_dpsnr=n2["delta_psnr"], n4_dpsnr=n4["delta_psnr"], n8_id=n8["identification"],
        n8_ch=n8["chance_identification"], n8_dpsnr=n8["delta_psnr"], n8_se=n8["delta_psnr_se"],
        dp_id=max(r["identification"] for r in dps) * dps[0]["images_scored"],
        dp_lo=-max(r["delta_psnr"] for r in dps), dp_hi=-min(r["delta_psnr"] for r in dps), cgs_n=cgs["n"],
        cgs_two=cgs["two-stage:identification"], cgs_dpsnr=cgs["delta_psnr"], cgs_set=cgs["set:identification"],
    )
    claims = {"n = 1 inverted": v["n1_learned"] >= v["n1_pixel"] and v["n1_learned"] > 0.9,
              "set beats the prior at n = 2 and 4": v["n2_ratio"] > 1 and v["n4_ratio"] > 1 and v["n4_p"] < 0.05,
              "DP at zero": v["dp_id"] == 0 and v["dp_hi"] > 0,
              "n = 16 below the prior": by[("clean", 16)]["delta_psnr"] < 0}
    broken = [k for k, ok in claims.items() if not ok]
    if broken:
        raise RuntimeError(f"the README's inversion readings no longer hold: {broken}; rewrite the text")
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
        "  that sample's raw feature as a \"mean\", and the attack recovers it exactly.\n"
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
        + " / ".join(f"{unm[n]['identification']:.2f}" for n in ns) + " and relative error "
        + " / ".join(f"{unm[n]['relative_error']:.2f}" for n in ns) + f" at n = {' / '.join(map(str, ns))}\n"
        f"  ({unm[ns[0]]['clients']} clients per n; `{rec['command']}`).\n"
    )
