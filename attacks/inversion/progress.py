"""Progress bars on stderr for the attacks' long steps (decoder training, cells of the joint attack)."""

from __future__ import annotations

import contextlib
import contextvars
import sys

__all__ = ["announce", "progress_bar", "progress_bars"]

_PROGRESS: contextvars.ContextVar[bool] = contextvars.ContextVar("privfed_attack_progress", default=False)


@contextlib.contextmanager
def progress_bars(enabled: bool = True):
    """Show progress bars (stderr) for decoder training inside the block."""
    token = _PROGRESS.set(bool(enabled))
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def progress_bar(total: int, desc: str, unit: str = "step", initial: int = 0):
    """A tqdm bar on stderr, shown only inside :func:`progress_bars` (ETA from the first updates)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=int(total),
        initial=int(initial),
        desc=desc,
        unit=unit,
        file=sys.stderr,
        leave=False,
        disable=not _PROGRESS.get(),
        mininterval=1.0,
    )


def announce(text: str) -> None:
    """One line on stderr, shown only inside :func:`progress_bars` (what a long step is waiting for)."""
    if _PROGRESS.get():
        print(text, file=sys.stderr, flush=True)
