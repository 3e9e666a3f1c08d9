"""Run a privfed Flower app on Flower's simulation runtime: through ``flwr run``, or in this process.

Two routes, one engine (Flower 1.41's simulation runtime, Ray):

* :func:`flwr_run` -- what ``python -m privfed.flower`` does: Flower's supported
  entry point.  It starts a SuperLink in simulation mode on 127.0.0.1 (a free
  port, its own ``FLWR_HOME``), submits the app with ``flwr run`` (every
  run-config key, and the number of simulated SuperNodes), relays its log
  (colour codes stripped; Flower's and Ray's chatter only with ``verbose``),
  and stops every process it started.  The ServerApp
  (:mod:`privfed.flower.server_app`) writes the run's folder; a run that
  ends without it is a :class:`~privfed.errors.PrivfedError` naming the
  reason from the log (``flwr run`` itself exits 0 on a failed run).
* :func:`run_simulation` -- the same runtime in this process, for tests and
  audits that look inside a run (``keep_view``, injected faults, several
  configurations on one start-up): Flower's ``_run_simulation``, the function
  ``flwr run``'s simulation process calls, without the deprecated
  ``flwr.simulation.run_simulation`` wrapper.

Simulated nodes hold ``partition-id`` / ``num-partitions`` of the embedded
data set and, for ``secure-agg = mask`` or ``ckks``, the identity of roster
index ``partition-id`` in a roster made here from OS entropy (the simulated
operator): in this process directly, through ``flwr run`` in files that only
the simulated nodes' environment names (:data:`ROSTER_ENV`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.clientapp import ClientApp

from mechanisms.secagg.bounds import PublicBounds
from privfed._files import stop_if_taken
from privfed.errors import ConfigError, PrivfedError
from privfed.flower.client_app import make_client_app
from privfed.flower.config import FlowerConfig, check_num_cpus
from privfed.flower.provision import SimulatedRoster
from privfed.flower.runtime_env import (
    QUIET_ENV,
    RAY_INLINE_ENV,
    quiet_environment,
    ray_defaults,
    ray_inline_bytes,
    ray_root,
)
from privfed.flower.server_app import FlowerResult, make_server_app

__all__ = ["ROSTER_ENV", "client_app", "descendants", "flwr_run", "run_simulation", "simulated_roster"]

#: The environment variable naming the simulated operator's roster folder (simulated nodes only).
ROSTER_ENV = "PRIVFED_SIMULATED_ROSTER"
#: The Flower app in the package: its components and every run-config key with its default.
APP_DIR = Path(__file__).resolve().parent / "app"


# ------------------------------------------------------------------------------- in this process
def run_simulation(
    cfg: FlowerConfig | list[FlowerConfig],
    *,
    num_supernodes: int | None = None,
    faults: dict[int, str] | None = None,
    keep_view: bool = False,
    num_cpus: int = 1,
    verbose: bool = False,
) -> FlowerResult:
    """Simulate ``cfg.clients`` nodes (or ``num_supernodes``) in this process and return the server's result.

    Parameters
    ----------
    cfg : FlowerConfig or list of FlowerConfig
        A list runs one aggregation after the other in the same simulation
        (one start-up) and returns a list with, per config, its result or the
        :class:`~privfed.errors.PrivfedError` it raised.
    num_supernodes : int, optional
        Virtual nodes to start (default ``cfg.clients``); fewer than
        ``cfg.clients`` exercises the server's connect timeout.
    faults : dict, optional
        partition-id -> ``fail-at`` spec (see :mod:`privfed.flower.client_app`).
    keep_view : bool
        Keep everything the server received (for audits and tests).
    num_cpus : int
        CPUs Ray may use (one ClientApp at a time per CPU).
    """
    check_num_cpus(num_cpus)
    quiet_environment()
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    cfgs = cfg if isinstance(cfg, list) else [cfg]
    results: list = []
    server = make_server_app(cfg, keep_view=keep_view, results=results)
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    # The simulated operator's roster and identity files live in a directory of their own for the
    # simulation (the ClientApp, sent with every message, carries its path only), removed at the end.
    with (
        tempfile.TemporaryDirectory(prefix="privfed-roster-") as folder,
        tempfile.TemporaryDirectory(prefix="privfed-ray-", ignore_cleanup_errors=True) as ray_tmp,
    ):
        client = make_client_app(faults, provision=simulated_roster(cfgs, folder))
        root = ray_root(ray_tmp)
        ray_dir = {} if root is None else {"_temp_dir": os.path.join(root, "ray")}
        with ray_defaults():
            _run_simulation(
                num_supernodes=int(
                    num_supernodes if num_supernodes is not None else max(c.clients for c in cfgs)
                ),
                exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
                client_app=client,
                server_app=server,
                backend_config={
                    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                    "init_args": {
                        "num_cpus": int(num_cpus),
                        "num_gpus": 0,
                        "include_dashboard": False,
                        **ray_dir,
                    },
                },
                verbose_logging=verbose,
            )
    if len(results) != len(cfgs):
        raise PrivfedError("the simulation ended without a result from the server; see the log above")
    return results if isinstance(cfg, list) else results[0]


def simulated_roster(cfgs: list[FlowerConfig], folder: str | None = None) -> SimulatedRoster | None:
    """The simulated operator's roster (written to ``folder`` when given): one per simulation, so every
    masked config must share K, t and the SecAgg+ degree (the graph is drawn here, from OS entropy, with
    the roster)."""
    masked = [c for c in cfgs if c.secure in ("mask", "ckks")]
    if not masked:
        return None
    ktk = {
        (c.clients, c.secagg_threshold, c.degree, c.frac_bits if c.secure == "mask" else None) for c in masked
    }
    fixed = {k[3] for k in ktk if k[3] is not None}
    ktk = {k[:3] + (max(fixed) if fixed else None,) for k in ktk}
    if len(ktk) > 1 or len(fixed) > 1:
        raise ConfigError(
            "one simulation has one roster: the masked configurations ask for (K, t, degree, frac-bits) in "
            f"{sorted(ktk, key=str)}; run them in separate simulations"
        )
    ((K, t, degree, f),) = ktk
    return SimulatedRoster(
        K, t, degree=degree, bounds=None if f is None else PublicBounds(frac_bits=f), directory=folder
    )


# ------------------------------------------------------------------------------- the simulated nodes of flwr run
class _SimulatedClientApp(ClientApp):
    """privfed's ClientApp for ``flwr run`` simulations: the roster, if any, from :data:`ROSTER_ENV`."""

    def __init__(self) -> None:
        super().__init__()
        self._inner: ClientApp | None = None

    def __call__(self, message, context):  # noqa: D102
        if self._inner is None:
            self._inner = make_client_app(provision=_roster_from_env())
        return self._inner(message, context)

    def __reduce__(self) -> str:
        """Pickled (with every message Flower's simulation hands a worker) as this module's :data:`client_app`,
        so a worker builds the inner app once, not once per message from a fresh copy."""
        return "client_app"


def _roster_from_env() -> SimulatedRoster | None:
    where = os.environ.get(ROSTER_ENV)
    return SimulatedRoster.from_directory(where) if where else None


#: The ClientApp the simulated nodes of :func:`flwr_run` load (``privfed.flower.simulation:client_app``).
client_app = _SimulatedClientApp()


# ------------------------------------------------------------------------------- flwr run
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Lines of Flower's own log that say nothing about this run (shown with ``verbose`` only).
_CHATTER = (
    "Starting logstream",
    "Starting Flower Simulation",
    "Successfully installed",
    "Successfully started run",
    "Using SuperLink",
    "simulated SuperNodes",
    "To change federation size",
    "flwr federation simulation-config",
    "default simulated SuperNodes changed",
    "warnings.warn(",
    "Manually terminating ClientAppActor",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _executable(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise PrivfedError(
            f"Flower's {name!r} is not installed next to this Python: pip install 'privfed[flower]'"
        )
    return found


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc, Linux): what Flower and Ray started on this run's behalf."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop the processes this run started, their process groups and every process below them."""
    spawned: set[int] = set()
    for p in procs:
        spawned |= descendants(p.pid)
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)
    for pid in spawned:  # children Flower or Ray moved into sessions of their own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _app_dir(where: Path) -> Path:
    """The package's app with its ClientApp swapped for the simulated nodes' (same keys and defaults)."""
    text = (APP_DIR / "pyproject.toml").read_text()
    text = text.replace(
        'clientapp = "privfed.flower.client_app:app"', 'clientapp = "privfed.flower.simulation:client_app"'
    )
    tomllib.loads(text)  # the package's file parses
    where.mkdir(parents=True)
    (where / "pyproject.toml").write_text(text)
    return where


def _toml_value(v: Any) -> str:
    if isinstance(v, dict):  # method and rounds parameters travel as a JSON object in a string
        return json.dumps(json.dumps(v, separators=(",", ":")))
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not (isinstance(v, float) and v != v) else '"nan"'
    return json.dumps(str(v))


def _reason(lines: list[str]) -> str:
    """The line of the log that says why a run failed (privfed's one-line error, else Flower's last error)."""
    for line in reversed(lines):
        m = re.search(r"(?:privfed\.errors\.)?(\w+Error|ProtocolAbort): (.+)$", line)
        if m and m.group(1) != "Error":
            return m.group(2).strip()
    errors = [ln for ln in lines if "ERROR" in ln]
    return (
        errors[-1].split(":", 1)[-1].strip() if errors else "no result from the ServerApp (see the log above)"
    )


def flwr_run(
    run_config: dict[str, Any],
    *,
    num_supernodes: int,
    num_cpus: int = 1,
    roster: SimulatedRoster | None = None,
    say: Callable[[str], None] | None = None,
    verbose: bool = False,
    timeout: float = 3600.0,
    expect: Path | None = None,
) -> list[str]:
    """Run the app once through ``flwr run`` on a SuperLink in simulation mode started here; returns the log.

    ``run_config`` holds every key (``flwr run --run-config``); ``num_supernodes`` simulated
    SuperNodes start; ``say`` receives the log lines worth showing (the ServerApp's lines,
    warnings and errors; every line with ``verbose``).  ``expect`` is the folder the
    ServerApp writes: when its ``results.json`` is missing at the end, or is still the one that was
    there before the run (an earlier run's, kept by a failed ``--overwrite``), the run failed and a
    :class:`~privfed.errors.PrivfedError` says why.  Every process started here is stopped on
    return, on an error and on an interrupt.
    """
    check_num_cpus(num_cpus)
    quiet_environment()
    before = _file_stamp(Path(expect) / "results.json") if expect is not None else None
    import privfed

    root = str(Path(privfed.__file__).resolve().parents[1])
    # a Ray process still closing its session's logs must not turn a finished run into a failed removal
    with tempfile.TemporaryDirectory(prefix="privfed-flwr-", ignore_cleanup_errors=True) as tmp_name:
        tmp = Path(tmp_name)
        home = tmp / "flwr-home"
        home.mkdir()
        port = _free_port()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "privfed"\n\n[superlink.privfed]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
        )
        env = {
            RAY_INLINE_ENV: str(ray_inline_bytes()),
            **os.environ,
            **QUIET_ENV,
            "FLWR_HOME": str(home),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
            "PYTHONUNBUFFERED": "1",
        }
        if ray_root(str(tmp)) is not None:  # the SuperLink's Ray sessions go with this run's folder
            env["RAY_TMPDIR"] = str(tmp)
        if roster is not None:  # the simulated operator's files, readable by this user only
            ids = tmp / "roster"
            ids.mkdir(mode=0o700)
            roster.write(ids)
            env[ROSTER_ENV] = str(ids)
        app = _app_dir(tmp / "app")
        procs: list[subprocess.Popen] = []
        lines: list[str] = []
        try:
            procs.append(
                subprocess.Popen(
                    [
                        _executable("flower-superlink"),
                        "--insecure",
                        "--simulation",
                        "--disable-runtime-dependency-installation",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--log-file",
                        str(tmp / "superlink.log"),
                    ],
                    env=env,
                    cwd=tmp,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            _wait_port(port, 60.0, procs[0], tmp / "superlink.log")
            # a TOML file (flwr run's --run-config FILE.toml): any value, spaces and quotes included, as it is
            pairs = tmp / "run-config.toml"
            pairs.write_text(
                "".join(f"{k} = {_toml_value(v)}\n" for k, v in run_config.items() if v is not None)
            )
            federation = (
                f"num-supernodes={int(num_supernodes)} client-resources-num-cpus=1 "
                f"init-args-num-cpus={int(num_cpus)} init-args-num-gpus=0"
            )
            run = subprocess.Popen(
                [
                    _executable("flwr"),
                    "run",
                    str(app),
                    "privfed",
                    "--stream",
                    "--run-config",
                    str(pairs),
                    "--federation-config",
                    federation,
                ],
                env=env,
                cwd=tmp,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            procs.append(run)
            deadline = time.monotonic() + timeout
            assert run.stdout is not None
            for raw in run.stdout:
                stop_if_taken()  # a Ctrl-C whose exception Python dropped stops the run all the same
                line = _ANSI.sub("", raw).rstrip()
                lines.append(line)
                if say is not None and line.strip() and (verbose or _worth_showing(line)):
                    say(line)
                if time.monotonic() > deadline:
                    raise PrivfedError(f"the Flower run took longer than {timeout:g} s; stopped")
            run.wait(timeout=max(deadline - time.monotonic(), 1.0))
            stop_if_taken()  # one dropped after the last line of output
        finally:
            _stop(procs)
        written = _file_stamp(Path(expect) / "results.json") if expect is not None else None
        if expect is not None and (written is None or written == before):
            lines += [_ANSI.sub("", ln) for ln in _tail(tmp / "superlink.log")]
            raise PrivfedError(f"the Flower run failed: {_reason(lines)}")
        return lines


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(inode, modification time, size) of ``path``, None when it does not exist: the results are renamed
    into place, so a file this run wrote has another stamp than the one there before it."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _worth_showing(line: str) -> bool:
    if any(c in line for c in _CHATTER):
        return False
    return line.startswith("privfed") or "WARNING" in line or "ERROR" in line or "Error" in line


def _tail(path: Path, n: int = 200) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def _wait_port(port: int, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stop_if_taken()
        if proc.poll() is not None:
            raise PrivfedError(
                f"Flower's SuperLink exited during start-up ({proc.returncode}): " + " | ".join(_tail(log, 5))
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise PrivfedError(f"Flower's SuperLink did not listen on 127.0.0.1:{port} within {timeout:g} s")
