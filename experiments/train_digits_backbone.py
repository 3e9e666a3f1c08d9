"""Train the digits backbone (seed 0) and check it against the weights shipped in the package.

The package ships the trained weights of the embedded default's backbone
(``privfed/data/digits_cnn_seed0.npz``, their SHA-256 recorded in
``privfed.data.digits.SHIPPED_WEIGHTS``), so its features do not depend on
the torch version a user has.  This script is how that file is made:
training is deterministic (seeded, deterministic algorithms, one thread),
so on the torch version recorded in the file it reproduces the shipped
weights bit for bit; on another version it reports how far they drift.

    python -m experiments.train_digits_backbone            # retrain, compare, report
    python -m experiments.train_digits_backbone --write    # retrain and (re)write the shipped file + digest

The report gives the largest absolute difference of the weights and of the
64-d features of the private and test images, and the accuracy of a
nearest-class-mean head on each set of features.
"""

from __future__ import annotations

import argparse
import io
import json
import pathlib
import re

import numpy as np
import torch

from privfed.data import digits as D
from privfed.data import digits_backbone as DB
from privfed.data.cache import atomic_write_bytes

SEED = 0
ROOT = pathlib.Path(D.__file__).resolve().parent
SHIPPED_FILE = ROOT / D.SHIPPED_WEIGHTS[SEED][0]


def train(seed: int = SEED) -> dict[str, np.ndarray]:
    """Freshly trained weights (never read from any cache), as float32 arrays."""
    splits = D.digits_splits(seed)
    model = DB.train_backbone(splits.public_images, splits.public_labels, seed)
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}


def _model(arrays: dict[str, np.ndarray]):
    m = D.DigitsCNN()
    m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
    return DB.freeze(m)


def _ncm_accuracy(model, seed: int = SEED) -> float:
    sp = D.digits_splits(seed)
    F, Ft = D.extract_features(model, sp.private_images), D.extract_features(model, sp.test_images)
    mu = np.stack([F[sp.private_labels == c].mean(0) for c in range(10)])
    W = mu / np.linalg.norm(mu, axis=1, keepdims=True)
    return float(np.mean((Ft @ W.T).argmax(1) == sp.test_labels))


def compare(new: dict[str, np.ndarray], shipped: dict[str, np.ndarray], seed: int = SEED) -> dict:
    """Max abs differences of weights and features, and both NCM accuracies."""
    sp = D.digits_splits(seed)
    m_new, m_old = _model(new), _model(shipped)
    feats = np.concatenate([sp.private_images, sp.test_images])
    f_new, f_old = D.extract_features(m_new, feats), D.extract_features(m_old, feats)
    return {
        "torch": torch.__version__,
        "digest_new": D.weights_digest(new),
        "digest_shipped": D.weights_digest(shipped),
        "identical": all(np.array_equal(new[k], shipped[k]) for k in shipped) and set(new) == set(shipped),
        "max_abs_weight_diff": float(max(np.max(np.abs(new[k] - shipped[k])) for k in shipped)),
        "max_abs_feature_diff": float(np.max(np.abs(f_new - f_old))),
        "ncm_accuracy_new": _ncm_accuracy(m_new, seed),
        "ncm_accuracy_shipped": _ncm_accuracy(m_old, seed),
    }


def write(arrays: dict[str, np.ndarray]) -> str:
    """Write the shipped file and record its digest in privfed/data/digits_backbone.py."""
    meta = {"seed": SEED, "torch": torch.__version__, "train": D.TRAIN_CONFIG, "arch_version": D.ARCH_VERSION}
    buf = io.BytesIO()
    np.savez(buf, **arrays, __meta__=np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8))
    atomic_write_bytes(SHIPPED_FILE, buf.getvalue())
    digest = D.weights_digest(arrays)
    src = pathlib.Path(DB.__file__)
    text = src.read_text()
    pattern = r'(0: \("digits_cnn_seed0\.npz", ")[^"]*("\))'
    new_text, n = re.subn(pattern, rf"\g<1>{digest}\g<2>", text)
    if n != 1:
        raise SystemExit(f"could not find the SHIPPED_WEIGHTS entry of seed {SEED} in {src}")
    src.write_text(new_text)
    return digest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write the shipped file and its digest")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 unless the retrained weights are bit-identical"
    )
    args = p.parse_args(argv)
    new = train(SEED)
    if args.write:
        digest = write(new)
        print(f"wrote {SHIPPED_FILE} ({SHIPPED_FILE.stat().st_size:,} bytes), weights sha256 {digest}")
        return 0
    shipped = D.load_shipped_weights(SEED)
    report = compare(new, shipped)
    print(json.dumps(report, indent=2))
    return 1 if args.strict and not report["identical"] else 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
