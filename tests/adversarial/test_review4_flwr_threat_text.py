"""The threat model Flower's SecAgg+ (``--secure-agg flwr-secaggplus-insecure``) prints with a run.

Its text now says that a class one node alone holds is that node's statistic, read exactly without DP,
and names the run config's way out (``--secure-agg mask``).  It is still one fixed string: the threshold
t and the neighbour degree k it speaks of are not the run's, so two runs with t = 2 and t = 3 (or a
complete graph and k = 2) printed the same words; the text now opens with the run's K, graph and t.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.config import INSECURE_FLWR  # noqa: E402
from privfed.flower.server_secure import flwr_threat, run_threat  # noqa: E402


def _printed(**kw) -> str:
    """The text a SecAgg+ run's report carries (server_secure: the computed threat, else flwr_threat)."""
    cfg = FlowerConfig(
        method="fedncm", clients=4, secure=INSECURE_FLWR, num_classes=3, clip=1.0, max_records=50, **kw
    )
    threat = run_threat(cfg, [])
    return flwr_threat(cfg) if threat is None else threat.text()


def test_the_text_names_a_class_one_node_holds_and_the_secure_choice():
    text = _printed(threshold=2)
    assert "a class one node alone holds is that node's statistic, read exactly without DP" in text
    assert "NOT SECURE AGAINST A DEVIATING SERVER" in text
    # the option it names is the one the run config and the CLI take
    FlowerConfig(method="fedncm", clients=4, secure="mask", num_classes=3)
    assert "Use --secure-agg mask." in text


@pytest.mark.parametrize("a, b", [(dict(threshold=2), dict(threshold=3)), (dict(), dict(degree=2))])
def test_the_text_is_computed_from_the_run_configuration(a, b):
    assert _printed(**a) != _printed(**b)
