"""A Ctrl-C or SIGTERM during the learned tracing test's training stops the run.

scikit-learn's MLP catches KeyboardInterrupt (the form both signals take in a privfed command) and returns
a half-trained model; the learned test re-raises the signal once fit returns, so the command stops (and
never scores with that model).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from sklearn.neural_network import MLPClassifier

from attacks.tracing.scores import _fit_stoppable
from privfed.commands.signals import Terminated, interruptible


def _slow_mlp():
    """An MLP whose training takes seconds on this data (no early stop), and the data."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 20))
    y = (X[:, 0] + rng.normal(size=20_000) > 0).astype(int)
    return (
        MLPClassifier(hidden_layer_sizes=(64,), max_iter=500, tol=0.0, n_iter_no_change=500, random_state=0),
        X,
        y,
    )


@pytest.mark.parametrize(
    ("signum", "raised"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_during_training_reaches_the_command(signum, raised):
    clf, X, y = _slow_mlp()
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signum))
    t0 = time.monotonic()
    with interruptible(), pytest.raises(raised):
        timer.start()
        _fit_stoppable(clf, X, y)
    timer.join()
    assert time.monotonic() - t0 < 5.0  # stopped in its epoch, not after 500 of them
    assert clf.n_iter_ < 500
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before  # handlers put back


def test_without_a_signal_the_fit_is_scikit_learns():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4))
    y = (X[:, 0] > 0).astype(int)
    ours = MLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0)
    ref = MLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit_stoppable(ours, X, y)
        ref.fit(X, y)
    np.testing.assert_array_equal(ours.predict_proba(X), ref.predict_proba(X))


def test_an_ignored_signal_is_left_ignored():
    """A signal the process ignores (say under nohup) is not taken over: training runs to its end."""
    clf = MLPClassifier(hidden_layer_sizes=(8,), max_iter=30, tol=0.0, n_iter_no_change=30, random_state=0)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2_000, 4))
    y = (X[:, 0] > 0).astype(int)
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _fit_stoppable(clf, X, y)
        timer.join()
        assert clf.n_iter_ == 30 and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.parametrize("at", [1, 2, 3, 4])  # after the 1st / 2nd install, after the 1st / 2nd restore
def test_a_signal_while_the_handlers_are_swapped_still_reaches_the_command_as_sent(monkeypatch, at):
    """A SIGTERM landing between two handler swaps used to raise a plain KeyboardInterrupt from the swap (exit
    130, not 143) and leave the other signal's handler as the learned test's."""
    real = signal.signal
    calls: list[int] = []

    def swap(s, h):
        out = real(s, h)
        calls.append(s)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] > 0).astype(int)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    import warnings

    with interruptible():
        inside = signal.getsignal(signal.SIGTERM)
        monkeypatch.setattr(signal, "signal", swap)
        with warnings.catch_warnings(), pytest.raises(Terminated):
            warnings.simplefilter("ignore")
            _fit_stoppable(MLPClassifier(hidden_layer_sizes=(4,), max_iter=5, random_state=0), X, y)
        monkeypatch.setattr(signal, "signal", real)
        assert signal.getsignal(signal.SIGTERM) is inside  # the command's own handler, put back
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before
