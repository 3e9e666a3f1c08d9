"""The parsers and help of every privfed command, importable in a blink.

``--help`` must answer in well under a second, so this module imports
nothing but argparse and :mod:`privfed.commands.flags` (the flags the
commands share, defined once there: one name, one meaning, one default, the
same words in every ``--help``, and the same names as the Flower app's
run-config keys); each command answers ``--help`` through :func:`answer_help`
before importing its machinery.  The method, attack and partition names are
listed in :mod:`~privfed.commands.flags` (a test checks them against the
registries).  Lists are comma-separated where a command sweeps; every default
is shown.  Older spellings (``--secure``, ``--output``, ``--epsilon``,
``--seed``) still work, hidden.
"""

from __future__ import annotations

import argparse
import sys

from privfed.commands.flags import (
    ATTACK_NAMES,
    FEDERATION,
    LEVEL_HELP,
    METHOD_NAMES,
    PAIRED,
    PARTITION_NAMES,
    SECURE_AGG_KINDS,
    SHARED,
    HelpFormatter,
    Parser,
    SharedFlag,
    add_shared,
)
from privfed.commands.names import prog_name

#: mechanisms.secagg.threat.threshold_rule(), written out: --help imports nothing heavy (a test checks the two).
THRESHOLD_RULE = (
    "t = max(2, floor((n + 1)/2) + 1) with n = K (or k + 1 with a SecAgg+ degree k): the smallest "
    "threshold that tolerates 1 colluding node (2 when n is odd; tolerated: 2t - n - 1)"
)

__all__ = [
    "ATTACK_EXAMPLE",
    "ATTACK_NAMES",
    "FEDERATION",
    "HelpFormatter",
    "INVERSION_BACKENDS",
    "INVERSION_SUITE",
    "LEVEL_HELP",
    "METHOD_NAMES",
    "PAIRED",
    "PARTITION_NAMES",
    "Parser",
    "SECURE_AGG_KINDS",
    "SHARED",
    "SharedFlag",
    "THRESHOLD_RULE",
    "add_shared",
    "answer_help",
    "attack_parser",
    "flower_parser",
    "tradeoff_parser",
]

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


#: What the trade-off and attack commands write beside the record (the --out help).
_TABLES_OUT = " results.csv (one row a run) and the figures"


def tradeoff_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=prog_name("tradeoff"),
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
        "(default: all three for a single finite --eps in a one-shot, record-level run without --count-noise, "
        "otherwise local; --secure-agg / --trusted-aggregator "
        "choose one)",
    )
    add_shared(
        p,
        ["--delta", "--level", "--clip"],
        extra={"--clip": "; multi-round FedLog (--rounds > 1): 2 per coordinate by default"},
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
        extra={"--out": _TABLES_OUT},
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
        prog=prog_name("attack"),
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
    # required, but checked with the settings: a --config (a previous attack run's results.json) may name it
    a("--attack", help=f"one of {', '.join(ATTACK_NAMES)} (required, here or in --config)")
    add_shared(
        p,
        ["--config", "--method", "--eps", "--delta", "--level", "--clip"],
        extra={
            "--method": "; a comma list",
            "--eps": "; a comma list",
            "--level": "; the attacks' releases are record level only (the client-level trade-off: "
            "python -m privfed.tradeoff --level client)",
        },
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
    a("--device", default=None, help="torch device for the backbone (cpu or cuda) (default: cpu)")
    a(
        "--strongest",
        action=argparse.BooleanOptionalAction,
        default=None,  # None: the config file's, else on (a default here would beat the file)
        help="tracing / inversion: also run the whole attack suite on the same challenge and report the strongest, "
        "named; the inversion suite needs decoders trained on the public split (trained once and cached) "
        "(default: on)",
    )
    add_shared(
        p,
        ["--secure-agg", "--seeds", "--out", "--overwrite", "--quiet", "--no-plot"],
        extra={"--out": _TABLES_OUT},
    )
    a("--seed", dest="seed_list", help=argparse.SUPPRESS)  # older spelling: a list of seeds ('3' = seed 3)
    return p


# ---------------------------------------------------------------- flower
FLOWER_EPILOG = """\
data: each node holds one of --clients partitions of --dataset, drawn with --seeds (digits: the 899-image
private split; the 359 test images, 20 % of digits, are held out for the printed accuracy).
--eps and --seeds take one value: a Flower run is one release (sweep budgets and seeds with
privfed.tradeoff, a simulation). The run goes through Flower's own entry point (flwr run) on a
SuperLink in simulation mode that this command starts on 127.0.0.1 and stops; SuperLink and
SuperNodes on separate machines: flwr run on privfed/flower/app (see the docs' Flower page).
"""


def flower_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=prog_name("flower"),
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
            "--clients": " (simulated SuperNodes)",
            "--dataset": "; synthetic:D:N (N random D-dim samples a node); file:PATH (a node's own features) in a deployment only (flwr run, node config features=PATH)",
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
        default=None,  # 0 when neither the flag nor a --config file gives one
        help="DP with --secure-agg: nodes that may drop while the others' noise shares carry sigma^2 "
        "(default: 0)",
    )
    a("--frac-bits", type=int, default=None, help="fixed-point fraction bits of masked uploads (default: 32)")
    a(
        "--wire",
        choices=("float64", "compact"),
        default=None,  # float64 when neither the flag nor a --config file gives one
        help="plain uploads: float64 dense (exact) or compact (float32, held classes only without DP) "
        "(default: float64)",
    )
    add_shared(p, ["--rounds"])
    a(
        "--rounds-params",
        default=None,  # {} when neither the flag nor a --config file gives one
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
    add_shared(
        p,
        ["--out", "--overwrite", "--quiet", "--no-plot"],
        extra={
            "--out": " head.npz (the head's weight and bias) and report.json (the Flower run's details)",
            "--no-plot": "; this command draws no figures, so it changes nothing here",
        },
    )
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
