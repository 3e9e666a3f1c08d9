"""Training a decoder: until validation stops improving, checkpointed, once per cache entry.

* :func:`train_until_stopped` -- Adam with a validation every ``val_every`` steps,
  the learning rate halved at each one without improvement, stopped after
  ``patience`` of them; its progress bar counts to where training will stop
  (:data:`TYPICAL_STOP`, or the earliest possible stop), not to the cap.
* :class:`TrainingCheckpoint` -- the training's state at validations, in the
  cache: an interrupted training (Ctrl-C, SIGTERM) resumes where it was and
  gives the same decoder.
* :func:`cached_decoder` -- the cache entry under a lock: a second process
  needing the same decoder waits for the first one's instead of training it
  again.
"""

from __future__ import annotations

import numpy as np

from attacks.inversion.bank import DecoderConfig
from attacks.inversion.progress import progress_bar

__all__ = [
    "CHECKPOINT_EVERY_S",
    "TYPICAL_STOP",
    "TrainingCheckpoint",
    "cached_decoder",
    "train_until_stopped",
]


def _torch():
    import torch

    return torch


#: Where training stops with the full-strength defaults on digits (the step of the best validation plus
#: ``patience`` validations; measured: experiments/attacks_inversion.py's record), for the ETA of the bar.
TYPICAL_STOP = {"feature-decoder": 8000, "set-decoder": 7000}
#: Seconds between checkpoints of a decoder's training (each at a validation, so a resumed run is the same run).
CHECKPOINT_EVERY_S = 10.0


class TrainingCheckpoint:
    """A decoder's training state in the cache, so that an interrupted training resumes where it was.

    Written (atomically, hash-checked like every cache file) at validations at most every
    :data:`CHECKPOINT_EVERY_S` seconds: the network, Adam's state, the learning rate, the step, the best
    validated weights and the batch sampler's random state.  Resuming from it gives the bit-identical
    decoder an uninterrupted training gives.  Removed when the decoder is stored.
    """

    def __init__(self, kind: str, description: dict, cache_dir=None, rng=None) -> None:
        from privfed.data.cache import artefact_path

        self.description = {**description, "checkpoint": True}
        self.path, _ = artefact_path(f"attack-{kind}-partial", self.description, ".npz", cache_dir)
        self.rng = rng  # (get_state() -> JSON-able, set_state(state))

    def load(self) -> dict | None:
        from privfed.data.cache import load_arrays

        return load_arrays(self.path, self.description)

    def save(self, arrays: dict) -> None:
        from privfed.data.cache import save_arrays

        save_arrays(self.path, arrays, self.description)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _opt_arrays(opt) -> dict[str, np.ndarray]:
    out = {}
    for i, group in enumerate(opt.param_groups):
        for j, p in enumerate(group["params"]):
            st = opt.state.get(p, {})
            for k in ("step", "exp_avg", "exp_avg_sq"):
                if k in st:
                    out[f"opt{i:02d}_{j:02d}_{k}"] = np.asarray(st[k].detach().cpu().numpy())
    return out


def _load_opt(opt, arrays: dict) -> None:
    torch = _torch()
    for i, group in enumerate(opt.param_groups):
        for j, p in enumerate(group["params"]):
            st = {}
            for k in ("step", "exp_avg", "exp_avg_sq"):
                key = f"opt{i:02d}_{j:02d}_{k}"
                if key in arrays:
                    st[k] = torch.as_tensor(arrays[key]).clone()
            if st:
                opt.state[p] = st


def train_until_stopped(
    net,
    batch_loss,
    val_loss,
    cfg: DecoderConfig,
    cap: int,
    desc: str,
    *,
    checkpoint: TrainingCheckpoint | None = None,
    typical: int | None = None,
) -> tuple[float, int]:
    """Adam on ``batch_loss()`` until ``val_loss()`` (measured every ``cfg.val_every`` steps) stops improving.

    Each validation without a relative improvement of 1e-3 halves the
    learning rate; ``cfg.patience`` of them in a row stop training (at most
    ``cap`` steps).  The best validated weights are loaded back into ``net``
    (left in eval mode).  Returns (best validation loss, the step it was
    measured at).

    The progress bar counts to where training will stop: ``typical`` (the usual stopping step) or, when
    training runs longer, the earliest step it can stop at; never to ``cap`` unless it gets there.
    ``checkpoint`` keeps the state at validations, and a training that finds one resumes from it
    (the same steps, the same decoder).
    """
    import json
    import time

    torch = _torch()
    lr = cfg.lr
    opt = torch.optim.Adam(net.parameters(), lr=lr)

    def validate() -> float:
        with torch.no_grad():
            return float(val_loss())

    state = checkpoint.load() if checkpoint is not None else None
    if state is not None:  # resume: everything the next steps depend on, as it was at that validation
        with torch.no_grad():
            for i, p in enumerate(net.parameters()):
                p.copy_(torch.as_tensor(state[f"w{i:02d}"]))
        _load_opt(opt, state)
        lr = float(state["lr"])
        for group in opt.param_groups:
            group["lr"] = lr
        step, best_step, bad = int(state["step"]), int(state["best_step"]), int(state["bad"])
        best = float(state["best"])
        best_state = [torch.as_tensor(state[f"b{i:02d}"]).clone() for i in range(len(list(net.parameters())))]
        if checkpoint.rng is not None:
            checkpoint.rng[1](json.loads(str(state["rng"])))
    else:
        best, best_step, bad, step = validate(), 0, 0, 0
        best_state = [p.detach().clone() for p in net.parameters()]

    def stop_at() -> int:
        earliest = step + (cfg.patience - bad) * cfg.val_every
        return int(min(cap, max(earliest, typical or 0)))

    def save() -> None:
        arrays = {f"w{i:02d}": p.detach().cpu().numpy() for i, p in enumerate(net.parameters())}
        arrays.update({f"b{i:02d}": q.cpu().numpy() for i, q in enumerate(best_state)})
        arrays.update(_opt_arrays(opt))
        arrays.update(
            step=np.array(step),
            best_step=np.array(best_step),
            bad=np.array(bad),
            best=np.array(best),
            lr=np.array(lr),
        )
        if checkpoint.rng is not None:
            arrays["rng"] = np.array(json.dumps(checkpoint.rng[0]()))
        checkpoint.save(arrays)

    saved = time.monotonic()
    note = f"{desc}: stops when validation stops improving" + (f", about {typical} steps" if typical else "")
    with progress_bar(stop_at(), note, initial=step) as bar:
        while step < cap:
            opt.zero_grad()
            batch_loss().backward()
            opt.step()
            step += 1
            bar.update(1)
            if step % cfg.val_every == 0:
                v = validate()
                if v < best * (1 - 1e-3):
                    best, best_step, bad = v, step, 0
                    best_state = [p.detach().clone() for p in net.parameters()]
                else:
                    bad += 1
                    lr /= 2
                    for group in opt.param_groups:
                        group["lr"] = lr
                    if bad >= cfg.patience:
                        break
                bar.total = stop_at()
                bar.set_postfix_str(f"validation mse {best:.4f}", refresh=True)
                if checkpoint is not None and time.monotonic() - saved >= CHECKPOINT_EVERY_S:
                    save()
                    saved = time.monotonic()
    with torch.no_grad():
        for p, q in zip(net.parameters(), best_state):
            p.copy_(q)
    net.eval()
    return best, best_step


def cached_decoder(kind: str, desc: dict, compute, cache_dir=None):
    """:func:`privfed.data.cache.cached_arrays` under a lock on the entry: one process trains, the others wait.

    A process that finds another one training the same decoder says so (with progress bars on) and
    waits; it then reads the decoder from the cache.  The lock is released when its holder exits, even
    when killed, so a dead trainer leaves no stale lock.
    """
    from filelock import FileLock, Timeout

    from privfed.data.cache import artefact_path, cached_arrays

    path, _ = artefact_path(f"attack-{kind}", desc, ".npz", cache_dir)
    lock = FileLock(str(path) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        from attacks.inversion.progress import announce

        announce(
            f"waiting for another process that is training the same {kind.replace('-', ' ')} ({path.name})"
        )
        lock.acquire()
    try:
        arrays, key, hit = cached_arrays(f"attack-{kind}", desc, compute, cache_dir)
        if not hit:
            TrainingCheckpoint(kind, desc, cache_dir).remove()  # trained and stored: its checkpoint is done
        return arrays, key, hit
    finally:
        lock.release()
