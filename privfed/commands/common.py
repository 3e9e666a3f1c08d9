"""What every privfed command shares: parsers, result folders, run records, one-line errors.

Typed values live in :mod:`privfed.commands.values` and signal handling in :mod:`privfed.commands.signals`;
both are re-exported here.

Result folders (:class:`OutputDir`) are written as one unit by
:mod:`privfed.results.writer`: a staging folder beside ``--out`` renamed into
place when the run ends, a manifest with every file's SHA-256 written last,
a lock refusing a second run on the same folder, and ``--overwrite`` swapping
the previous run out only once the new one is complete.  SIGTERM is handled
like Ctrl-C (:func:`interruptible`), so ``kill``, ``timeout`` and batch
schedulers keep the runs that finished.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from privfed.commands.options import SECURE_AGG_KINDS, HelpFormatter, Parser
from privfed.commands.signals import (
    Terminated,
    heartbeat,
    interrupt_taken,
    interruptible,
    keep_finished,
    periodic_checkpoint,
    reporting_finished_run,
    shown_prog,
    signals_deferred,
    stop_if_taken,
    stops_kept,
)
from privfed.commands.streams import (
    GuardedStdout,
    QuietStderr,
    StdoutFailed,
    plain_errors,
    silence_stdout,
    stdout_reader_gone,
)
from privfed.commands.values import (
    as_bool,
    as_float,
    as_int,
    as_str,
    choose,
    parse_float_list,
    parse_int_list,
    parse_seeds,
    parse_str_list,
)
from privfed.errors import ConfigError, PrivfedError
from privfed.results.guard import FolderInUse, lock_file
from privfed.results.record import json_text, versions
from privfed.results.writer import ResultFolder, atomic_write, check_out_path, rescue_killed_runs

__all__ = [
    "FIGURE_FORMATS",
    "HelpFormatter",
    "OutputDir",
    "Parser",
    "SECURE_AGG_KINDS",
    "Terminated",
    "as_bool",
    "as_float",
    "as_int",
    "as_str",
    "check_out_path",
    "choose",
    "cli_entry",
    "data_line",
    "default_out_name",
    "heartbeat",
    "interruptible",
    "json_text",
    "keep_finished",
    "parse_float_list",
    "parse_int_list",
    "parse_seeds",
    "parse_str_list",
    "periodic_checkpoint",
    "placement_word",
    "prepare_out_dir",
    "reporting_finished_run",
    "signals_deferred",
    "versions",
    "write_json",
]

#: Every figure is written in these formats, side by side (PNG to look at, PDF and SVG for papers).
FIGURE_FORMATS = ("png", "pdf", "svg")


# ---------------------------------------------------------------- result folders
# One writer for every command: privfed.results.writer (staging folder, manifest with hashes, lock, swap).


def _slug(text: str) -> str:
    out = "".join(c if (c.isalnum() or c in ".") else "-" for c in str(text))
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:60]


def default_out_name(prefix: str, *parts: str) -> Path:
    """``results/<prefix>-<what ran>-<time>``: a fresh folder whose name says what ran (``-1``, ``-2``, ... after
    it where that name is taken, by a finished run or by one that holds its lock)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    what = "-".join(s for s in (_slug(p) for p in parts if p) if s)
    base = f"{prefix}-{what}-{stamp}" if what else f"{prefix}-{stamp}"
    path = Path("results") / base
    i = 1
    while path.exists() or lock_file(path).exists():
        path = Path("results") / f"{base}-{i}"
        i += 1
    return path


#: Default folder names tried when runs started in the same second take them at once.
_NAME_TRIES = 64


class OutputDir(ResultFolder):
    """A command's result folder: :class:`privfed.results.writer.ResultFolder` with the commands' defaults.

    ``out=None`` is a fresh ``results/<prefix>-<what ran>-<time>``.  Files go
    to a staging folder beside ``out``; :meth:`finish` writes the manifest
    last and moves the run into place in one step (swapping out a previous
    run with ``overwrite``); :meth:`abandon` removes a run that wrote
    nothing.  The folder is locked against a second run from construction
    to :meth:`finish` / :meth:`abandon`.
    """

    def __init__(
        self,
        out: str | Path | None,
        prefix: str,
        *,
        overwrite: bool = False,
        name_parts: Sequence[str] = (),
        command: str = "",
    ) -> None:
        command = command or " ".join(sys.argv)
        if out is not None:
            super().__init__(out, overwrite=overwrite, command=command)
            return
        # A default name is never asked for again: what killed runs left under one is rescued here.
        rescue_killed_runs("results", prefix)
        for _ in range(_NAME_TRIES):  # runs started in the same second (a job array) each get their own
            try:
                super().__init__(default_out_name(prefix, *name_parts), overwrite=overwrite, command=command)
                return
            except FolderInUse:
                continue
        raise ConfigError(f"no free folder name under results/ after {_NAME_TRIES} tries; pass --out")

    def write_text(self, name: str, text: str) -> Path:
        """Write ``text`` to ``name`` atomically."""
        return self.write(name, lambda p: p.write_text(text))

    def write_json(self, name: str, payload: Any) -> Path:
        """Write ``payload`` as JSON (inf/NaN as strings) atomically."""
        return self.write_text(name, json_text(payload))

    def write_csv(self, name: str, rows: Sequence[dict[str, Any]], fieldnames: Sequence[str]) -> Path:
        """Write ``rows`` as a CSV with the columns ``fieldnames`` atomically."""

        def write(p: Path) -> None:
            with p.open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(fieldnames))
                w.writeheader()
                for r in rows:
                    w.writerow({k: r.get(k, "") for k in fieldnames})

        return self.write(name, write)

    def save_figure(self, name: str, fig: Any, **kwargs: Any) -> Path:
        """Save a matplotlib figure atomically (format from the name's suffix)."""
        fmt = name.rsplit(".", 1)[-1]
        return self.write(name, lambda p: fig.savefig(p, format=fmt, **kwargs))

    def save_figures(self, stem: str, fig: Any, **kwargs: Any) -> list[Path]:
        """Save a figure as ``stem.png``, ``stem.pdf`` and ``stem.svg`` (:data:`FIGURE_FORMATS`), atomically."""
        return [self.save_figure(f"{stem}.{fmt}", fig, **kwargs) for fmt in FIGURE_FORMATS]

    def finish(self, command: str, *, complete: bool, drop: Sequence[str] = ()) -> Path:
        """Drop ``drop``, write the manifest last and move the run into place; returns where it went."""
        if complete:  # a stop whose exception Python dropped: the run is not published as complete
            stop_if_taken()
        self.command = command
        self.remove(drop)
        return self.publish(complete=complete)

    def abandon(self) -> None:
        """A run that wrote nothing: no folder is left (a previous run in ``out`` stays as it was)."""
        self.discard()


def prepare_out_dir(out: str | None, prefix: str, *, overwrite: bool = False) -> Path:
    """The output folder (created): a new timestamped one under results/ by default.

    An existing non-empty folder is refused unless ``overwrite`` (then it may
    hold only a previous privfed run): a previous run is never mixed in silently.
    """
    path = default_out_name(prefix) if out is None else check_out_path(out, overwrite=overwrite)[0]
    path.mkdir(parents=True, exist_ok=True)
    return path


#: The words every output uses for where the noise is added.
PLACEMENT_WORDS = ("local", "secure sum", "trusted aggregator")


def data_line(rules: dict[str, Any]) -> str:
    """One line of every command's header: what data the run used, and how it was split."""
    unused = f", {rules['unused_samples']} unused" if rules["unused_samples"] else ""
    thin = []  # what the partition leaves thin (records of older runs lack the counts)
    if rules.get("empty_clients"):
        thin.append(f"{rules['empty_clients']} client(s) empty")
    if rules.get("single_sample_clients"):
        thin.append(f"{rules['single_sample_clients']} client(s) with one sample")
    if rules.get("untrained_classes"):
        classes = rules["untrained_classes"]
        thin.append(
            f"class(es) {classes[:10]}{' ...' if len(classes) > 10 else ''} with no training sample used"
        )
    thin_text = f"; {', '.join(thin)}" if thin else ""
    return (
        f"data: {rules['train_samples']} training samples over {rules['clients']} clients by {rules['partition']}"
        f" ({rules['used_samples']} used{unused}{thin_text}); {rules['test_split']}"
    )


def placement_word(stated: Any, fallback: str) -> str:
    """A report's placement in the outputs' words ("local", "secure sum", "trusted aggregator").

    ``fallback`` (derived from the run's settings) is used when the report states none.
    """
    if not isinstance(stated, str) or not stated.strip():
        return fallback
    low = stated.lower().replace("_", " ").replace("-", " ")
    for word, keys in (
        ("secure sum", ("secure", "distributed")),
        ("trusted aggregator", ("trusted", "server", "central")),
        ("local", ("local", "client")),
    ):
        if low.startswith(word) or any(low.startswith(k) for k in keys):
            return word
    return stated


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (temporary name, fsync, then rename)."""
    text = json_text(payload)
    atomic_write(Path(path), lambda p: p.write_text(text))


#: import name -> what to install, for optional dependencies the commands may need.
_PIP_NAMES = {
    "skimage": "scikit-image",
    "tenseal": "tenseal",
    "matplotlib": "matplotlib",
    "opendp": "opendp",
    "torchvision": "torchvision",
    "opacus": "opacus",
    "torch": "torch",
    "flwr": "flwr[simulation]",
}


def _one_line_warning(prog: str) -> Callable[..., None]:
    """A warning a command shows: one line naming the command, not Python's file:line and source echo."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split())
        try:
            print(f"{prog}: warning: {text}", file=file or sys.stderr)
        except (OSError, ValueError):
            pass

    return show


def _tell(text: str) -> None:
    """A command's last line on standard error: a full disk or a reader gone there must not raise from the
    handler that is reporting how the command ended (its status says it all the same)."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr)


def _cwd_exists() -> bool:
    import os

    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True


def cli_entry(
    prog: str, body: Callable[[Sequence[str] | None], int]
) -> Callable[[Sequence[str] | None], int]:
    """Wrap a CLI body: user mistakes print one line on stderr and exit 2, no traceback.

    Ctrl-C exits 130, SIGTERM 143 and SIGHUP 129 (128 + the signal number), after the
    body has written what finished.  A ``prog`` of the form ``python -m privfed.<command>`` is shown as
    ``privfed-<command>`` when the installed script started the command.
    """
    prog_given = prog

    def main(argv: Sequence[str] | None = None) -> int:
        import signal
        import threading

        prog = shown_prog(prog_given)  # privfed-tradeoff when started by its script

        if threading.current_thread() is threading.main_thread() and getattr(
            signal.getsignal(signal.SIGINT), "privfed_start", False
        ):  # from here on Ctrl-C is a KeyboardInterrupt, handled below after what finished is written
            signal.signal(signal.SIGINT, interrupt_taken)
        kept = plain_errors((sys.stdout, sys.stderr))
        stdout, stderr = sys.stdout, sys.stderr
        if stdout is not None:
            sys.stdout = GuardedStdout(stdout)
        if stderr is not None:
            sys.stderr = QuietStderr(stderr)
        status: int | None = None  # the body's, once it returned: a signal after that changes nothing
        try:
            with stops_kept(), interruptible(), warnings.catch_warnings():
                warnings.showwarning = _one_line_warning(prog)  # restored when the body ends
                from privfed._validation import memory_limit
                from privfed.stats import dense_view_limit

                # a malformed $PRIVFED_DENSE_VIEW_LIMIT or $PRIVFED_MEMORY_LIMIT: one line at once, not a
                # placement left out mid-run (the memory check of each variant reads it)
                dense_view_limit()
                memory_limit()  # the variable alone: what the system has free is read where it is needed
                status = body(argv)
                from privfed.commands import start

                if start.PROCESS_ENDS and threading.current_thread() is threading.main_thread():
                    # the report is out before a signal can end the process (exit_with reports a failed write)
                    with contextlib.suppress(OSError, ValueError, AttributeError):
                        sys.stdout.flush()
                    # installed inside the block, which then leaves them: no moment with the default handlers
                    start.finish_on_signal(status)  # the process ends with this status, whatever comes now
            return status
        except BrokenPipeError as exc:
            # `| head` stopped reading: like any Unix tool, stop quietly (128 + SIGPIPE)
            if stdout_reader_gone():
                silence_stdout()
                return 141
            _tell(f"{prog}: error: {exc}")
            return 1
        except StdoutFailed as exc:
            silence_stdout()  # a full or failing device (> log on a full disk): one line, not a traceback
            _tell(f"{prog}: error: could not write to standard output ({exc})")
            return 1
        except PrivfedError as exc:
            _tell(f"{prog}: error: {exc}")
            return 2
        except FileNotFoundError as exc:
            if exc.filename is None and not _cwd_exists():  # os.getcwd() itself failed: no path to name
                _tell(f"{prog}: error: the working folder no longer exists; cd to a folder that does")
            else:
                _tell(f"{prog}: error: file not found: {exc.filename or exc}")
            return 2
        except ModuleNotFoundError as exc:
            top = (exc.name or "").split(".")[0]
            if top not in _PIP_NAMES:
                raise
            from privfed.optional import EXTRAS

            extra = f' (or the extra: pip install "privfed[{EXTRAS[top]}]")' if top in EXTRAS else ""
            _tell(
                f"{prog}: error: this run needs the optional package {_PIP_NAMES[top]!r}, which is not "
                f"installed: pip install {_PIP_NAMES[top]}{extra}"
            )
            return 2
        except MemoryError as exc:  # past what the memory checks foresaw (another process took the memory)
            _tell(
                f"{prog}: error: out of memory ({str(exc) or 'an allocation failed'}); lower the run's sizes or free "
                "memory ($PRIVFED_MEMORY_LIMIT tells the checks what this run may use)"
            )
            return 1
        except Terminated as exc:
            if status is not None:  # on its way out, after the body finished
                return status
            _tell(f"{prog}: terminated ({exc.name})")  # after SIGHUP the terminal may be gone
            return 128 + exc.signum
        except KeyboardInterrupt:
            if status is not None:
                return status
            _tell(f"{prog}: interrupted")
            return 130
        finally:
            if isinstance(sys.stdout, GuardedStdout):
                sys.stdout = stdout
            if isinstance(sys.stderr, QuietStderr):
                sys.stderr = stderr
            for stream, errors in kept:
                try:
                    stream.reconfigure(errors=errors)
                except (ValueError, OSError):
                    pass

    return main
