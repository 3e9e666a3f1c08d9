"""The test part privfed holds out of a feature file without one: never a class held out whole, and whether a
file loads never depends on where the split falls."""

from __future__ import annotations

import numpy as np
import pytest

from privfed.data import load_dataset
from privfed.data.npzfile import save_feature_file
from privfed.data.split import stratified_split
from privfed.errors import InputError


@pytest.mark.parametrize("per_class", [2, 3])
def test_small_classes_keep_a_training_sample_at_every_seed(tmp_path, per_class):
    # 10 classes of 2 or 3 samples: a 20 % test part (4 or 6) is smaller than the classes, so no stratified split
    y = np.repeat(np.arange(10), per_class)
    F = np.random.default_rng(0).normal(size=(y.size, 3))
    path = tmp_path / "pairs.npz"
    np.savez(path, features=F, labels=y)
    for seed in range(12):
        train, test, stratified = stratified_split(y, 0.2, seed)
        assert not stratified and test.size == round(0.2 * y.size)
        assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(y.size))  # a partition
        assert set(y[train].tolist()) == set(range(10))  # every class trains
        ds = load_dataset(f"file:{path}", seed=seed)
        assert ds.test_labels.size == test.size and set(ds.train_labels.tolist()) == set(range(10))
    save_feature_file(tmp_path / "written.npz", F, y)  # valid data is written, not refused over a split


def test_a_split_that_cannot_keep_every_class_says_so():
    y = np.repeat(np.arange(10), 2)
    with pytest.raises(InputError, match="would leave a class without a training sample"):
        stratified_split(y, 0.6, 0)


def test_client_ids_are_checked_on_the_whole_file_before_the_split(tmp_path):
    F = np.random.default_rng(0).normal(size=(60, 5))
    clients = np.zeros(60, dtype=np.int64)
    clients[0] = 10**9
    path = tmp_path / "ids.npz"
    np.savez(path, features=F, labels=np.arange(60) % 3, clients=clients)
    for seed in range(6):  # sample 0 falls in the test part at some seeds and trains at others
        with pytest.raises(
            InputError, match="'clients' goes up to 1000000000 but 'features' has only 60 rows"
        ):
            load_dataset(f"file:{path}", seed=seed)


def test_a_split_that_kept_every_class_is_the_same_as_before():
    # the split of sklearn's train_test_split, untouched whenever it trains every class (a replay of a run on
    # such a file reads the same test part)
    from sklearn.model_selection import train_test_split

    from privfed._validation.seeds import sklearn_seed

    y = np.repeat(np.arange(5), 4)  # 20 samples, a test part of 4 < 5 classes: not stratified
    for seed in range(20):
        train, test, _ = stratified_split(y, 0.2, seed)
        old_train, old_test = train_test_split(np.arange(20), test_size=4, random_state=sklearn_seed(seed))
        if np.unique(y[old_train]).size == 5:
            assert np.array_equal(test, np.sort(old_test))
        assert np.unique(y[train]).size == 5


@pytest.mark.parametrize("sizes, fraction", [([6, 2], 0.7), ([1, 1, 3, 2, 1, 0, 1, 0, 1, 4, 4], 0.5)])
def test_a_stratified_split_never_holds_a_small_class_out_whole(sizes, fraction):
    y = np.repeat(np.arange(len(sizes)), sizes) if len(sizes) == 2 else np.array(sizes)
    classes = {c for c in set(y.tolist()) if np.count_nonzero(y == c) >= 2}
    for seed in range(8):
        train, test, _ = stratified_split(y, fraction, seed)
        assert classes <= set(y[train].tolist())
