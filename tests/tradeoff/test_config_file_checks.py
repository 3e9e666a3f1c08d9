"""A settings file a user wrote passes the checks its flags pass: the same refusals, none silent.

Each case ran before: a file naming one setting twice (method and methods) ran whichever spelling came
first in the lookup; count_noise with delta, alpha with an iid split and local_epochs with one round were
accepted (the delta recorded though the run used 0, the others dropped); --clients with the file's own
clients (--partition natural) was ignored while --alpha was refused.  A replayed record, which carries
every setting, is not refused for them (tests/tradeoff replay tests).
"""

from __future__ import annotations

import numpy as np
import pytest

from privfed.tradeoff import main


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"config": {"methods": ["fedlog"], "method": "fedcof"}}', "sets method and methods"),
        ('{"config": {"epsilons": [1], "eps": [2]}}', "sets eps and epsilons"),
        ('attacks = ["tracing"]\nattack = ["singleton"]\n', "sets attack and attacks"),
        ('count_noise = "laplace"\ndelta = 0.1\n', "--delta does nothing with --count-noise laplace"),
        ('count_noise = "laplace"\ncalibration = "analytic"\n', "--calibration does nothing"),
        ('clients = 10\npartition = "iid"\nalpha = 0.5\n', "--alpha applies to --partition dirichlet"),
        ("local_epochs = 3\n", "--local-epochs applies to multi-round FedLog only"),
    ],
)
def test_a_settings_file_is_refused_where_its_flags_are(tmp_path, capsys, text, message):
    cfg = tmp_path / ("settings.json" if text.startswith("{") else "settings.toml")
    cfg.write_text(text)
    assert main(["--config", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["flag", "file"])
def test_clients_with_the_files_own_clients_is_refused(tmp_path, capsys, where):
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "f.npz",
        features=rng.normal(size=(120, 4)),
        labels=np.arange(120) % 3,
        clients=np.arange(120) % 6,
    )
    argv = ["--dataset", f"file:{tmp_path / 'f.npz'}", "--partition", "natural", "--clip", "3"]
    if where == "flag":
        argv += ["--clients", "50"]
    else:
        (tmp_path / "s.toml").write_text("clients = 50\n")
        argv += ["--config", str(tmp_path / "s.toml")]
    assert main([*argv, "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 2
    assert "--clients applies to the splits privfed draws" in capsys.readouterr().err
