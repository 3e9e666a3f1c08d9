"""The seeded, stratified public / private / test split of scikit-learn digits."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from privfed._validation.seeds import check_seed as _check_seed
from privfed._validation.seeds import sklearn_seed

__all__ = ["DigitsSplits", "PUBLIC_FRACTION", "SPLIT_VERSION", "TEST_FRACTION", "check_seed", "digits_splits"]

#: Bump when the split procedure changes.
SPLIT_VERSION = 1
#: Split fractions of the whole data set.
PUBLIC_FRACTION = 0.3
TEST_FRACTION = 0.2


@dataclass(frozen=True, eq=False)
class DigitsSplits:
    """Public / private / test parts of scikit-learn digits.

    Images are (n, 8, 8) float32 in [0, 1] (raw 0..16 grey levels / 16);
    labels are int64 in 0..9.  Arrays are read-only.
    """

    public_images: np.ndarray
    public_labels: np.ndarray
    private_images: np.ndarray
    private_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    #: Indices of each part into ``sklearn.datasets.load_digits()`` order.
    indices: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return 10


def check_seed(seed) -> int:
    """``seed`` as an int in 0..2**64 - 1 (:func:`privfed._validation.seeds.check_seed`)."""
    return _check_seed(seed, "seed")


def digits_splits(seed: int = 0) -> DigitsSplits:
    """Seeded stratified split of scikit-learn digits: ~30 % public, ~20 % test, rest private.

    Parameters
    ----------
    seed : int
        Seed of the split (``random_state`` of scikit-learn's stratified split).

    Returns
    -------
    DigitsSplits
        Public 539, private 899, test 359 images for every seed (the class
        proportions are kept in each part).
    """
    return _digits_splits(check_seed(seed))


@functools.lru_cache(maxsize=8)
def _digits_splits(seed: int) -> DigitsSplits:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = (np.asarray(data.images, dtype=np.float64) / 16.0).astype(np.float32)
    labels = np.asarray(data.target, dtype=np.int64)
    idx = np.arange(labels.size)
    n_test = int(round(TEST_FRACTION * labels.size))
    n_public = int(round(PUBLIC_FRACTION * labels.size))
    rest, test = train_test_split(idx, test_size=n_test, stratify=labels, random_state=sklearn_seed(seed))
    public, private = train_test_split(
        rest, train_size=n_public, stratify=labels[rest], random_state=sklearn_seed(seed)
    )
    parts = {"public": np.sort(public), "private": np.sort(private), "test": np.sort(test)}
    arrays = {}
    for name, ix in parts.items():
        ix.setflags(write=False)
        im, lab = images[ix], labels[ix]
        im.setflags(write=False)
        lab.setflags(write=False)
        arrays[f"{name}_images"], arrays[f"{name}_labels"] = im, lab
    return DigitsSplits(**arrays, indices=parts)
