"""Property-based checks of the entries besides ``fit``'s data (tests/reliability/test_properties.py covers that).

Generated inputs at every entry: the public sizes of a private fit (up to
10**12 classes or clients), masked arrays, uploads folded by a server
(:class:`privfed.stats.StatsFold`, NaN/inf anywhere), ``.npz`` files (valid,
truncated, with odd members and headers), the commands' options and the
byte-size environment variables.  Each must give a result or one
:class:`privfed.errors.PrivfedError` naming the input, at once: never another
exception, a hang or a silent NaN.  Examples are derandomised and the
database is off, so the suite is deterministic; each test stays within a few
seconds.
"""

from __future__ import annotations

import io
import time
import warnings
import zipfile

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import privfed  # noqa: E402
from mechanisms import GaussianMechanism  # noqa: E402
from privfed.data.npzfile import load_feature_file  # noqa: E402
from privfed.errors import ConfigError, InputError, PrivfedError  # noqa: E402
from privfed.stats import ClientStats, StatsFold, compute_client_stats  # noqa: E402

FAST = settings(
    max_examples=40,
    deadline=5000,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
rng0 = np.random.default_rng(0)
F0 = rng0.normal(size=(30, 4))
Y0 = np.arange(30) % 3
K0 = np.arange(30) % 5
BLOCKS = {"fedncm": ("sums", "counts"), "fed3r": ("sums", "counts", "second"), "fedcof": ("sums", "counts")}


# ---------------------------------------------------------------- sizes under privacy
@FAST
@given(
    num_classes=st.one_of(
        st.none(),
        st.integers(3, 10**4),
        st.integers(10**8, 10**13),
        st.sampled_from([10**9, 10**12, 3.5, "10"]),
    ),
    num_clients=st.one_of(
        st.none(), st.integers(5, 10**4), st.integers(10**9, 10**13), st.sampled_from([10**9, 10**12, 0, -1])
    ),
    method=st.sampled_from(["fedncm", "fed3r", "fedcof"]),
)
def test_private_fit_sizes_are_refused_at_once_or_fit(num_classes, num_clients, method):
    t0 = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, blocks=BLOCKS[method])
            head = privfed.fit(
                method,
                F0,
                Y0,
                K0,
                num_classes=num_classes,
                num_clients=num_clients,
                privacy=mech,
                random_state=0,
            )
    except PrivfedError as exc:
        msg = str(exc)
        assert "num_classes" in msg or "num_clients" in msg, msg
        assert time.monotonic() - t0 < 2.0  # refused at once, not after a long run or a MemoryError
        if "must be" not in msg:  # a well-formed size too large: the predicted size is named
            assert "GiB" in msg or "noise values" in msg, msg
    else:
        assert np.all(np.isfinite(head.weight)) and head.weight.shape[1] == 4
        assert max(num_classes or 0, num_clients or 0) < 10**8


@FAST
@given(which=st.sampled_from(["features", "labels", "clients"]), mask_any=st.booleans())
def test_masked_arrays_are_refused_naming_the_input(which, mask_any):
    args = {"features": F0, "labels": Y0, "clients": K0}
    a = args[which]
    args[which] = np.ma.masked_array(a, mask=np.zeros(a.shape, bool) | mask_any)
    for privacy in (None, GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)):
        with pytest.raises(InputError, match=f"{which} is a numpy masked array"):
            privfed.fit(
                "fedncm",
                args["features"],
                args["labels"],
                args["clients"],
                privacy=privacy,
                num_classes=3,
                num_clients=5,
                random_state=0,
            )


# ---------------------------------------------------------------- uploads arriving at a server
_values = st.one_of(st.floats(-1e6, 1e6), st.sampled_from([np.nan, np.inf, -np.inf, 1e308, 0.0]))


@FAST
@given(
    data=st.data(), keep=st.sampled_from(["total", "pairs"]), layout=st.sampled_from(["dense", "features"])
)
def test_statsfold_folds_finite_uploads_and_names_a_bad_one(data, keep, layout):
    K, C, d = data.draw(st.integers(1, 4)), 3, 2
    fold = StatsFold(num_classes=C, dim=d, keep=keep)
    expect_counts = np.zeros(C)
    for chunk_no in range(data.draw(st.integers(1, 3))):
        if layout == "dense":
            counts = np.array(data.draw(st.lists(_values, min_size=K * C, max_size=K * C))).reshape(K, C)
            sums = np.array(data.draw(st.lists(_values, min_size=K * C * d, max_size=K * C * d))).reshape(
                K, C, d
            )
            chunk = ClientStats(counts=counts, sums=sums)
        else:
            y = np.array(data.draw(st.lists(st.integers(0, C - 1), min_size=K, max_size=K)))
            F = np.array(data.draw(st.lists(_values, min_size=K * d, max_size=K * d))).reshape(K, d)
            try:
                chunk = compute_client_stats(F, y, np.arange(K), num_classes=C)
            except InputError as exc:
                assert "NaN/inf" in str(exc) and not np.all(np.isfinite(F))
                return
            counts = chunk.counts
        bad = not (np.all(np.isfinite(chunk.counts)) and np.all(np.isfinite(chunk.sums)))
        try:
            fold.add(chunk, source=f"node {chunk_no}")
        except InputError as exc:
            assert bad and f"node {chunk_no}: statistic '" in str(exc) and "client" in str(exc), str(exc)
            return
        assert not bad
        expect_counts += counts.sum(axis=0)
    res = fold.result()
    N, _ = res.class_totals()
    assert np.all(np.isfinite(N)) and np.allclose(N, expect_counts, rtol=1e-12, atol=0)


@FAST
@given(
    num_classes=st.one_of(st.integers(-3, 10**13), st.floats(allow_nan=True), st.text(max_size=3)),
    dim=st.one_of(st.integers(-3, 10**7), st.just(2.5)),
)
def test_statsfold_sizes_are_checked_before_allocation(num_classes, dim):
    try:
        StatsFold(num_classes=num_classes, dim=dim)
    except PrivfedError as exc:
        assert any(w in str(exc) for w in ("num_classes", "dim")), str(exc)


# ---------------------------------------------------------------- feature files
def _npy(arr) -> bytes:
    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


BOMB = _npy(np.zeros((2**17, 8)))  # 8 MiB of zeros: a few KiB compressed, over the 4 MiB limit below


@settings(
    max_examples=40,
    deadline=5000,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    members=st.lists(
        st.tuples(
            st.sampled_from(
                ["features.npy", "features", "labels.npy", "labels", "clients.npy", "x.npy", "readme.txt"]
            ),
            st.sampled_from(["good-f", "good-y", "nan-f", "bytes", "truncated", "huge-header", "bomb"]),
        ),
        min_size=0,
        max_size=4,
    ),
    compress=st.booleans(),
)
def test_npz_loader_gives_a_dataset_or_an_error_naming_the_file(tmp_path, members, compress):
    path = tmp_path / "f.npz"
    payload = {
        "good-f": _npy(F0),
        "good-y": _npy(Y0),
        "nan-f": _npy(np.where(F0 > 1, np.nan, F0)),
        "bytes": b"hello world",
        "truncated": _npy(F0)[:90],
        "huge-header": b"\x93NUMPY\x01\x00"
        + b"v\x00"
        + b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000, 1000000000), }".ljust(116)
        + b"\n",
        "bomb": BOMB,
    }
    with zipfile.ZipFile(
        path, "w", compression=zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    ) as z:
        for name, kind in members:
            if name not in z.namelist():
                z.writestr(name, payload[kind])
    t0 = time.monotonic()
    try:
        ds = load_feature_file(path, max_bytes="4M")
    except PrivfedError as exc:
        assert "feature file" in str(exc), str(exc)
    else:
        assert np.all(np.isfinite(ds.train_features)) and ds.train_features.shape[1] == 4
    assert time.monotonic() - t0 < 4.0


# ---------------------------------------------------------------- options and environment variables
_flag_text = st.one_of(
    st.text(max_size=6),
    st.sampled_from(
        ["nan", "inf", "-inf", "-1", "0", "1e400", "2.5", "1,2", "1,,2", " ", "0x10", "1e-300", "10**9"]
    ),
)


@FAST
@given(
    flag=st.sampled_from(
        [
            "--eps",
            "--seeds",
            "--clients",
            "--delta",
            "--clip",
            "--alpha",
            "--rounds",
            "--max-records",
            "--placement",
            "--secure-agg",
            "--count-noise",
            "--level",
        ]
    ),
    text=_flag_text,
)
def test_tradeoff_options_give_a_config_or_one_error_naming_the_flag(flag, text):
    from privfed.tradeoff import build_parser, resolve_config

    try:
        cfg = resolve_config(build_parser().parse_args([f"{flag}={text}"]))
    except ConfigError as exc:
        assert flag in str(exc) or flag.lstrip("-").replace("-", "_") in str(exc), str(exc)
    else:
        assert all(e > 0 for e in cfg.epsilons) and 0 < cfg.delta < 1 and cfg.clients >= 1


@FAST
@given(
    flag=st.sampled_from(
        [
            "--eps",
            "--delta",
            "--clip",
            "--alpha",
            "--timeout",
            "--num-cpus",
            "--frac-bits",
            "--max-records",
            "--noise-seed",
            "--seed",
        ]
    ),
    text=_flag_text,
)
def test_flower_numbers_are_checked_before_anything_starts(flag, text):
    from privfed.commands.flower import resolve_config
    from privfed.commands.options import flower_parser

    try:
        cfg, _ = resolve_config(flower_parser().parse_args([f"{flag}={text}"]))
    except ConfigError as exc:  # one line naming the flag (or its run-config key)
        key = flag.lstrip("-")
        assert flag in str(exc) or key in str(exc) or key.replace("-", "_") in str(exc), str(exc)
    else:
        assert cfg.epsilon > 0 and 0 < cfg.delta < 1 and cfg.timeout > 0


@FAST
@given(text=_flag_text)
def test_byte_size_variables_parse_or_name_the_variable(text):
    from privfed._validation import parse_byte_size

    try:
        v = parse_byte_size(text, "$PRIVFED_DENSE_VIEW_LIMIT")
    except ConfigError as exc:
        assert "$PRIVFED_DENSE_VIEW_LIMIT" in str(exc)
    else:
        assert isinstance(v, int) and v >= 1
