"""The CPU rates behind ``python -m privfed.attack``'s estimate (:data:`privfed.commands.attack.prepare.RATES`).

    python experiments/attack_cost.py [--cache DIR] [--record]

* Decoder training: CPU seconds per step (one torch thread, the full-strength
  architecture) of the feature decoder and of the set decoders for n = 2..8,
  from the difference between a short and a longer training in fresh caches,
  and the fixed cost of a training (the bank's features, the validation set):
  the short one less its steps.
* The sweep: the ``--help`` example (``--attack inversion --method fedcof
  --eps inf,1,0.1``) with its decoders in ``--cache`` (trained first when
  absent, not timed), CPU seconds of the inversion suite per release, fitted
  as ``a * cells + b * records in them`` (least squares over the releases),
  and of the attack alone per cell; the choice of a decoder's refinement on
  public simulations the first time it is used (the same sweep again with
  the decoders alone in a fresh cache, per decoder).

Prints the rates as code for ``RATES``; ``--record`` writes
``experiments/results/attack_cost.json`` (tests/commands/test_attack_estimate.py
holds ``RATES`` equal to it).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

SHORT, LONG = 40, 240


def _step_seconds(kind: str, n: int | None, backbone, public) -> tuple[float, float]:
    """(CPU seconds per training step, fixed CPU seconds of a training): (long - short) / (LONG - SHORT), and
    the short training less its steps (the bank's features, the validation set), each in a fresh cache."""
    from attacks.inversion.learned import DecoderConfig, feature_decoder, set_decoder

    took = []
    for steps in (SHORT, LONG):
        # validation only at the end (val_every = steps), patience high: exactly `steps` steps are taken
        cfg = DecoderConfig(steps=steps, feature_steps=steps, val_every=steps, patience=10)
        with tempfile.TemporaryDirectory() as tmp:
            c0 = time.process_time()
            if kind == "feature":
                feature_decoder(backbone, public, 10, cfg, cache_dir=tmp)
            else:
                set_decoder(backbone, public, 10, int(n), cfg, cache_dir=tmp)
            took.append(time.process_time() - c0)
    step = max(took[1] - took[0], 0.0) / (LONG - SHORT)
    return step, max(took[0] - SHORT * step, 0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--cache", default=None, help="cache folder holding the example's decoders (default: the user's)"
    )
    p.add_argument("--record", action="store_true", help="write experiments/results/attack_cost.json")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.cache:
        os.environ["PRIVFED_CACHE"] = args.cache
    from privfed.commands.attack.config import resolve_config
    from privfed.commands.attack.run import _load, run_attacks
    from privfed.commands.options import ATTACK_EXAMPLE, attack_parser

    cfg = resolve_config(attack_parser().parse_args([*ATTACK_EXAMPLE.split(), "--quiet"]))
    bb, _, public = _load(cfg)
    step, fixed = _step_seconds("feature", None, bb, public)
    rates: dict = {"feature_step_s": step, "set_step_s": {}, "decoder_fixed_s": {"feature": fixed}}
    for n in range(2, 9):
        step, fixed = _step_seconds("set", n, bb, public)
        rates["set_step_s"][str(n)], rates["decoder_fixed_s"][str(n)] = step, fixed
        print(f"set decoder n={n}: {step * 1e3:.2f} ms CPU a step, {fixed:.1f} s fixed", flush=True)
    print(f"feature decoder: {rates['feature_step_s'] * 1e3:.2f} ms CPU a step", flush=True)
    res = run_attacks(cfg, progress=False)  # trains the example's decoders first when the cache lacks them
    rows = res["records"]
    # the first use of a decoder chooses its refinement on public simulations (then cached): the same sweep
    # with the decoders alone in a fresh cache, against the sweep above
    cache = pathlib.Path(os.environ.get("PRIVFED_CACHE") or tempfile.gettempdir())
    decoders = [p for p in cache.glob("attack-*-decoder-*.npz") if "-partial-" not in p.name]
    with tempfile.TemporaryDirectory() as tmp:
        for p in decoders:
            shutil.copy(p, tmp)
        for p in cache.glob("digits-*"):  # the features, so that nothing else is recomputed
            shutil.copy(p, tmp)
        os.environ["PRIVFED_CACHE"] = tmp
        cold = run_attacks(cfg, progress=False)["records"]
        os.environ["PRIVFED_CACHE"] = str(cache)
    extra = sum(r["strongest_cpu_s"] for r in cold) - sum(r["strongest_cpu_s"] for r in rows)
    X = np.array([[r["cells"], r["cell_records"]] for r in rows], float)
    y = np.array([r["strongest_cpu_s"] for r in rows], float)
    (a, b), *_ = np.linalg.lstsq(X, y, rcond=None)
    a, b = max(float(a), 0.0), max(float(b), 0.0)
    rates["suite_cell_s"], rates["suite_cell_per_record_s"] = a, b
    rates["attack_cell_s"] = float(np.mean([r["cpu_s"] / max(r["cells"], 1) for r in rows]))
    rates["refinement_s"] = max(extra, 0.0) / max(len(decoders), 1)
    data = {
        "rates": {
            k: (round(v, 6) if isinstance(v, float) else {m: round(x, 6) for m, x in v.items()})
            for k, v in rates.items()
        },
        "example": ATTACK_EXAMPLE,
        "releases": [
            {
                "epsilon": r["epsilon"],
                "cells": r["cells"],
                "cell_records": r["cell_records"],
                "suite_cpu_s": r["strongest_cpu_s"],
                "attack_cpu_s": r["cpu_s"],
            }
            for r in rows
        ],
        "decoders_s": res["timing"]["decoders_s"],
    }
    print("RATES =", json.dumps(data["rates"], indent=4))
    if args.record:
        from experiments import recorded

        cmd = recorded.command("experiments/attack_cost.py", argv if argv is not None else sys.argv[1:])
        print(f"recorded {recorded.save('attack_cost', data, cmd)}")
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
