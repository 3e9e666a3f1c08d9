"""The Flower command's method parameters from a settings file and from flags: each flag overrides its own key,
the documented table works, and a DP setting a run without noise would ignore is refused."""

from __future__ import annotations

import pytest

from privfed.commands.flower import resolve_config
from privfed.commands.options import flower_parser
from privfed.errors import ConfigError
from privfed.flower.config import FlowerConfig


def _params(tmp_path, text: str, *flags: str) -> dict:
    (tmp_path / "run.toml").write_text('method = "fedcof"\nclients = 3\neps = "inf"\n' + text)
    cfg, _ = resolve_config(flower_parser().parse_args(["--config", str(tmp_path / "run.toml"), *flags]))
    return cfg.method_params


def test_a_param_flag_overrides_only_its_own_key_of_the_file(tmp_path):
    """The file's gamma was dropped as soon as any --param flag was given."""
    text = 'param = "{\\"gamma\\": 0.5}"\n'
    assert _params(tmp_path, text) == {"gamma": 0.5}
    assert _params(tmp_path, text, "--param", "fedcof.normalise=false") == {"gamma": 0.5, "normalise": False}
    assert _params(tmp_path, text, "--param", "fedcof.gamma=0.2") == {"gamma": 0.2}


@pytest.mark.parametrize(
    "text",
    [
        "[method_params]\nfedcof = {gamma = 0.5}\n",  # the table --help documents
        "method_params = {gamma = 0.5}\n",  # the older spelling: this method's parameters
        "method_params = '{\"gamma\": 0.5}'\n",  # the same as JSON text
    ],
)
def test_the_method_params_table_and_its_older_spellings_are_read(tmp_path, text):
    """The documented [method_params] table was read twice (as a table, then as the method's own
    parameters: "unknown parameter(s) ['fedcof']"), and the flat form was refused."""
    assert _params(tmp_path, text) == {"gamma": 0.5}
    assert _params(tmp_path, text, "--param", "fedcof.gamma=0.3") == {"gamma": 0.3}


def test_a_delta_without_noise_is_refused(tmp_path):
    """The command recorded a user's --delta as the run's δ though no release used it."""
    with pytest.raises(ConfigError, match="--delta is a setting of the DP release, but no eps is finite"):
        resolve_config(flower_parser().parse_args(["--method", "fedncm", "--eps", "inf", "--delta", "0.5"]))
    (tmp_path / "run.toml").write_text('method = "fedncm"\nclients = 3\neps = "inf"\ndelta = 1e-6\n')
    with pytest.raises(ConfigError, match="delta \\(in the --config file\\) is a setting of the DP release"):
        resolve_config(flower_parser().parse_args(["--config", str(tmp_path / "run.toml")]))
    cfg, _ = resolve_config(
        flower_parser().parse_args(["--method", "fedncm", "--eps", "1", "--delta", "1e-6"])
    )
    assert cfg.delta == 1e-6
    # a node takes any δ of a run without DP (a server may name a fresh aggregation by it; the nodes' ledgers,
    # not this check, stop a second sum)
    assert FlowerConfig(method="fedncm", clients=3, epsilon=float("inf"), delta=1e-7).delta == 1e-7


def test_client_level_without_max_records_names_the_flag():
    """It pointed at GaussianMechanism(..., max_records=500), an argument the command has no flag for."""
    argv = [
        "--method",
        "fedncm",
        "--eps",
        "1",
        "--clip",
        "10",
        "--level",
        "client",
        "--clients",
        "3",
        "--trusted-aggregator",
    ]
    with pytest.raises(ConfigError, match="level client needs max-records N \\(--max-records N"):
        resolve_config(flower_parser().parse_args(argv))
    cfg, _ = resolve_config(flower_parser().parse_args([*argv, "--max-records", "500"]))
    assert cfg.level == "client" and cfg.max_records == 500
