"""The flags and help of every privfed command, importable in a blink.

``--help`` must answer in well under a second, so this module imports
nothing but argparse (and, for a parser's one-line errors,
:mod:`privfed.errors`): the method, attack and partition names are listed
here (a test checks them against the registries), and each command answers
``--help`` through :func:`answer_help` before importing its machinery.

One style for all three commands.  The flags they share are defined once,
in :data:`SHARED`: one name, one meaning, one default, the same words in
every ``--help``, and the same names as the Flower app's run-config keys
(``--secure-agg`` is ``secure-agg``, ``--eps`` is ``eps``).  The defaults
describe one federation (:data:`FEDERATION`), so the three commands run on
the same data unless told otherwise.  Lists are comma-separated where a
command sweeps; every default is shown.  Older spellings (``--secure``,
``--output``, ``--epsilon``, ``--seed``) still work, hidden.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ATTACK_NAMES",
    "FEDERATION",
    "HelpFormatter",
    "METHOD_NAMES",
    "PARTITION_NAMES",
    "Parser",
    "SECURE_AGG_KINDS",
    "SHARED",
    "SharedFlag",
    "add_shared",
    "answer_help",
    "attack_parser",
    "flower_parser",
    "tradeoff_parser",
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
class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (a ConfigError naming the flag) instead of usage + exit."""

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
        SharedFlag(
            "--clients", "K", "number of clients (Flower: simulated SuperNodes)", str(FEDERATION["clients"])
        ),
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
            "output folder, new or empty: results.json (the run record), results.csv, figures, manifest.json",
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
            "a TOML file (keys named like the flags, with underscores) or a previous run's results.json "
            "with the settings; flags given on the command line override it",
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


# ---------------------------------------------------------------- tradeoff
TRADEOFF_GLOSSARY = """\
output columns (table, results.csv, results.json):
  placement    where the noise is added: local (each client noises its own upload; nobody is trusted),
               secure sum (clients add shares of the noise under secure aggregation; the server sees only
               the noisy sum), trusted aggregator (the server is trusted to add the noise once, to the sum)
  protocol     secure aggregation protocol: none, mask (pairwise masking) or ckks (TenSEAL)
  eps          the epsilon the ledger computes for the run (classic calibration: may differ from the asked one;
               multi-round: composed over the rounds); 'NO DP' for heuristics without a guarantee (uniform
               count noise)
  delta        the delta used: 0 for pure DP (Laplace / geometric count noise)
  protects     (csv/json) what the guarantee covers: all released statistics, or the class counts only
               (count noise: the means go in clear and carry no protection)
  noise        Gaussian sigma on the sums / counts, or the count-noise scale (Laplace b = 1/eps)
  calibration  analytic (tight Gaussian), classic (the FedLog paper's bound), pure (Laplace / geometric)
  level        record (add or remove one record of one client) or client (zero-out: one client's whole
               data replaced by none)
  repairs      what the method did to noisy statistics: pairs dropped (count <= 0), PSD projection,
               pseudo-inverse
  non-private  the same method without clipping or noise (eps = inf)
  bytes/client what one client uploads (over every round of a multi-round run)
  guarantee    G1, G2, ...: the guarantee printed under the table that the row's release carries
"""


def tradeoff_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m privfed.tradeoff",
        formatter_class=HelpFormatter,
        description="Accuracy of federated heads under differential privacy (and attacks), "
        "over methods x budgets x seeds, with a table, a CSV/JSON and a plot.",
        epilog=TRADEOFF_GLOSSARY
        + "\nLists are comma-separated. Example: %(prog)s --method fedcof,fed3r,fedlog "
        "--eps 0.05,0.1,0.5,1,4,inf --seeds 5",
    )
    a = p.add_argument
    add_shared(
        p,
        ["--config", "--method", "--eps"],
        extra={"--method": "; a comma list", "--eps": "; a comma list"},
    )
    a(
        "--placement",
        metavar="LIST",
        help="where the noise is added: local, secure-sum, trusted, or all "
        "(default: all three for a single finite --eps, otherwise local; --secure-agg / --trusted-aggregator "
        "choose one)",
    )
    add_shared(p, ["--delta", "--level", "--clip"])
    a(
        "--clip-norm",
        choices=("l2", "coordinate"),
        help="l2: ||f||_2 <= C; coordinate: every coordinate in "
        "[-C, C] (FedLog's Theorem 3.1; needs an explicit --clip) (default: l2)",
    )
    a(
        "--calibration",
        choices=("analytic", "classic"),
        help="analytic Gaussian (tight) or the classic bound of "
        "the FedLog paper (valid only for eps <= 1) (default: analytic)",
    )
    add_shared(p, ["--rounds"])
    a("--local-epochs", metavar="E", help="multi-round fedlog: local epochs per round (default: 5)")
    a(
        "--families",
        metavar="LIST",
        help="multi-round fedlog: body families assigned to clients (default: cnn,cnn-narrow,mlp)",
    )
    a(
        "--init",
        choices=("public", "scratch"),
        help="multi-round fedlog: bodies start from networks trained on "
        "the public split, or from scratch (default: public)",
    )
    add_shared(p, ["--count-noise", "--max-records", "--trusted-aggregator"])
    add_shared(
        p,
        ["--clients", "--partition", "--alpha", "--dataset"],
        extra={
            "--dataset": "; file:PATH.npz (your features; without test arrays 20%% of its samples are held "
            "out for testing, stratified, seed 0), cifar100, cifar10 (torchvision)"
        },
    )
    a(
        "--backbone",
        metavar="NAME",
        help="feature extractor for torchvision datasets (squeezenet1_1, mobilenet_v2, "
        "vit_b_16) (default: the dataset's)",
    )
    a(
        "--download",
        action="store_true",
        default=None,
        help="allow downloading a torchvision dataset / weights",
    )
    a(
        "--attack",
        metavar="LIST",
        help="attacks to add as columns and a plot panel (digits only): tracing, "
        "singleton, inversion, labels, subspace, unmixing, differencing; tracing reports the strongest test of its "
        "suite, named (default: none)",
    )
    add_shared(
        p,
        ["--param", "--secure-agg", "--seeds", "--out", "--overwrite", "--quiet", "--no-plot"],
    )
    return p


# ---------------------------------------------------------------- attack
ATTACK_GLOSSARY = """\
output columns (printed lines, results.csv, results.json):
  placement    where the noise is added: local (each client noises its upload) or secure sum (clients add
               shares of the noise; the server sees only the noisy sum); none for eps = inf
  protocol     secure aggregation protocol: none, mask or ckks (the server's view is the sum either way)
  delta        the delta used (0 for pure DP count noise, and for eps = inf)
  auc          tracing / subspace: area under the ROC curve of the membership test (0.5 = chance);
               for tracing, auc is the Gaussian likelihood-ratio test and auc_inner the inner-product
               tracer (Dwork et al. 2015), both on the same targets
  tpr@0.01     true-positive rate at 1%% false positives
  psnr, delta_psnr   inversion: reconstruction PSNR (dB) and its gain over the public class-mean prior
  exposed_fraction   singleton: share of uploaded records alone in their (client, class) cell
  strongest_attack   tracing / inversion: the strongest attack of the suite on the same challenge (by auc /
               identification); strongest_auc / strongest_identification its value (with _se, and for
               inversion strongest_chance_identification); <attack>:<metric> each one
"""

#: attacks.inversion.attack.BACKENDS and the inversion suite of attacks.strongest, named here so that --help needs no
#: import of the attacks (a test holds them equal).
INVERSION_BACKENDS = ("pixel", "decoder", "dip", "learned", "set", "joint")
INVERSION_SUITE = ("pixel", "learned", "set", "joint", "joint-fit", "two-stage", "joint-wide", "per-cell")

#: The example --help shows (a test runs it and holds it to a few minutes on a cold cache).
ATTACK_EXAMPLE = "--attack inversion --method fedcof --eps inf,1,0.1"


def attack_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m privfed.attack",
        formatter_class=HelpFormatter,
        description="Attacks of an honest-but-curious server on shared statistics.",
        epilog=ATTACK_GLOSSARY
        + "\nLists are comma-separated. Examples:\n"
        + f"  %(prog)s {ATTACK_EXAMPLE} --no-strongest\n"
        + "      the pixel inversion alone, on the three releases: about a minute\n"
        + f"  %(prog)s {ATTACK_EXAMPLE}\n"
        + "      and the strongest of the inversion suite: it trains decoders on the public split first (once,\n"
        + "      cached); tens of minutes the first time on 2 cores, as the run says before it starts",
    )
    a = p.add_argument
    a("--attack", required=True, help=f"one of {', '.join(ATTACK_NAMES)}")
    add_shared(
        p,
        ["--config", "--method", "--eps", "--delta", "--level", "--clip"],
        extra={"--method": "; a comma list", "--eps": "; a comma list"},
    )
    add_shared(
        p,
        ["--clients", "--partition", "--alpha", "--dataset"],
        extra={
            "--partition": "; or groups: exactly n samples of one class on each client (--n, --max-groups)",
            "--dataset": "; attacks need its backbone and public split (the attacker's knowledge)",
        },
    )
    a("--n", metavar="LIST", help="--partition groups: samples per client (comma list) (default: 1,4,16)")
    a("--max-groups", metavar="K", help="--partition groups: at most this many clients (default: 40)")
    add_shared(p, ["--count-noise", "--param"])
    a(
        "--backend",
        default=None,
        help=f"inversion backend: {', '.join(INVERSION_BACKENDS)} (default: the attack's, "
        "pixel; the strongest report runs the whole suite: " + ", ".join(INVERSION_SUITE) + ")",
    )
    a("--source", default=None, help="inversion source: mean or second (two-stage) (default: the attack's)")
    a(
        "--steps",
        default=None,
        help="inversion optimisation steps, pixel or dip backend (default: the attack's)",
    )
    a("--max-cells", default=None, help="inversion: released cells inverted per run (default: the attack's)")
    a("--device", default="cpu", help="torch device for the backbone (cpu or cuda)")
    a(
        "--strongest",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="tracing / inversion: also run the whole attack suite on the same challenge and report the strongest, "
        "named; the inversion suite needs decoders trained on the public split (shipped for digits, otherwise "
        "trained once and cached; the run says how long before it starts) (default: on)",
    )
    add_shared(p, ["--secure-agg", "--seeds", "--out", "--overwrite", "--quiet", "--no-plot"])
    a("--seed", dest="seed_list", help=argparse.SUPPRESS)  # older spelling: a list of seeds ('3' = seed 3)
    return p


# ---------------------------------------------------------------- flower
FLOWER_EPILOG = """\
data: every node holds partition seed of --clients partitions of --dataset (digits: the 899-image
private split; the 359 test images, 20 % of digits, are held out for the printed accuracy).
--eps and --seeds take one value: a Flower run is one release (sweep budgets and seeds with
privfed.tradeoff, a simulation). The run goes through Flower's own entry point (flwr run) on a
SuperLink in simulation mode that this command starts on 127.0.0.1 and stops; SuperLink and
SuperNodes on separate machines: flwr run on privfed/flower/app (see the docs' Flower page).
"""


def flower_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m privfed.flower",
        formatter_class=HelpFormatter,
        description="One privfed aggregation as a Flower app (simulation on this machine).",
        epilog=FLOWER_EPILOG,
    )
    a = p.add_argument
    add_shared(p, ["--config", "--method", "--param"], extra={"--method": "; one method"})
    a(
        "--method-params", metavar="JSON", help=argparse.SUPPRESS
    )  # older spelling of --param, as a JSON object
    add_shared(
        p,
        ["--clients", "--partition", "--alpha", "--dataset"],
        extra={
            "--dataset": "; file:PATH (each node's features) or synthetic:D:N (N random D-dim samples a node)"
        },
    )
    a("--num-classes", metavar="C", help="number of classes (default: the data set's)")
    add_shared(p, ["--eps", "--delta", "--clip", "--level"], extra={"--eps": "; one value"})
    a("--epsilon", dest="eps", help=argparse.SUPPRESS)
    add_shared(p, ["--trusted-aggregator", "--max-records"])
    # "flwr-secaggplus" is accepted only so that the run can say why it is refused
    a(
        "--secure-agg",
        metavar="{none,mask,ckks,flwr-secaggplus-insecure}",
        nargs="?",
        const="mask",
        default=None,
        help=SHARED["--secure-agg"].text(
            "; or flwr-secaggplus-insecure (Flower's SecAgg+, for comparison only: a deviating server "
            "recovers any node's input; sum-only methods; needs --clip and --max-records as public scaling "
            "bounds). mask is secure against a deviating server (signed keys, a consistency round, one "
            "session per aggregation); ckks: a node holds the keys"
        ),
    )
    a("--secure", dest="secure_agg", help=argparse.SUPPRESS)
    a("--threshold", type=int, default=None, help="Shamir threshold (default: a majority)")
    a(
        "--degree",
        type=int,
        default=None,
        help="--secure-agg mask: the SecAgg+ degree k (even) of the graph in the nodes' roster (default: "
        "the complete graph)",
    )
    a(
        "--dropout-tolerance",
        type=int,
        default=0,
        help="DP with --secure-agg: nodes that may drop while the others' noise shares carry sigma^2",
    )
    a("--frac-bits", type=int, default=32, help="fixed-point fraction bits of masked uploads")
    a(
        "--wire",
        choices=("float64", "compact"),
        default="float64",
        help="plain uploads: float64 dense (exact) or compact (float32, held classes only without DP)",
    )
    add_shared(p, ["--rounds"])
    a(
        "--rounds-params",
        default="{}",
        help="JSON object of privfed.rounds.RoundsConfig settings, e.g. '{\"local_epochs\": 1}'",
    )
    add_shared(p, ["--seeds"], extra={"--seeds": "; one seed per Flower run"})
    a("--seed", dest="seed_one", type=int, help=argparse.SUPPRESS)  # older spelling: the partition seed
    a(
        "--noise-seed",
        type=int,
        default=None,
        help="reproducible noise (a simulation, not a private release) (default: OS entropy)",
    )
    a(
        "--timeout",
        type=float,
        default=None,
        help="seconds any one stage may take (default: 120 s plus 10 s per node, doubled with --secure-agg)",
    )
    a(
        "--connect-timeout",
        type=float,
        default=None,
        help="seconds to wait for the nodes to connect (default: 120 s)",
    )
    a(
        "--min-clients",
        type=int,
        default=None,
        help="fewest replies a plain run accepts (default: all --clients)",
    )
    a("--num-cpus", type=int, default=1, help="CPUs the simulation may use")
    add_shared(p, ["--out", "--overwrite", "--quiet", "--no-plot"])
    a("--output", dest="out", help=argparse.SUPPRESS)
    a("--verbose", action="store_true", help="every line of Flower's and Ray's logs")
    return p


_PARSERS = {"tradeoff": tradeoff_parser, "attack": attack_parser, "flower": flower_parser}


def answer_help(command: str, argv: list[str] | None = None) -> None:
    """Print ``command``'s help and exit when ``argv`` asks for it (before any heavy import)."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        _PARSERS[command]().print_help()
        raise SystemExit(0)
