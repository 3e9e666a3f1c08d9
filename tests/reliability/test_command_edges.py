"""Edges of the commands a fault battery found: a standard error that refuses writes, a Flower run whose
client-level noise had no aggregate to go on, count-noise notes that called untouched zeros clipped."""

from __future__ import annotations

import errno
import io
import json
import sys

import numpy as np
import pytest

from privfed.errors import ConfigError

SMALL = ["--clients", "10", "--seeds", "1", "--no-plot"]


class _FullDisk(io.TextIOBase):
    """A standard error on a full disk: every write and flush fails."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_standard_error_on_a_full_disk_does_not_stop_the_sweep(digits_cache, tmp_path, monkeypatch):
    """Before: the checkpoint's note that it could not be written (the disk was full) itself failed to print,
    and the OSError ended the sweep after its first run with a traceback (exit 1)."""
    from privfed.commands.common import OutputDir
    from privfed.results.files import ResultsWriteError
    from privfed.tradeoff import main

    real = OutputDir.write_csv

    def write_csv(self, name, *a, **k):
        if "partial" in name:  # the checkpoints fail, the final write does not
            raise ResultsWriteError(f"could not write {name}: No space left on device")
        return real(self, name, *a, **k)

    monkeypatch.setattr(OutputDir, "write_csv", write_csv)
    monkeypatch.setattr(sys, "stderr", _FullDisk())
    out = tmp_path / "o"
    assert main(["--method", "fedncm", "--eps", "1,2", *SMALL, "--out", str(out)]) == 0
    assert isinstance(sys.stderr, _FullDisk)  # the command's guard is gone once it returned
    records = json.loads((out / "results.json").read_text())["records"]
    assert [r["epsilon"] for r in records] == [1.0, 2.0]  # both runs, after the failed checkpoint


def test_flower_refuses_client_level_noise_without_an_aggregate_before_anything_starts():
    """Before: Flower and Ray started, and the ServerApp failed inside the simulation (exit code 700 and
    traceback fragments) with the mechanism's own message."""
    from privfed.commands.flower import resolve_config
    from privfed.commands.options import flower_parser
    from privfed.flower import FlowerConfig

    base = ["--clients", "4", "--eps", "1", "--level", "client", "--max-records", "300"]
    with pytest.raises(ConfigError, match=r"--secure-agg mask\|ckks .* or --trusted-aggregator"):
        resolve_config(flower_parser().parse_args(base))
    with pytest.raises(ConfigError, match="level client adds noise to the aggregate"):
        FlowerConfig(method="fedncm", clients=4, epsilon=1.0, clip=5.0, level="client", max_records=300)
    for fix in (["--trusted-aggregator"], ["--secure-agg", "mask"]):
        cfg, _ = resolve_config(flower_parser().parse_args([*base, *fix]))
        assert cfg.level == "client"


def test_uniform_count_noise_reports_no_clipped_counts():
    """Before: a noisy count of 0 counted as 'clipped to 0', so uniform noise, which keeps a class the client
    lacks at 0 (at eps = 1 it adds no noise at all), reported every absent (client, class) pair as a repair
    ('765 pairs dropped').  It never draws below zero: nothing is clipped."""
    from mechanisms.dp.count_noise import UniformCountNoiseNoDP
    from privfed.stats import ClientStats

    counts = np.array([[4.0, 0.0, 2.0], [0.0, 3.0, 1.0]])
    stats = ClientStats(counts=counts, sums=np.ones((2, 3, 2)) * counts[..., None])
    for eps in (1.0, 0.5):
        noise = UniformCountNoiseNoDP(epsilon=eps)
        out = noise.before_upload(stats, None, np.random.default_rng(0))
        assert noise.dropped == 0 and noise.report().notes[-1].count == 0
        assert np.array_equal(out.counts == 0, counts == 0)  # the absent classes, and only they, not sent


@pytest.mark.parametrize("kind", ["LaplaceCountNoise", "GeometricCountNoise"])
def test_a_release_counts_the_draws_it_clipped(kind):
    """The counts not sent are the draws at or below zero (n + noise <= 0), counted on the draws: a first version
    of the rule above counted values below zero in the released max(., 0) and said 0 for every release."""
    import mechanisms.dp.count_noise as cn
    from privfed.stats import ClientStats

    rng = np.random.default_rng(11)
    counts = rng.integers(0, 3, size=(100, 10)).astype(float)
    stats = ClientStats(counts=counts, sums=rng.normal(size=(100, 10, 3)) * counts[..., None])
    mech = getattr(cn, kind)(epsilon=0.5)
    out = mech.before_upload(stats, None, np.random.default_rng(5))
    draws = getattr(cn, kind)(epsilon=0.5).perturb(counts, np.random.default_rng(5))  # the same draws
    assert mech.dropped == np.count_nonzero(draws <= 0) > 50  # about a third of 1,000 cells at this scale
    np.testing.assert_array_equal(out.counts, np.maximum(draws, 0.0))
    assert mech.report().notes[-1].count == mech.dropped


def test_overwrite_replaces_only_what_the_previous_run_wrote(digits_cache, tmp_path):
    """Before: a user's file that a (damaged or edited) manifest listed was taken for the run's own and
    deleted by --overwrite, whatever its content."""
    from privfed.tradeoff import main

    out = tmp_path / "o"
    args = ["--method", "fedncm", "--eps", "1", "--placement", "local", *SMALL, "--quiet", "--out", str(out)]
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "notes.txt").write_text("my notes")
    manifest["files"].append({"name": "notes.txt", "bytes": 3, "sha256": "0" * 64})
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main([*args, "--overwrite"]) == 2 and (out / "notes.txt").read_text() == "my notes"
    (out / "notes.txt").unlink()
    assert main([*args, "--overwrite"]) == 0  # the run's own files, a results file edited or not


def test_a_clip_norm_asked_for_under_rounds_is_never_replaced_in_silence():
    """Before: --clip-norm l2 without --clip ran multi-round FedLog per coordinate (its default bound) and
    recorded clip_norm 'coordinate', as if the flag had not been given."""
    from privfed.tradeoff import build_parser, resolve_config

    base = ["--rounds", "2", "--clients", "4", "--eps", "1"]
    with pytest.raises(ConfigError, match="--clip-norm l2 under 2 rounds needs --clip B"):
        resolve_config(build_parser().parse_args([*base, "--clip-norm", "l2"]))
    assert resolve_config(build_parser().parse_args([*base, "--clip-norm", "l2", "--clip", "5"])).clip == 5.0
    resolve_config(build_parser().parse_args(base))  # the default bound, when nothing else is asked


@pytest.mark.parametrize("command", ["tradeoff", "attack", "flower"])
def test_a_switch_given_twice_is_refused_as_every_flag_is(command):
    """Before: --no-plot --no-plot (and --quiet, --trusted-aggregator twice) passed, while the docs say a flag
    given twice is refused."""
    from privfed.commands import options

    parser = getattr(options, f"{command}_parser")()
    with pytest.raises(ConfigError, match="--no-plot: given twice"):
        parser.parse_args(["--no-plot", "--no-plot"])
    assert parser.parse_args(["--no-plot"]).no_plot is True


def test_flower_refuses_verbose_with_quiet():
    from privfed.commands.flower import _body

    with pytest.raises(ConfigError, match="--verbose contradicts --quiet"):
        _body(["--verbose", "--quiet"])


def test_the_sweep_estimate_counts_the_secure_sums():
    """Before: the default sweep of 2,000 seeds (6,000 runs, 2,000 of them masked sums of 100 clients on the
    complete graph, about 1.5 h) printed no estimate, and 100,000 seeds 'roughly 51 minutes' (about 60 h): the
    masking was not counted.  Its key agreements alone (2 K (K - 1), at 20 µs each at the fastest) bound it
    from below."""
    import re

    from privfed.commands.tradeoff.plan import sweep_cost_note

    shape = {"n": 899, "d": 64, "k": 100, "c": 10, "passes": 6000}
    assert sweep_cost_note(6000, **shape) is None  # the plain runs alone are quick
    note = sweep_cost_note(6000, **shape, secure_runs=2000)
    floor_minutes = 2000 * 2 * 100 * 99 * 20e-6 / 60
    assert note is not None and int(re.search(r"roughly (\d+) minute", note)[1]) >= floor_minutes
    ckks = sweep_cost_note(6000, **shape, secure_runs=2000, secure_kind="ckks")
    assert ckks is not None and ckks != note


def test_a_replayed_partial_rounds_record_keeps_its_default_norm(tmp_path):
    """A checkpoint (results.partial.json) of a multi-round sweep run with the default bound records the
    config's default clip_norm 'l2' with no clip: replaying it is no request for l2 (the first version of the
    check above refused it, naming a flag the user never gave)."""
    from dataclasses import asdict

    from privfed.results.record import make_record
    from privfed.tradeoff import build_parser, resolve_config

    base = ["--rounds", "2", "--clients", "4", "--eps", "1"]
    cfg = resolve_config(build_parser().parse_args(base))
    assert cfg.clip is None and cfg.clip_norm == "l2"
    record = make_record(
        command="tradeoff",
        command_line="python -m privfed.tradeoff " + " ".join(base),
        config=asdict(cfg),
        data={},
        records=[],
        timing={},
        complete=False,
    )
    path = tmp_path / "results.partial.json"
    path.write_text(json.dumps(record, default=str))
    again = resolve_config(build_parser().parse_args(["--config", str(path)]))
    assert again.rounds == 2 and again.clip is None


def test_quiet_stderr_drops_a_full_disk_but_not_a_closed_pipe():
    """``2>&1 | head`` closes the pipe: the command must stop there, as on standard output, not run on for
    hours with nobody reading (a first version dropped the broken pipe with every other write error)."""
    from privfed.commands.streams import QuietStderr

    class Gone(_FullDisk):
        def write(self, text):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    full = QuietStderr(_FullDisk())
    assert full.write("note\n") == 5
    full.flush()
    for call in (lambda s: s.write("note\n"), lambda s: s.flush()):
        with pytest.raises(BrokenPipeError):
            call(QuietStderr(Gone()))


def test_overwrite_replaces_an_edited_figure_and_survives_a_damaged_manifest(digits_cache, tmp_path):
    """The figures (tradeoff.png, .pdf, .svg) are names the commands write, edited or not; a manifest entry
    too long for the file system is no file of the run (it made --overwrite fail with 'File name too long')."""
    from privfed.results.writer import check_out_path
    from privfed.tradeoff import main

    out = tmp_path / "o"
    args = ["--method", "fedncm", "--eps", "1", "--placement", "local", "--clients", "10", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0
    assert (out / "tradeoff.svg").is_file()
    (out / "tradeoff.svg").write_text("<svg>edited</svg>")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"].append({"name": "x" * 300, "bytes": 1, "sha256": "0" * 64})
    (out / "manifest.json").write_text(json.dumps(manifest))
    _, ours = check_out_path(out, overwrite=True)
    assert {"tradeoff.svg", "tradeoff.png", "results.json", "manifest.json"} <= ours
    assert main([*args, "--out", str(out), "--overwrite"]) == 0


@pytest.mark.parametrize("name", ["tradeoff.pdf", "grid_notes.svg", "grid_.pdf"])
def test_overwrite_keeps_a_users_file_named_like_a_figure(digits_cache, tmp_path, name):
    """A run folder has a manifest: only the files it lists are the run's.  A first version took every
    figure-like name (``tradeoff.*``, ``grid_*.*``) in a folder with a privfed results.json for the run's, as
    if the folder predated manifests, and --overwrite deleted a user's file of that name."""
    from privfed.tradeoff import main

    out = tmp_path / "o"
    args = ["--method", "fedncm", "--eps", "1", "--placement", "local", "--clients", "10", "--quiet"]
    assert main([*args, "--no-plot", "--out", str(out)]) == 0
    (out / name).write_text("mine")
    assert main([*args, "--no-plot", "--out", str(out), "--overwrite"]) == 2
    assert (out / name).read_text() == "mine"


def test_flower_refuses_a_per_client_method_at_client_level_before_anything_starts():
    """Before: fedcof at client level with a trusted aggregator started Flower and Ray and failed inside the
    simulation (exit code 700): the mechanism's check of the method ran only once the nodes had answered."""
    from privfed.flower import FlowerConfig

    base = dict(method="fedcof", clients=4, epsilon=1.0, clip=5.0, level="client", max_records=100)
    for extra in ({"trusted_aggregator": True}, {}):
        with pytest.raises(ConfigError, match="method 'fedcof' needs every client's individual statistics"):
            FlowerConfig(**base, **extra)
    assert FlowerConfig(**{**base, "method": "fedncm"}, trusted_aggregator=True).private


class _Counted(Exception):
    """Stops a sweep once its estimate's inputs are known."""


@pytest.mark.parametrize(
    ("flags", "per_seed"),
    [
        # secure-sum placement only: the eps = 1 run and the eps = inf row (under that placement) are masked
        (["--secure-agg", "mask", "--eps", "inf,1"], 2),
        # three placements at eps = 1 (one masked); the eps = inf row runs under the first: local, then masked
        (["--placement", "local,secure-sum,trusted", "--eps", "inf,1"], 1),
        (["--placement", "secure-sum,local", "--eps", "inf,1"], 2),
        (["--placement", "local", "--eps", "inf,1"], 0),
    ],
)
def test_the_sweep_counts_its_secure_sums_for_the_estimate(digits_cache, monkeypatch, flags, per_seed):
    """What the sweep passes to its estimate, end to end: every budget of a secure placement, and the
    eps = inf row where the method's first placement is secure."""
    import privfed.commands.tradeoff.sweep as sweep
    from privfed.tradeoff import build_parser, resolve_config, run_tradeoff

    seen = {}

    def note(runs, **kw):
        seen.update(kw, runs=runs)
        raise _Counted

    monkeypatch.setattr(sweep, "sweep_cost_note", note)
    cfg = resolve_config(build_parser().parse_args(["--method", "fedncm", "--seeds", "3", *flags]))
    with pytest.raises(_Counted):
        run_tradeoff(cfg, progress=False)
    assert seen["secure_runs"] == 3 * per_seed and seen["secure_kind"] == "mask"


@pytest.mark.parametrize(
    "extra", [["--method", "fedncm", "--level", "client"], ["--method", "fedlog,fedncm", "--clip-norm", "l2"]]
)
def test_rounds_with_another_method_is_told_so_first(extra):
    """Before: '--rounds 3 --method fedncm --level client' was first told to add an aggregate placement, and
    only then that fedlog alone runs several rounds."""
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError, match="--rounds 3: only fedlog runs several rounds"):
        resolve_config(build_parser().parse_args(["--rounds", "3", *extra]))


def test_rounds_with_another_method_names_the_fields_to_an_api_caller():
    from privfed.commands.tradeoff.config import TradeoffConfig, check_config

    with pytest.raises(ConfigError, match=r"pass methods \(in the TradeoffConfig\) fedlog alone") as exc:
        check_config(TradeoffConfig(methods=("fedncm",), rounds=3))
    assert "--" not in str(exc.value)
