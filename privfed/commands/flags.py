"""The flags every command shares, defined once: names, help, defaults, and the federation they describe.

Imports nothing but argparse (and, for a parser's one-line errors, :mod:`privfed.errors`), so that
``--help`` answers at once.  :data:`SHARED` holds the flags of all three commands, :data:`PAIRED`
those two of them share; :func:`add_shared` adds them to a parser with one help text and one
default each; :data:`FEDERATION` is the one federation the defaults describe.  The parsers
themselves are in :mod:`privfed.commands.options`.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ATTACK_NAMES",
    "FEDERATION",
    "HelpFormatter",
    "LEVEL_HELP",
    "METHOD_NAMES",
    "PAIRED",
    "PARTITION_NAMES",
    "Parser",
    "SECURE_AGG_KINDS",
    "SHARED",
    "SharedFlag",
    "add_shared",
]

#: privfed.methods.available(), listed here so that --help imports no method.
METHOD_NAMES = ("fed3r", "fed3r-within", "fedcgs", "fedcof", "fedcof-oracle", "fedlog", "fedncm")
#: attacks.available().
ATTACK_NAMES = ("differencing", "inversion", "labels", "singleton", "subspace", "tracing", "unmixing")
#: privfed.federation.available_schemes().
PARTITION_NAMES = ("dirichlet", "dirichlet-class", "iid", "natural", "shards")
#: --secure-agg values every command takes (the Flower app adds Flower's own SecAgg+, for comparison).
SECURE_AGG_KINDS = ("none", "mask", "ckks")

#: The one federation every command describes by default: the FedNCM / FedCOF setting on the embedded digits.
FEDERATION: dict[str, Any] = {
    "method": "fedlog",
    "dataset": "digits",
    "clients": 100,
    "partition": "dirichlet",
    "alpha": 0.1,
    "eps": 0.1,
    "delta": 1e-5,
    "level": "record",
    "secure_agg": "none",
    "seeds": 1,
}


# ---------------------------------------------------------------- parsers
def _given_once(action: argparse.Action, parser, shown: str, fix: str) -> None:
    """Record ``action`` as given in this parse (``shown``: how a refusal names it), refusing a second time."""
    given = parser._given  # this parse's flags (Parser.parse_known_args starts each parse with none)
    if action.dest in given:
        raise argparse.ArgumentError(action, f"given twice ({given[action.dest]}, then {shown}); {fix}")
    given[action.dest] = shown


class _Once(argparse._StoreAction):
    """A flag that takes one value: given again, it is refused (argparse would keep the last silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        hint = (
            " (a list goes in one flag, comma-separated)"
            if self.metavar and "LIST" in str(self.metavar)
            else ""
        )
        _given_once(self, parser, repr(values), "pass it once" + hint)
        setattr(namespace, self.dest, values)


class _OnceSwitch(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x``: both, or one of them twice, is refused (argparse would keep the last silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        _given_once(self, parser, str(option_string), "pass one")
        super().__call__(parser, namespace, values, option_string)


class _OnceTrue(argparse._StoreTrueAction):
    """An on switch (``--no-plot``): given twice, it is refused, as every flag is."""

    def __call__(self, parser, namespace, values, option_string=None):
        _given_once(self, parser, str(option_string), "pass it once")
        super().__call__(parser, namespace, values, option_string)


#: A command-line word that starts like a negative number (a flag's value, never a flag of privfed's).
_NEGATIVE = re.compile(r"-(\d|\.\d|inf|nan)", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (a ConfigError naming the flag) instead of usage + exit, and a flag that
    takes one value refused when it is given twice."""

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102
        self._given = {}  # the flags given in this parse (a value its default equals is still given)
        return super().parse_known_args(self._joined(sys.argv[1:] if args is None else list(args)), namespace)

    def _joined(self, args: list[str]) -> list[str]:
        """A value that starts like a negative number (``-1,2``, ``-inf``, ``-1e-5``) after a flag that takes one
        value, joined to it (``--eps=-1,2``): argparse reads it as an unknown flag and says only "expected one
        argument", where the command's own check names the flag and its rule."""
        one = {s for a in self._actions if a.option_strings and a.nargs is None for s in a.option_strings}
        out: list[str] = []
        for i, tok in enumerate(args):
            if tok == "--":
                return out + args[i:]
            if out and out[-1] in one and _NEGATIVE.match(tok):
                out[-1] = f"{out[-1]}={tok}"
            else:
                out.append(tok)
        return out

    def add_argument(self, *args, **kwargs):  # noqa: D102
        if args and str(args[0]).startswith("-") and kwargs.get("action") in (None, "store"):
            kwargs["action"] = _Once
        elif kwargs.get("action") is argparse.BooleanOptionalAction:
            kwargs["action"] = _OnceSwitch
        elif kwargs.get("action") == "store_true":
            kwargs["action"] = _OnceTrue
        return super().add_argument(*args, **kwargs)

    def error(self, message: str):  # noqa: D102
        from privfed.errors import ConfigError

        raise ConfigError(f"{message} (see --help)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help (unless the help names it); the epilog kept as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            "default" in text.lower()
            or action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


# ---------------------------------------------------------------- the shared flags
@dataclass(frozen=True)
class SharedFlag:
    """One flag every command that has it spells, explains and defaults the same way.

    ``default`` is the text ``--help`` shows; the parsers leave the value ``None`` so
    that a ``--config`` file can fill it in, and the command's resolved configuration
    applies the default (one place: :data:`FEDERATION`).
    """

    flag: str
    metavar: str | None
    help: str
    default: str
    kwargs: dict = field(default_factory=dict)

    def text(self, extra: str = "") -> str:
        return f"{self.help}{extra} (default: {self.default})"


LEVEL_HELP = (
    "neighbouring relation: record (add or remove one record of one client) or client (zero-out: one "
    "client's whole data replaced by none; noise on the aggregate)"
)

#: Flags shared by the three commands (and the Flower app's run-config keys of the same names).
SHARED: dict[str, SharedFlag] = {
    f.flag: f
    for f in (
        SharedFlag(
            "--method",
            "NAME",
            "method(s) whose statistics the clients upload, from: " + ", ".join(METHOD_NAMES) + " (any case)",
            FEDERATION["method"],
        ),
        SharedFlag(
            "--dataset",
            "NAME",
            "data: digits (embedded, offline: 899 private training images, 359 held out for testing, 539 "
            "public images that trained the backbone)",
            FEDERATION["dataset"],
        ),
        SharedFlag("--clients", "K", "number of clients", str(FEDERATION["clients"])),
        SharedFlag(
            "--partition",
            "SCHEME",
            "how the training samples are split over the clients: dirichlet (each client gets floor(N/K) "
            "samples, classes drawn from Dirichlet(alpha), the rest unused, as in FedNCM/FedCOF), "
            "dirichlet-class, shards, iid, or natural (a feature file's own clients array)",
            FEDERATION["partition"],
        ),
        SharedFlag("--alpha", "A", "Dirichlet concentration of the partition", f"{FEDERATION['alpha']:g}"),
        SharedFlag(
            "--eps",
            "EPS",
            "privacy budget epsilon > 0 of each release; inf: no protection (no clipping, no noise)",
            f"{FEDERATION['eps']:g}",
        ),
        SharedFlag("--delta", "D", "delta of (eps, delta)-DP, in (0, 1)", f"{FEDERATION['delta']:g}"),
        SharedFlag(
            "--clip",
            "C",
            "L2 bound of every record's feature vector, which the guarantee rests on",
            "for digits the median feature norm of the public split, no privacy cost; required for other data",
        ),
        SharedFlag("--level", None, LEVEL_HELP, FEDERATION["level"], {"choices": ("record", "client")}),
        SharedFlag(
            "--secure-agg",
            "{none,mask,ckks}",
            "secure aggregation: none, mask (pairwise masking) or ckks (TenSEAL); the server then sees only "
            "the sum of the uploads; a bare --secure-agg means mask",
            FEDERATION["secure_agg"],
            {"nargs": "?", "const": "mask"},
        ),
        SharedFlag(
            "--param",
            "METHOD.KEY=VALUE",
            "a method parameter, e.g. fedcof.gamma=0.1 or fed3r.lam=0.1 (repeatable; METHOD must be a method "
            "of the run)",
            "none",
            {"action": "append", "default": []},
        ),
        SharedFlag(
            "--seeds",
            "N|LIST",
            "seeds of the runs: a count N (seeds 0..N-1) or a list like 3,7 (one seed: 7,); seed s draws "
            "the partition and every simulated randomness of its run",
            f"{FEDERATION['seeds']} (seed 0)",
        ),
        SharedFlag(
            "--out",
            "DIR",
            "output folder, new or empty: results.json (the run record) and manifest.json, beside",
            "a fresh results/<command>-<what ran>-<time>",
        ),
        SharedFlag(
            "--overwrite",
            None,
            "--out may be a previous privfed run's folder: its files are replaced so the folder holds only "
            "this run (a folder holding other files is refused)",
            "off",
            {"action": "store_true"},
        ),
        SharedFlag("--quiet", None, "no progress bars or logs on stderr", "off", {"action": "store_true"}),
        SharedFlag("--no-plot", None, "write no figures (PNG, PDF, SVG)", "off", {"action": "store_true"}),
        SharedFlag(
            "--config",
            "FILE",
            "a TOML file (keys named like the flags, with underscores or dashes; --param is the table method_params, "
            "--no-plot is plot = false, and --out, --overwrite, --quiet stay on the command line) or a previous "
            "run's results.json with the settings; flags given on the command line override it",
            "none",
        ),
    )
}

#: Flags two of the commands share, defined once too.
PAIRED: dict[str, SharedFlag] = {
    f.flag: f
    for f in (
        SharedFlag(
            "--count-noise",
            "KIND",
            "instead of the Gaussian mechanism on sums and counts, noise the class counts only, means in "
            "clear (FedCOF App. I.1): laplace, geometric, gaussian, or uniform (NO DP GUARANTEE)",
            "none",
        ),
        SharedFlag(
            "--trusted-aggregator",
            None,
            "the server is trusted to add the noise once, to the sum (sum-only methods)",
            "off: each client noises its upload, or adds a share of the noise under --secure-agg",
            {"action": "store_true", "default": None},
        ),
        SharedFlag(
            "--max-records",
            "N",
            "client level: the most records one client contributes (a public bound)",
            "none",
        ),
        SharedFlag(
            "--rounds",
            "T",
            "multi-round FedLog (--method fedlog only): T rounds of local body training and head solving "
            "(privfed.rounds); 1 is the one-shot head",
            "1",
        ),
    )
}


def add_shared(p: argparse.ArgumentParser, names: list[str], *, extra: dict[str, str] | None = None) -> None:
    """Add the shared (or paired) flags ``names`` to ``p``, each defined once; ``extra`` appends a
    command's own words to a flag's help (what it accepts there), never another default."""
    extra = extra or {}
    for name in names:
        f = SHARED.get(name) or PAIRED[name]
        kwargs = {"default": None, **f.kwargs}
        if f.metavar is not None and kwargs.get("action") not in ("store_true",):
            kwargs.setdefault("metavar", f.metavar)
        p.add_argument(f.flag, help=f.text(extra.get(name, "")), **kwargs)
