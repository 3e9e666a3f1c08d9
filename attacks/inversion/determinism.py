"""Seeded, one-thread, deterministic torch for the attacks that optimise or train.

A matrix product's summation order depends on the number of threads, so a
decoder trained (or an image optimised) on 2 threads differs in its last bits
from one on 4.  Inside :func:`deterministic` torch is seeded, runs on one
thread and with its deterministic algorithms; the caller's settings and
random state come back after the block.
"""

from __future__ import annotations

import contextlib

__all__ = ["deterministic"]


def _torch():
    import torch

    return torch


@contextlib.contextmanager
def deterministic(seed: int):
    """Seeded, one-thread, deterministic-algorithm torch inside the block; the caller's settings after it.

    The random state is forked (the caller's generator is left as it was).
    """
    torch = _torch()
    old = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(old_det)
            torch.set_num_threads(old)
