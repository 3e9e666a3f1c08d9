"""The test part privfed holds out of a feature file that brings none: stratified when it can be, and never a class
held out whole."""

from __future__ import annotations

import numpy as np

from privfed._validation.seeds import sklearn_seed
from privfed.errors import InputError

__all__ = ["stratified_split"]


def stratified_split(
    y: np.ndarray, fraction: float, seed: int, where: str = "the file"
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Train and test indices: ``fraction`` of the samples held out, stratified by class when every class
    can give one; a class with a single sample stays in training (held out, no head could learn it), and
    no class is held out whole."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(y.size)
    n_test = int(round(fraction * y.size))
    if n_test < 1 or y.size - n_test < 1:
        raise InputError(
            f"{where} has no test arrays, and its {y.size} samples are too few for a test part "
            f"(test_fraction={fraction:g} holds out {n_test}); add 'test_features' and 'test_labels' to the file"
            if n_test < 1
            else f"{where} has no test arrays, and test_fraction={fraction:g} of its {y.size} samples holds out "
            f"{n_test}, leaving nothing to train on; hold out a smaller fraction, or add 'test_features' and "
            "'test_labels' to the file"
        )
    counts = np.bincount(y)
    single = counts[y] < 2
    pool = idx[~single]  # a class of one sample is not split: it trains
    if n_test >= pool.size:
        raise InputError(
            f"{where} has no test arrays, and its classes with two samples or more hold {pool.size}, too few "
            f"to hold out the {n_test} of a test part of {fraction:g} and train on the rest; add "
            "'test_features' and 'test_labels'"
        )
    kept = counts[counts >= 2]
    stratify = n_test >= kept.size and pool.size - n_test >= kept.size
    train, test = train_test_split(
        pool, test_size=n_test, stratify=y[pool] if stratify else None, random_state=sklearn_seed(seed)
    )
    if np.unique(y[train]).size < kept.size:
        # A class held out whole (a test class no head could learn: too few samples to stratify, or a small
        # class at a large test part).  Only then, and so every split that was valid stays as it was: one sample
        # of each class, drawn at random, trains, and the test part comes from the rest.
        order = np.random.default_rng(seed).permutation(pool)
        reserved = order[np.unique(y[order], return_index=True)[1]]
        rest = np.setdiff1d(pool, reserved)
        if n_test > rest.size:
            raise InputError(
                f"{where} has no test arrays, and a test part of {fraction:g} ({n_test} samples) would leave a "
                "class without a training sample; add 'test_features' and 'test_labels', or hold out less"
            )
        if n_test == rest.size:  # the reserved samples alone train
            train, test = rest[:0], rest
        else:
            train, test = train_test_split(rest, test_size=n_test, random_state=sklearn_seed(seed))
        train, stratify = np.concatenate([train, reserved]), False
    train = np.concatenate([train, idx[single]])
    return np.sort(train), np.sort(test), bool(stratify)
