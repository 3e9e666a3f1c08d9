"""Ctrl-C during a large extension's import is held until the import has finished (privfed.optional)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from privfed.optional import import_held

REPO = Path(__file__).resolve().parents[2]


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


def test_held_signals_are_each_raised_again_though_a_handler_raises():
    """SIGINT then SIGTERM held: the first's KeyboardInterrupt stopped the second from being raised again."""
    from privfed._files import signals_held

    seen = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), signals_held() as got:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            assert got == [signal.SIGINT, signal.SIGTERM] and not seen  # held
        assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)


def test_privfed_imports_where_there_is_no_sighup():
    """Windows has no SIGHUP: naming it at import broke import privfed there."""
    code = "import signal; del signal.SIGHUP; import privfed._files as f, privfed; print(len(f.STOPS))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stderr[-500:]


def test_a_held_signal_is_not_raised_twice_where_an_event_loop_listens():
    """An asyncio loop's signal handler ran twice: once from the wakeup fd, once from the signal raised again."""
    import asyncio

    from privfed._files import signals_held

    calls = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: calls.append(1))
        try:
            with signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(20):
                await asyncio.sleep(0.01)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    asyncio.run(main())
    assert calls == [1]
