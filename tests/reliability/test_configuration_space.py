"""Property-based checks of the trade-off command over its configuration space (hypothesis).

Random combinations of the options that decide a release (method, budgets, level, count noise, secure
aggregation, trusted aggregator, placement, max-records) are resolved and run on the embedded digits
(10 clients, one seed).  An oracle written here from the options' meaning, not from the library, says
whether a combination contradicts itself; then:

* a contradictory combination is refused before any work with one :class:`ConfigError` of one line
  that names an option it was given (or the method that cannot take it);
* every other combination is fault-free and valid: it must run (any error fails the test), and every
  row of the result states what ran, equal to the guarantee printed for it: its level is the one the
  guarantee sentence names (and the one asked for), its placement the one the report states, its
  protocol a secure one exactly when the placement is a secure sum, and its privacy flag true exactly
  when the guarantee covers the whole release.

Examples are derandomised and few, so the test is deterministic and takes seconds.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from privfed.errors import ConfigError  # noqa: E402

FAST = settings(
    max_examples=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)

OPTIONS = st.fixed_dictionaries(
    {
        "method": st.sampled_from(["fedncm", "fed3r"]),
        "eps": st.sampled_from(["0.5", "0.5,inf"]),
        "level": st.sampled_from([None, "record", "client"]),
        "count_noise": st.sampled_from([None, None, None, "laplace", "gaussian"]),
        "secure_agg": st.sampled_from([None, None, "mask"]),
        "trusted": st.sampled_from([False, False, True]),
        "placement": st.sampled_from([None, None, None, "local", "secure-sum", "trusted"]),
        "max_records": st.sampled_from([None, None, 50]),
    }
)


def _argv(o: dict) -> list[str]:
    argv = ["--method", o["method"], "--eps", o["eps"], "--clients", "10", "--seeds", "1"]
    for flag, key in (
        ("--level", "level"),
        ("--count-noise", "count_noise"),
        ("--secure-agg", "secure_agg"),
        ("--placement", "placement"),
        ("--max-records", "max_records"),
    ):
        if o[key] is not None:
            argv += [flag, str(o[key])]
    return argv + (["--trusted-aggregator"] if o["trusted"] else [])


def contradicts(o: dict) -> bool:
    """Whether the options contradict each other (or cannot describe a release), from their meaning."""
    level = o["level"] or "record"
    secure = o["secure_agg"] not in (None, "none")
    place = o["placement"]
    aggregate = secure or o["trusted"] or place in ("secure-sum", "trusted")
    if o["count_noise"] is not None:  # record-level noise every client adds to its own counts, means in clear
        if level == "client" or secure or o["trusted"] or place not in (None, "local"):
            return True
        if o["method"] == "fed3r":  # its second moment would go in clear beside noised counts
            return True
    if o["trusted"] and secure:  # a trusted aggregator sees the sum secure aggregation hides
        return True
    if place is not None and secure and place != "secure-sum":
        return True
    if place is not None and o["trusted"] and place != "trusted":
        return True
    if o["max_records"] is not None and level != "client":  # a client-level bound at record level
        return True
    if level == "client" and o["count_noise"] is None:
        if o["max_records"] is None or not aggregate or place == "local":
            return True  # a client's whole data needs a bound and noise on the aggregate
    return False


_PLACEMENT_IN_GUARANTEE = {
    "(local)": "local",
    "(central)": "trusted aggregator",
    "(distributed)": "secure sum",
}


@FAST
@given(o=OPTIONS)
def test_every_combination_runs_and_states_what_ran_or_is_refused_in_one_line(o, digits_cache):
    from privfed.commands.tradeoff.config import check_config
    from privfed.tradeoff import build_parser, resolve_config, run_tradeoff

    argv = _argv(o)
    event("refused" if contradicts(o) else "ran")
    if contradicts(o):
        with pytest.raises(ConfigError) as exc:
            cfg = resolve_config(build_parser().parse_args(argv))
            run_tradeoff(cfg, progress=False)
        text = str(exc.value)
        assert "\n" not in text and ("--" in text or repr(o["method"]) in text), text
        return
    cfg = resolve_config(build_parser().parse_args(argv))
    # the same settings built in Python (a copy: not marked as the command's) read as the command read them
    assert check_config(dataclasses.replace(cfg)) == cfg, argv
    rows = run_tradeoff(cfg, progress=False)["records"]
    assert rows, argv
    asked_level = o["level"] or "record"
    for r in rows:
        g = str(r["guarantee"])
        if not math.isfinite(r["epsilon"]):
            assert r["placement"] == "none" and r["private"] is False and r["level"] == "none", (argv, r)
            continue
        assert r["level"] == asked_level and f"at {asked_level} level" in g, (argv, r["level"], g)
        assert r["private"] is ("NO DP GUARANTEE" not in g), (argv, r["private"], g)
        assert r["private"] is (o["count_noise"] is None), (argv, r["private"])
        if o["count_noise"] is not None:
            assert r["placement"] == "local" and r["protocol"] == "none", (argv, r)
        else:
            stated = [w for k, w in _PLACEMENT_IN_GUARANTEE.items() if k in g]
            assert stated == [r["placement"]], (argv, r["placement"], g)
        assert (r["protocol"] != "none") is (r["placement"] == "secure sum"), (argv, r)
        if o["secure_agg"] is not None:
            assert r["protocol"] == o["secure_agg"], (argv, r)
