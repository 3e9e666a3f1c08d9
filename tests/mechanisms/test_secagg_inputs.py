"""What a user can hand the secure sums and the roster tools by mistake: each is refused in one line naming the
input, or summed right; nothing is rounded while the result says exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from mechanisms.secagg import masked_sum
from mechanisms.secagg.ckks import CKKSParams, ckks_sum
from mechanisms.secagg.fixed_point import check_ring_bound
from mechanisms.secagg.identity import ROSTER_VERSION, Roster, main, make_roster
from mechanisms.secagg.protection import CKKSAggregation, PairwiseMasking
from privfed.errors import ConfigError, InputError


# ------------------------------------------------------------------------------------- exact integer sums
def test_an_integer_sum_past_2_53_is_never_called_exact():
    """Each value is whole and below 2^53, but the sum of four passes it, where float64 holds no exact
    integers: the result was one off with exact=True."""
    X = np.array([[2**52 + 1], [2**52 + 1], [2**52 + 1], [2**52]], dtype=np.int64)
    true = int(X.sum())
    assert true > 2**53 and float(true) != true  # the float64 of the true sum is not the sum
    with pytest.raises(InputError, match="can sum past 2\\^53"):
        masked_sum(X, integers=True, key_seed=1)
    with pytest.raises(InputError, match="can sum past 2\\^53"):
        ckks_sum(X, integers=True)
    # "auto" does not call it integer: a fixed-point sum, which the ring bound then refuses at this size
    with pytest.raises(InputError, match="could overflow the 2\\^64 ring"):
        masked_sum(X, key_seed=1)
    below = np.array([[2**50 + 1], [2**50 + 3], [2**50], [7]], dtype=np.int64)  # sum below 2^53: exact
    res = masked_sum(below, key_seed=1)
    assert res.exact and int(res.total[0]) == int(below.sum())
    edge = np.array([[2**52], [2**52]], dtype=np.int64)  # K max|x| = 2^53 exactly: float64 holds it
    assert masked_sum(edge, integers=True, key_seed=1).total[0] == 2.0**53
    # the noise shares count toward the sum's reach (40 standard deviations, as the ring check counts them)
    with pytest.raises(InputError, match="can sum past 2\\^53"):
        masked_sum(np.array([[2.0**51], [2.0**51]]), integers=True, noise_std=2.0**46, key_seed=1)


def test_a_value_over_the_agreed_bound_is_named_before_the_integer_check():
    X = np.array([[3.0], [2.0**60]])
    for fn in (
        lambda: masked_sum(X, integers=True, value_bound=10.0, key_seed=1),
        lambda: ckks_sum(X, integers=True, value_bound=10.0),
    ):
        with pytest.raises(InputError, match="client\\(s\\) \\[1\\] hold values outside the agreed bound"):
            fn()


@pytest.mark.parametrize("flag", [1, 0, "yes", None, 1.0])
def test_integers_takes_a_bool_or_auto_only(flag):
    for fn in (
        lambda: masked_sum(np.ones((3, 2)), integers=flag, key_seed=1),
        lambda: ckks_sum(np.ones((3, 2)), integers=flag),
        lambda: PairwiseMasking(integers=flag),  # refused where it is built, not at the first sum of a fit
        lambda: CKKSAggregation(integers=flag),
    ):
        with pytest.raises(ConfigError, match="integers must be 'auto', True or False"):
            fn()


def test_a_numpy_bool_reads_as_the_bool():
    """np.True_ passed the flag check but failed ``is True``: a fixed-point sum though integers were asked."""
    res = masked_sum(np.ones((3, 2)), integers=np.True_, key_seed=1)
    assert res.exact and res.frac_bits == 0 and res.total.tolist() == [3.0, 3.0]
    assert not masked_sum(np.ones((3, 2)), integers=np.False_, key_seed=1).exact
    for protocol in (PairwiseMasking(integers=np.True_), CKKSAggregation(integers=np.True_)):
        assert protocol.integers is True and json.loads(json.dumps(protocol.parameters()))["integers"] is True


def test_the_fixed_point_bound_counts_the_float64_rounding_of_the_result():
    """At frac_bits = 50 the sum's float64 rounding (2^-53 of it) passes K 2^-(f+1): the bound stated is both."""
    X = np.array([[250.3], [-0.1], [249.7]])
    res = masked_sum(X, frac_bits=50, key_seed=1)
    exact = sum(Fraction(float(v)) for v in X[:, 0])
    err = abs(Fraction(float(res.total[0])) - exact)
    K, f = 3, 50
    assert err > Fraction(K, 2 ** (f + 1))  # the old bound alone does not hold here
    assert err <= Fraction(K, 2 ** (f + 1)) + abs(exact) * Fraction(1, 2**53)  # the stated one does


# ------------------------------------------------------------------------------------- stacks and rng
def test_a_ragged_stack_or_a_masked_array_is_refused_naming_the_statistic():
    for fn in (lambda s: masked_sum(s, key_seed=1), ckks_sum):
        with pytest.raises(InputError, match="not one \\(K, ...\\) array; give every client the same shape"):
            fn([[1.5, 2.0], [3.0]])
        X = np.ma.masked_array(np.arange(6.0).reshape(3, 2), mask=[[0, 1], [0, 0], [1, 0]])
        with pytest.raises(InputError, match="masked array; its mask would be ignored"):
            fn(X)


def test_ckks_checks_its_rng_as_masking_does():
    with pytest.raises(
        ConfigError,
        match=r"rng must be a numpy.random.Generator or None \(np.random.default_rng\(seed\)\), got int",
    ):
        ckks_sum(np.ones((3, 2)), rng=0, noise_std=0.1)


@pytest.mark.parametrize("sizes", [60, "60,40", None, np.array([[60, 40], [40, 60]])])
def test_ckks_modulus_sizes_must_be_a_list(sizes):
    with pytest.raises(ConfigError, match="coeff_mod_bit_sizes must be a list of >= 2 primes"):
        CKKSParams(coeff_mod_bit_sizes=sizes)
    assert CKKSParams(coeff_mod_bit_sizes=np.array([60, 40, 40, 60])) == CKKSParams()  # an array of them is


def test_a_ring_overflow_from_the_noise_names_the_noise_and_a_frac_bits_that_exists():
    with pytest.raises(InputError) as info:  # the noise alone passes the ring: no frac_bits fits
        check_ring_bound(1.0, 3, 32, noise_bound=3 * 40.0 * 1e17 * 2.0**32)
    text = str(info.value)
    assert "even whole numbers (frac_bits=0) do not fit: lower noise_std" in text and "at most" not in text
    # the frac_bits named fit with the noise: 3 (1 + 40 * 1e3) < 2^(62 - 45)
    with pytest.raises(InputError, match="at most 45 fit\\) or lower noise_std"):
        check_ring_bound(1.0, 3, 53, noise_bound=3 * 40.0 * 1e3 * 2.0**53)
    assert check_ring_bound(1.0, 3, 45, noise_bound=3 * 40.0 * 1e3 * 2.0**45) < 2.0**63
    with pytest.raises(InputError, match="clip or rescale the features"):
        check_ring_bound(1e30, 3, 32)


# ------------------------------------------------------------------------------------- rosters
@pytest.mark.parametrize(
    "kw",
    [
        {"num_nodes": 2.7},
        {"num_nodes": None},
        {"num_nodes": "4"},
        {"num_nodes": 4, "colluders": 1.5},
        {"num_nodes": 4, "threshold": "3"},
        {"num_nodes": 4, "threshold": 2.5},
    ],
)
def test_make_roster_takes_whole_numbers_only(kw):
    with pytest.raises(ConfigError, match="whole number"):
        make_roster(**kw, seed=1)


def test_a_roster_of_a_newer_version_is_refused(tmp_path):
    roster, _ = make_roster(4, seed=1)
    raw = json.loads(roster.to_json())
    assert Roster.from_json(json.dumps(raw)) == roster
    raw["version"] = ROSTER_VERSION + 1
    with pytest.raises(ConfigError, match=f"version {ROSTER_VERSION + 1} roster; this privfed reads up to"):
        Roster.from_json(json.dumps(raw))
    del raw["threshold"]  # a newer layout: the version is named, not a missing key
    with pytest.raises(ConfigError, match=f"version {ROSTER_VERSION + 1} roster; this privfed reads up to"):
        Roster.from_json(json.dumps(raw))


def test_the_roster_command_prints_an_input_error_in_one_line(tmp_path, capsys):
    """A roster that is a folder (an InputError, not a ConfigError) was a traceback."""
    (tmp_path / "r").mkdir()
    assert main(["--init-ledger", str(tmp_path / "l.json"), "--roster", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is a directory" in err and "Traceback" not in err
    assert not (tmp_path / "l.json").exists()


def _default_stops() -> None:  # in the child, before exec
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_roster_command_stopped_by_sigterm_leaves_no_files(tmp_path, sig):
    """SIGTERM (kill, timeout, a scheduler) or SIGHUP while the identity files are written: it killed the
    command and left the files written so far (private keys of a roster that does not exist, which the next
    run in that folder then refused); now it is handled as Ctrl-C: every file it wrote is removed."""
    out = tmp_path / "ids"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mechanisms.secagg.identity", str(out), "--nodes", "30000"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_stops,  # a test run under nohup would pass SIGHUP on ignored
    )
    try:
        deadline = time.monotonic() + 120
        while not (out.is_dir() and any(out.iterdir())):  # the first identity files are on disk
            assert proc.poll() is None and time.monotonic() < deadline, (
                "the command ended before it was stopped"
            )
            time.sleep(0.005)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert "interrupted; nothing of this roster was kept" in err.decode() and b"Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == []


@pytest.fixture
def sigterm_raises():
    """SIGTERM handled as the roster command handles it (a KeyboardInterrupt naming it), restored after."""

    def stop(signum, frame):
        raise KeyboardInterrupt(signum)

    old = signal.signal(signal.SIGTERM, stop)
    yield
    signal.signal(signal.SIGTERM, old)


def test_signals_while_the_roster_is_written_are_held_until_its_files_are_removed(
    tmp_path, monkeypatch, sigterm_raises
):
    """A SIGTERM whose handler raised between creating a file (O_EXCL) and recording it for removal left that
    file; a second one during the removal cut it short and left the rest.  Both are held now: the write stops
    after the file it is on, every file it wrote is removed, and the signal is raised once that is done."""
    from mechanisms.secagg import roster_files

    real_fstat, real_unlink, fstats, unlinked = os.fstat, Path.unlink, [], []

    def fstat(fd):  # the third file exists, not yet recorded: the signal lands here
        fstats.append(fd)
        if len(fstats) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_fstat(fd)

    def unlink(self, *a, **k):  # and a second one while the files are removed
        unlinked.append(self.name)
        if len(unlinked) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(roster_files.os, "fstat", fstat)
    monkeypatch.setattr(Path, "unlink", unlink)
    roster, ids = make_roster(5, seed=1)
    with pytest.raises(KeyboardInterrupt) as got:
        roster_files.write_roster_folder(
            tmp_path / "ids", roster.to_json(), [(i.index, i.to_json()) for i in ids]
        )
    assert got.value.args == (signal.SIGTERM,)  # raised again with the process's own handling, once
    assert len(fstats) == 3 and sorted(unlinked) == ["node-0.json", "node-1.json", "node-2.json"]
    assert sorted(p.name for p in (tmp_path / "ids").iterdir()) == []
    assert (
        signal.getsignal(signal.SIGTERM) is not None and signal.getsignal(signal.SIGTERM).__name__ == "stop"
    )


def test_a_signal_after_the_roster_is_written_keeps_it_and_says_so(tmp_path, monkeypatch, capsys):
    """A SIGTERM once every file was written printed "nothing of this roster was kept" over a whole roster,
    which the next run in the folder then refused."""
    from mechanisms.secagg import roster_files

    real = roster_files.write_roster_folder

    def then_sigterm(*a, **k):
        out = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)  # the command's handler raises at the next line
        return out

    monkeypatch.setattr(roster_files, "write_roster_folder", then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    assert main([str(tmp_path / "ids"), "--nodes", "4"]) == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is removed again
    err = capsys.readouterr().err
    assert f"interrupted after the roster was written: {tmp_path / 'ids'} holds it whole" in err
    assert (
        len(list((tmp_path / "ids").glob("node-*.json"))) == 4 and (tmp_path / "ids" / "roster.json").exists()
    )


def test_a_file_another_writer_made_is_not_removed(tmp_path, monkeypatch):
    from mechanisms.secagg import roster_files

    roster, ids = make_roster(5, seed=1)
    # a file another writer created after the folder was checked is not this call's to remove (its own are)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "node-1.json").write_text("theirs")
    listdir = os.listdir
    monkeypatch.setattr(roster_files.os, "listdir", lambda path: [])  # the check saw an empty folder
    with pytest.raises(ConfigError, match="appeared while the roster was written"):
        roster_files.write_roster_folder(
            tmp_path / "other", roster.to_json(), [(i.index, i.to_json()) for i in ids]
        )
    monkeypatch.setattr(roster_files.os, "listdir", listdir)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["node-1.json"]
    assert (tmp_path / "other" / "node-1.json").read_text() == "theirs"


def test_a_second_signal_while_the_command_reports_the_first_is_held(tmp_path, monkeypatch, capsys):
    """A second SIGTERM while the command looked at the folder and said what was kept escaped as a traceback."""
    from mechanisms.secagg import roster_files

    def stopped(*a, **k):  # what the command's SIGTERM handler raised
        from privfed._files import Terminated

        raise Terminated(signal.SIGTERM)

    def looks(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)  # the second one, while the command looks
        return False

    monkeypatch.setattr(roster_files, "write_roster_folder", stopped)
    monkeypatch.setattr(roster_files, "holds_roster", looks)
    before = signal.getsignal(signal.SIGTERM)
    assert main([str(tmp_path / "ids"), "--nodes", "4"]) == 128 + signal.SIGTERM
    assert "interrupted; nothing of this roster was kept" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


# ------------------------------------------------------------------------------------- the stack's range
@pytest.mark.parametrize("shape", [(2, 1), (5, 3), (40, 9_000), (7, 300_000)])
def test_stack_range_is_numpy_min_and_max_and_finds_nan_in_any_block(shape):
    """The range is read a block of rows at a time: it must equal the whole stack's min and max, and a NaN or
    an infinity in any row (first, middle, last block) must reach the refusal."""
    from mechanisms.secagg.masking import RANGE_BLOCK, stack_range

    X = np.random.default_rng(sum(shape)).normal(size=shape)
    assert stack_range(X) == (X.min(), X.max())
    assert shape[0] * shape[1] <= RANGE_BLOCK or max(1, RANGE_BLOCK // shape[1]) < shape[0]
    for row in {0, shape[0] // 2, shape[0] - 1}:
        for bad, want in ((np.nan, "nan"), (np.inf, "hi"), (-np.inf, "lo")):
            Y = X.copy()
            Y[row, shape[1] - 1] = bad
            lo, hi = stack_range(Y)
            if want == "nan":
                assert np.isnan(lo) and np.isnan(hi)
                with pytest.raises(InputError, match="NaN/inf"):
                    masked_sum(Y, key_seed=1)
            else:
                assert (hi if want == "hi" else -lo) == np.inf
    assert stack_range(np.zeros((3, 0))) == (0.0, 0.0)


def test_a_roster_past_the_machine_is_refused_before_any_key(tmp_path, monkeypatch, capsys):
    """About 700 bytes a node: --nodes 100000000 drew keys until it was killed."""
    monkeypatch.setenv("PRIVFED_MEMORY_LIMIT", "1G")
    assert main([str(tmp_path / "r"), "--nodes", "5000000"]) == 2
    err = capsys.readouterr().err
    assert "a roster of 5,000,000 nodes needs about" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match=r"a roster of 2,000,000 nodes needs about .*; pass fewer nodes"):
        make_roster(2_000_000)
    roster, ids = make_roster(4, seed=b"s" * 32)
    assert [i.index for i in ids] == [0, 1, 2, 3] and roster.public_keys[3] == ids[3].public_key
