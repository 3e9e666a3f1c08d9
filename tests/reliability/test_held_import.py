"""Ctrl-C during a large extension's import is held until the import has finished (privfed.optional)."""

from __future__ import annotations

import signal
import sys

import pytest

from privfed.optional import import_held


def _module_that_is_interrupted(tmp_path, name: str):
    """A module whose import sends this process SIGINT and then runs on, recording each line it reached."""
    (tmp_path / f"{name}.py").write_text(
        "import os, signal\n"
        "REACHED = ['before']\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "REACHED.append('after')\n"
    )
    sys.path.insert(0, str(tmp_path))


def test_an_interrupt_during_the_import_is_raised_after_it(tmp_path):
    name = "privfed_held_import_probe"
    _module_that_is_interrupted(tmp_path, name)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            import_held(name)
        # the module ran to its end: the interrupt did not land inside it
        assert sys.modules[name].REACHED == ["before", "after"]
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_a_plain_import_raises_nothing_and_a_missing_one_stays_missing(tmp_path):
    assert import_held("json") is sys.modules["json"]
    with pytest.raises(ModuleNotFoundError):
        import_held("privfed_no_such_module_here")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_holding_the_interrupt_lands_inside_the_import(tmp_path):
    """The failure the hold prevents: the same module imported plainly is cut short at the signal."""
    name = "privfed_unheld_import_probe"
    _module_that_is_interrupted(tmp_path, name)
    try:
        with pytest.raises(KeyboardInterrupt):
            __import__(name)
        assert name not in sys.modules  # the import failed part way
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_a_hang_up_during_the_import_is_held_too(tmp_path):
    """SIGHUP, now turned into an interrupt by the commands, raised inside a held import (the abort it exists to
    prevent); it is held and raised once the import is done, as SIGINT and SIGTERM are."""
    from privfed.commands.signals import Terminated, interruptible

    name = "privfed_held_import_hangup_probe"
    (tmp_path / f"{name}.py").write_text(
        "import os, signal\nREACHED = ['before']\nos.kill(os.getpid(), signal.SIGHUP)\nREACHED.append('after')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(Terminated) as got, interruptible():
            import_held(name)
        assert got.value.signum == signal.SIGHUP and sys.modules[name].REACHED == ["before", "after"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
