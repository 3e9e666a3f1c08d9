"""Decoder training that answers: a progress bar that counts to where training stops, a checkpoint that an
interrupted training resumes from (to the bit-identical decoder), and a lock that lets one process train a
decoder while another waits for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from attacks.inversion import training  # noqa: E402
from attacks.inversion.learned import DecoderConfig, feature_decoder, set_decoder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CFG = DecoderConfig(copies=2, hidden=32, feature_steps=300, steps=300, val_every=20, patience=3, batch=32)


def _params(dec):
    return [p.detach().numpy().copy() for p in dec.net.parameters()]


@pytest.mark.parametrize("kind", ["feature", "set"])
def test_an_interrupted_training_resumes_to_the_same_decoder(digits, tmp_path, monkeypatch, kind):
    import torch

    def build(where):
        if kind == "feature":
            return feature_decoder(digits["backbone"], digits["public"], 10, CFG, cache_dir=tmp_path / where)
        return set_decoder(digits["backbone"], digits["public"], 10, 3, CFG, cache_dir=tmp_path / where)

    whole = build("whole")
    monkeypatch.setattr(training, "CHECKPOINT_EVERY_S", 0.0)  # a checkpoint at every validation
    real, calls = torch.optim.Adam.step, {"n": 0}

    def step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 70:  # an interrupt between two validations (steps 60 and 80)
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", step)
    with pytest.raises(KeyboardInterrupt):
        build("cut")
    partial = list((tmp_path / "cut").glob(f"attack-{kind}-decoder-partial-*.npz"))
    assert len(partial) == 1  # what was trained is kept
    calls["n"] = -(10**9)  # no more interrupts
    resumed_from = calls["n"]
    again = build("cut")
    cap = CFG.feature_steps if kind == "feature" else CFG.steps
    stop = min(cap, whole.steps_trained + CFG.patience * CFG.val_every)
    assert calls["n"] - resumed_from == stop - 60  # resumed at the validation of step 60
    for p, q in zip(_params(whole), _params(again)):
        np.testing.assert_array_equal(p, q)
    assert again.val_loss == whole.val_loss and again.steps_trained == whole.steps_trained
    assert not list((tmp_path / "cut").glob("*-partial-*"))  # the checkpoint goes once the decoder is stored


def test_the_bar_counts_to_where_training_stops_not_to_the_cap(monkeypatch):
    """ETA: the total is the typical stopping step, or the earliest stop once past it; never the 20,000 cap."""
    import torch

    totals = []

    class Bar:
        def __init__(self, total, desc, unit="step", initial=0):
            self.total, self.desc = total, desc
            totals.append(total)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def update(self, n):
            pass

        def set_postfix_str(self, *a, **k):
            totals.append(self.total)

    monkeypatch.setattr(training, "progress_bar", Bar)
    net = torch.nn.Linear(2, 1)
    losses = iter([1.0, 0.5, 0.4, 0.39999, 0.39999, 0.39999] + [0.39999] * 100)  # improves twice, then stalls
    cfg = DecoderConfig(val_every=10, patience=3, feature_steps=20000)
    best, at = training.train_until_stopped(
        net,
        lambda: net(torch.zeros(1, 2)).sum() * 0,
        lambda: next(losses),
        cfg,
        20000,
        "training",
        typical=50,
    )
    assert at == 20 and best == 0.4
    # first the typical stop; then, training past it, the earliest stop given the validations so far
    assert totals[0] == 50 and max(totals) == 50 and 20000 not in totals
    untyped = []
    monkeypatch.setattr(
        training,
        "progress_bar",
        lambda total, desc, unit="step", initial=0: (untyped.append(total), Bar(total, desc))[1],
    )
    losses = iter([1.0, 0.9, 0.8] + [0.8] * 100)
    training.train_until_stopped(
        net, lambda: net(torch.zeros(1, 2)).sum() * 0, lambda: next(losses), cfg, 20000, "t"
    )
    assert untyped == [cfg.patience * cfg.val_every]  # no history: the earliest possible stop


@pytest.mark.slow  # two processes importing torch and training; the lock's logic runs in the fast test below
def test_two_processes_train_one_decoder_once(tmp_path, digits_cache):
    code = (
        "import sys\n"
        "from attacks.inversion.learned import DecoderConfig, feature_decoder, progress_bars\n"
        "from attacks.view import PublicData\n"
        "from privfed.data.digits import digits_splits, extract_features, get_backbone\n"
        "sp = digits_splits(0); bb = get_backbone(seed=0)\n"
        "pub = PublicData(labels=sp.public_labels, features=extract_features(bb, sp.public_images), images=sp.public_images)\n"
        "cfg = DecoderConfig(copies=2, hidden=32, feature_steps=400, val_every=20, patience=3, batch=32)\n"
        "with progress_bars(True):\n"
        "    feature_decoder(bb, pub, 10, cfg, cache_dir=sys.argv[1])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PRIVFED_CACHE": str(digits_cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    trained = sum("training the feature decoder" in e for e in errs)
    waited = sum("waiting for another process" in e for e in errs)
    assert trained == 1 and waited == 1, errs


def test_a_held_lock_makes_the_second_caller_wait_then_read_the_cache(tmp_path, monkeypatch, capsys):
    """The lock on a cache entry: while another holder trains, a caller waits (and says so), then reads it."""
    import threading

    from filelock import FileLock

    from attacks.inversion.progress import progress_bars
    from privfed.data.cache import artefact_path

    desc = {"artefact": "test-decoder", "version": 1}
    path, _ = artefact_path("attack-test-decoder", desc, ".npz", tmp_path)
    holder = FileLock(str(path) + ".lock", thread_local=False)
    holder.acquire()
    computed = []

    def compute():
        computed.append(1)
        return {"w": np.arange(3)}

    out = {}

    def second():
        with progress_bars(True):
            out["got"] = training.cached_decoder("test-decoder", desc, compute, tmp_path)

    t = threading.Thread(target=second)
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive()  # waiting on the lock
    from privfed.data.cache import save_arrays

    save_arrays(path, {"w": np.arange(3)}, desc)  # the holder stores its decoder ...
    holder.release()  # ... and lets go
    t.join(timeout=30)
    arrays, _, hit = out["got"]
    assert hit and computed == [] and arrays["w"].tolist() == [0, 1, 2]
    assert "waiting for another process that is training the same test decoder" in capsys.readouterr().err
