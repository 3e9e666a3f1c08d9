"""The flags and help of every privfed command, importable in a blink.

``--help`` must answer in well under a second, so this module imports
nothing heavier than argparse and :mod:`privfed.commands.common` (numpy): the method
and attack names are listed here (a test checks them against the
registries), and each command answers ``--help`` through
:func:`answer_help` before importing its machinery.

One style for all three commands: the same flag for the same thing
(``--secure-agg``, ``--out``, ``--eps``, ``--method``, ``--clients``,
``--partition``, ``--alpha``, ``--level``, ``--clip``, ``--delta``),
comma-separated lists where a command sweeps, every default shown.  Older
spellings (``--secure``, ``--output``, ``--epsilon``) still work, hidden.
"""

from __future__ import annotations

import argparse
import sys

from privfed.commands.common import HelpFormatter, Parser, add_common_arguments

#: mechanisms.secagg.threat.threshold_rule(), written out: --help imports nothing heavy (a test checks the two).
THRESHOLD_RULE = (
    "t = max(2, floor((n + 1)/2) + 1) with n = K (or k + 1 with a SecAgg+ degree k): the smallest "
    "threshold that tolerates 1 colluding node (2 when n is odd; tolerated: 2t - n - 1)"
)

__all__ = [
    "ATTACK_NAMES",
    "METHOD_NAMES",
    "THRESHOLD_RULE",
    "answer_help",
    "attack_parser",
    "flower_parser",
    "tradeoff_parser",
]

#: privfed.methods.available(), listed here so that --help imports no method.
METHOD_NAMES = ("fed3r", "fed3r-within", "fedcgs", "fedcof", "fedcof-oracle", "fedlog", "fedncm")
#: attacks.available().
ATTACK_NAMES = ("differencing", "inversion", "labels", "singleton", "subspace", "tracing", "unmixing")

LEVEL_HELP = (
    "neighbouring relation: record (add or remove one record of one client) or client (zero-out: one "
    "client's whole data replaced by none)"
)


TRADEOFF_GLOSSARY = """\
output columns (table, results.csv, results.json):
  placement    where the noise is added: local (each client noises its own upload; nobody is trusted),
               secure sum (clients add shares of the noise under secure aggregation; the server sees only
               the noisy sum), trusted aggregator (the server is trusted to add the noise once, to the sum)
  protocol     secure aggregation protocol: none, mask (pairwise masking) or ckks (TenSEAL)
  eps          the epsilon the ledger computes for the run (classic calibration: may differ from the asked one);
               'NO DP' for heuristics without a guarantee (uniform count noise)
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
"""


def tradeoff_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m privfed.tradeoff",
        formatter_class=HelpFormatter,
        description="Accuracy of federated heads under differential privacy (and attacks), "
        "over methods x budgets x seeds, with a table, a CSV/JSON and a plot.",
        epilog=TRADEOFF_GLOSSARY
        + "\neps=inf means no protection (no clipping, no noise). Lists are comma-separated.\n"
        "Example: %(prog)s --method fedcof,fed3r,fedlog --eps 0.05,0.1,0.5,1,4,inf",
    )
    a = p.add_argument
    a(
        "--config",
        metavar="FILE",
        help="TOML file (or a previous run's results.json) with the same settings; "
        "flags override it (default: none)",
    )
    a("--method", metavar="LIST", help=f"methods, from: {', '.join(METHOD_NAMES)} (default: fedlog)")
    a("--eps", metavar="LIST", help="privacy budgets epsilon > 0, 'inf' for none (default: 0.1)")
    a(
        "--placement",
        metavar="LIST",
        help="where the noise is added: local, secure-sum, trusted, or all "
        "(default: all three for a single finite --eps, otherwise local; --secure-agg / --trusted-aggregator "
        "choose one)",
    )
    a("--delta", metavar="D", help="delta of (eps, delta)-DP, in (0, 1) (default: 1e-05)")
    a(
        "--level",
        choices=("record", "client"),
        help="neighbouring relation: record (add or remove one record of one "
        "client) or client (zero-out: one client's whole data replaced by none; noise on the aggregate, needs "
        "--secure-agg or a trusted aggregator) (default: record)",
    )
    a(
        "--clip",
        metavar="C",
        help="L2 clip bound of each feature (default: for digits the median feature norm of "
        "the public split, no privacy cost; required for other datasets)",
    )
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
    a(
        "--rounds",
        metavar="T",
        help="number of releases composed (default: 1); with --method fedlog alone, "
        "T > 1 runs multi-round FedLog with local bodies (privfed.rounds) beside the one-shot head",
    )
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
    a(
        "--count-noise",
        metavar="KIND",
        help="instead of the Gaussian mechanism on sums and counts, noise the class "
        "counts only, means in clear (FedCOF App. I.1): laplace, geometric, gaussian, or uniform (NO DP GUARANTEE) "
        "(default: none)",
    )
    a(
        "--max-records",
        metavar="N",
        help="client level: the most records one client contributes (default: none)",
    )
    a(
        "--trusted-aggregator",
        action="store_true",
        default=None,
        help="same as --placement trusted: the server is trusted to add the noise once, to the sum (sum-only methods)",
    )
    a("--clients", metavar="K", help="number of clients (default: 100)")
    a(
        "--partition",
        metavar="SCHEME",
        help="dirichlet, dirichlet-class, shards, iid or natural; a feature file's "
        "own 'clients' array is used only with natural (dirichlet gives each client floor(N/K) samples, the rest "
        "unused, as in FedNCM/FedCOF) (default: dirichlet)",
    )
    a("--alpha", metavar="A", help="Dirichlet concentration (default: 0.1)")
    a(
        "--dataset",
        metavar="NAME",
        help="digits (offline), file:PATH.npz, cifar100, cifar10; a file without "
        "test arrays has 20%% of its samples held out for testing (stratified, seed 0) (default: digits)",
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
    a(
        "--param",
        action="append",
        default=[],
        metavar="METHOD.KEY=VALUE",
        help="a method parameter, e.g. fedcof.gamma=0.1 or fed3r.lam=0.1 (repeatable; METHOD must be in --method) "
        "(default: none)",
    )
    add_common_arguments(p, prefix="tradeoff", seeds_default="5")
    a("--no-plot", action="store_true", help="skip the PNG")
    return p


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


def attack_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m privfed.attack",
        formatter_class=HelpFormatter,
        description="Attacks of an honest-but-curious server on shared statistics.",
        epilog=ATTACK_GLOSSARY + "\nLists are comma-separated. Example: %(prog)s --attack inversion "
        "--method fedcof --eps inf,1,0.1",
    )
    a = p.add_argument
    a("--attack", required=True, help=f"one of {', '.join(ATTACK_NAMES)}")
    a("--method", default="fedncm", help="method name(s) whose uploads the server sees (comma list)")
    a("--eps", default="inf", help="privacy budgets (comma list; inf = clean release)")
    a("--delta", default="1e-05", help="delta of the Gaussian mechanism")
    a("--clip", default=None, help="L2 clip bound for finite eps (default: the public split's median norm)")
    a("--n", default="1,4,16", help="samples per client for --partition groups (comma list)")
    a("--partition", default="groups", help="groups, or a privfed.federation scheme (dirichlet, iid, ...)")
    a("--clients", default="30", help="number of clients for non-group partitions")
    a("--alpha", default="0.1", help="Dirichlet concentration")
    a("--max-groups", default="40", help="at most this many clients in --partition groups")
    a(
        "--count-noise",
        default=None,
        help="noise on the counts only (FedCOF App. I.1) instead of the Gaussian "
        "mechanism: laplace, geometric, gaussian or uniform (no DP) (default: none)",
    )
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
        "named (default: on)",
    )
    add_common_arguments(p, prefix="attack", seeds_default="1 (seed 0)")
    a("--seed", dest="seed_list", help=argparse.SUPPRESS)  # older spelling: a list of seeds ('3' = seed 3)
    return p


FLOWER_EPILOG = """\
data: every node holds partition --seed of --clients partitions of the embedded digits data set (the
899-image private split; the 359 test images, 20 % of digits, are held out for the printed accuracy).
--eps takes one budget: a Flower run is one release (sweep budgets with privfed.tradeoff).
SuperLink and SuperNodes on separate machines: flwr run (see the docs' Flower page).
"""


def flower_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m privfed.flower",
        formatter_class=HelpFormatter,
        description="One privfed aggregation as a Flower app (simulation on this machine).",
        epilog=FLOWER_EPILOG,
    )
    a = p.add_argument
    a("--method", default="fedncm", help=f"a method, from: {', '.join(METHOD_NAMES)}")
    a(
        "--param",
        action="append",
        default=[],
        metavar="METHOD.KEY=VALUE",
        help="a method parameter, e.g. fedcof.gamma=0.1 (repeatable; as in privfed.tradeoff) (default: none)",
    )
    a("--method-params", default="{}", help="JSON object of the method's parameters, e.g. '{\"gamma\": 0.1}'")
    a("--clients", type=int, default=10, help="number of nodes (simulated SuperNodes)")
    a(
        "--eps",
        dest="epsilon",
        default="inf",
        metavar="EPS",
        help="privacy budget epsilon > 0 (one value; inf: no noise)",
    )
    a("--epsilon", dest="epsilon", help=argparse.SUPPRESS)
    a("--delta", type=float, default=1e-5, help="delta of (eps, delta)-DP")
    a(
        "--clip",
        type=float,
        default=None,
        help="L2 bound of every record (required for a finite --eps) (default: none)",
    )
    a("--level", choices=("record", "client"), default="record", help=LEVEL_HELP)
    a(
        "--trusted-aggregator",
        action="store_true",
        help="the server adds the noise to the sum (default: each "
        "node noises its upload, or adds a share of the noise under --secure-agg)",
    )
    a(
        "--max-records",
        type=int,
        default=None,
        help="client level: records per client bound (also flwr-secaggplus-insecure's public scaling bound) "
        "(default: none)",
    )
    # "flwr-secaggplus" is accepted only so that FlowerConfig can say why it is refused
    choices = ("none", "mask", "ckks", "flwr-secaggplus-insecure", "flwr-secaggplus")
    a(
        "--secure-agg",
        dest="secure",
        choices=choices,
        default="none",
        nargs="?",
        const="mask",
        help="secure aggregation: pairwise masking (secure against a deviating server: signed keys, a "
        "consistency round, one session per aggregation), CKKS (a node holds the keys) or Flower's SecAgg+ "
        "for comparison only (flwr-secaggplus-insecure: a deviating server recovers any node's input; "
        "sum-only methods; needs --clip and --max-records as public scaling bounds); a bare --secure-agg "
        "means mask",
    )
    a("--secure", dest="secure", choices=choices, help=argparse.SUPPRESS)
    a(
        "--threshold",
        type=int,
        default=None,
        help=f"Shamir threshold (default: {THRESHOLD_RULE}; each run prints its threat model, computed)",
    )
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
    a(
        "--rounds",
        type=int,
        default=1,
        help="multi-round FedLog: rounds of local body training and head solving (fedlog only)",
    )
    a(
        "--rounds-params",
        default="{}",
        help="JSON object of privfed.rounds.RoundsConfig settings, e.g. '{\"local_epochs\": 1}'",
    )
    a("--partition", default="dirichlet", help="dirichlet, dirichlet-class, shards or iid")
    a("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    a("--seed", type=int, default=0, help="seed of the partition")
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
        help="seconds to wait for the nodes to connect (default: FlowerConfig's, 120 s)",
    )
    a(
        "--min-clients",
        type=int,
        default=None,
        help="fewest replies a plain run accepts (default: all --clients)",
    )
    a("--num-cpus", type=int, default=1, help="CPUs the simulation may use")
    a(
        "--out",
        dest="output",
        default=None,
        metavar="DIR",
        help="folder for head.npz and report.json (default: none, print only)",
    )
    a("--output", dest="output", help=argparse.SUPPRESS)
    a("--verbose", action="store_true", help="Flower's and Ray's logs")
    return p


_PARSERS = {"tradeoff": tradeoff_parser, "attack": attack_parser, "flower": flower_parser}


def answer_help(command: str, argv: list[str] | None = None) -> None:
    """Print ``command``'s help and exit when ``argv`` asks for it (before any heavy import)."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        _PARSERS[command]().print_help()
        raise SystemExit(0)
