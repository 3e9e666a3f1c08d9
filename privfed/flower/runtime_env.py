"""The environment of the Flower and Ray processes a simulation starts (:mod:`privfed.flower.simulation`).

* :data:`QUIET_ENV`: offline, and without Ray's FutureWarning or colour codes;
* :func:`ray_root`: the run's own folder as Ray's temporary root, where its path fits Ray's sockets;
* :data:`RAY_INLINE_BYTES`: Ray's inline limit raised, so that a simulated node's message and context travel
  inside Ray's task messages, not through its object store (:func:`ray_defaults`, :func:`ray_inline_bytes`).
"""

from __future__ import annotations

import contextlib
import os

from privfed.errors import ConfigError

__all__ = [
    "QUIET_ENV",
    "RAY_INLINE_BYTES",
    "RAY_INLINE_ENV",
    "RAY_ROOT_MAX",
    "quiet_environment",
    "ray_defaults",
    "ray_inline_bytes",
    "ray_root",
]

#: Environment every Flower process a simulation starts gets: offline, and without Ray's FutureWarning.
QUIET_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
    "NO_COLOR": "1",
}


#: The longest folder Ray's temporary root may be (``RAY_TMPDIR``: Ray adds ``/ray/session_<date>_<pid>``, 47
#: characters with a 7-digit pid, whose ``/sockets/plasma_store`` must end within a Unix socket path: 107 bytes
#: on Linux, 103 on macOS).
RAY_ROOT_MAX = 36


def ray_root(folder: str) -> str | None:
    """``folder`` as the root of this run's Ray sessions (removed with it, where Ray's default root keeps every
    session's logs for good), or None where its path is too long for Ray's sockets (Ray's default then)."""
    return folder if len(os.fsencode(folder)) <= RAY_ROOT_MAX else None


#: Arguments and results of Ray tasks up to this many bytes travel inside Ray's task messages instead of through
#: its shared-memory object store (Ray's ``max_direct_call_object_size``, 100 kB by default).  Flower's simulation
#: sends every message to a Ray worker with the node's context and gets both back: with 51,210 values a node, a
#: statistics message and a context holding the node's cached statistics are about 410 kB each, and each trip
#: through the store cost more than carrying them inline (``experiments/bench_flower_masked.py`` runs with it).
RAY_INLINE_BYTES = 4 << 20
#: The environment variable Ray reads that limit from (a value the user's environment sets is kept).
RAY_INLINE_ENV = "RAY_max_direct_call_object_size"


def ray_inline_bytes() -> int:
    """The inline limit the simulations this module starts run with: the environment's value, else
    :data:`RAY_INLINE_BYTES` (ConfigError for a value Ray would not read as a byte count: digits only, as
    Ray's parser takes them; a variable set to nothing is refused too, where Ray would stop the process)."""
    raw = os.environ.get(RAY_INLINE_ENV)
    if raw is None:
        return RAY_INLINE_BYTES
    if not (raw.isascii() and raw.isdigit()):
        raise ConfigError(
            f"{RAY_INLINE_ENV}={raw!r} is not a byte count (digits only); unset it or give one, e.g. "
            f"{RAY_INLINE_BYTES}"
        )
    return int(raw)


def quiet_environment() -> None:
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)


@contextlib.contextmanager
def ray_defaults():
    """Within the block, this process's environment holds Ray's inline limit (for the Ray processes a simulation
    in this process starts); a value the environment already holds is kept, and what was added is removed."""
    limit, added = ray_inline_bytes(), RAY_INLINE_ENV not in os.environ
    if added:
        os.environ[RAY_INLINE_ENV] = str(limit)
    try:
        yield
    finally:
        if added:
            os.environ.pop(RAY_INLINE_ENV, None)
