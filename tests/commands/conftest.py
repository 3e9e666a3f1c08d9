"""Fixtures of the command tests: one run of ``python -m privfed.flower`` through flwr run, shared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def flower_env(tmp: Path, cache: Path) -> dict[str, str]:
    """The environment a user's shell gives the command: this interpreter's bin first, a FLWR_HOME of the test's."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PRIVFED_CACHE": str(cache),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_HOME": str(tmp / "flwr-home"),
        "RAY_TMPDIR": str(
            tmp / "ray-default-root"
        ),  # Ray's sessions must not land here (the run's own folder)
    }


@pytest.fixture(scope="session")
def flower_run(tmp_path_factory, digits_cache):
    """``python -m privfed.flower`` once, as a user types it (10 nodes, eps 1, a method parameter):
    (CompletedProcess, out folder)."""
    pytest.importorskip("flwr")
    tmp = tmp_path_factory.mktemp("flower-command")
    out = tmp / "run"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "privfed.flower",
            "--clients",
            "10",
            "--eps",
            "1",
            "--param",
            "fedlog.nu=2",
            "--out",
            str(out),
        ],
        env=flower_env(tmp, digits_cache),
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return res, out
