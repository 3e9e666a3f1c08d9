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
def _size_outcome(C, K) -> tuple[str, ...]:
    """``()``: the private fit must give a head; else the words one of which its one-line refusal contains
    (each problem of the sizes; the library may name any of them first)."""
    if C is None or K is None:
        return ("must be given",)
    out = []
    for name, v, low in (("num_classes", C, 3), ("num_clients", K, 5)):  # labels reach 2, client ids 4
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            out.append(name)
        elif v * 5 * 8 > 2**30:  # one client's C (d + 1) statistics, or K of anything, beyond the limits
            out.append(name)
    if not out and (K * C * 8 > 2**30 or K * C * 5 > 2**36):  # the release's fixed limits (d = 4)
        out.append("num_clients")
    return tuple(out)


@FAST
@given(
    num_classes=st.one_of(
        st.none(), st.integers(1, 60), st.integers(10**8, 10**13), st.sampled_from([10**9, 10**12, 3.5, "10"])
    ),
    num_clients=st.one_of(
        st.none(), st.integers(0, 200), st.integers(10**9, 10**13), st.sampled_from([10**9, 10**12, -1, 2.0])
    ),
    method=st.sampled_from(["fedncm", "fed3r", "fedcof"]),
)
def test_private_fit_sizes_are_refused_at_once_or_fit(num_classes, num_clients, method):
    want = _size_outcome(num_classes, num_clients)
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
        assert want, f"valid public sizes C={num_classes}, K={num_clients} were refused: {msg}"
        assert any(w in msg for w in want) and "\n" not in msg, (want, msg)
        assert time.monotonic() - t0 < 2.0  # refused at once, not after a long run or a MemoryError
        if (
            "must be" not in msg and "out of range" not in msg
        ):  # a well-formed size too large: named with its cost
            assert "GiB" in msg or "noise values" in msg, msg
    else:
        assert not want, f"C={num_classes}, K={num_clients} should have been refused ({want})"
        assert np.all(np.isfinite(head.weight)) and head.weight.shape == (num_classes, 4)


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
    from privfed.stats import dense_view_limit

    valid = all(isinstance(v, int) and v >= 1 for v in (num_classes, dim))
    fits = valid and 8 * num_classes * (dim + 1) <= dense_view_limit()
    try:
        fold = StatsFold(num_classes=num_classes, dim=dim)
    except PrivfedError as exc:
        assert not fits, f"StatsFold(num_classes={num_classes}, dim={dim}) fits and was refused: {exc}"
        assert any(w in str(exc) for w in ("num_classes", "dim")), str(exc)
    else:
        assert fits and (fold.num_classes, fold.dim) == (num_classes, dim)


# ---------------------------------------------------------------- feature files
def _npy(arr) -> bytes:
    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


BOMB = _npy(np.zeros((2**17, 8)))  # 8 MiB of zeros: a few KiB compressed, over the 4 MiB limit below


_member = st.tuples(
    st.sampled_from(
        ["features.npy", "features", "labels.npy", "labels", "clients.npy", "x.npy", "readme.txt"]
    ),
    st.sampled_from(["good-f", "good-y", "nan-f", "bytes", "truncated", "huge-header", "bomb"]),
)
#: A valid file's two arrays (under either name numpy reads), then up to two more members of any kind.
_based = st.tuples(
    st.sampled_from(["features.npy", "features"]),
    st.sampled_from(["labels.npy", "labels"]),
    st.lists(_member, max_size=2),
).map(lambda t: [(t[0], "good-f"), (t[1], "good-y"), *t[2]])


@settings(
    max_examples=60,
    deadline=5000,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(members=st.one_of(_based, st.lists(_member, min_size=0, max_size=4)), compress=st.booleans())
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
    written = {}  # what the archive holds: numpy's name of each member -> the kinds stored under it
    for name, kind in members:
        if not any(n == name for n, _ in written.get(name.removesuffix(".npy"), [])):
            written.setdefault(name.removesuffix(".npy"), []).append((name, kind))
    arrays = {k: v[0][1] for k, v in written.items()}
    valid = (
        all(len(v) == 1 for v in written.values())  # no two members of one name
        and set(arrays.values()) <= {"good-f", "good-y", "nan-f"}  # every member a readable array within 4M
        and arrays.get("features") == "good-f"
        and arrays.get("labels") == "good-y"
        and arrays.get("clients", "good-y") == "good-y"
    )
    t0 = time.monotonic()
    try:
        ds = load_feature_file(path, max_bytes="4M")
    except PrivfedError as exc:
        assert "feature file" in str(exc), str(exc)
        assert not valid, f"a valid archive {members} was refused: {exc}"
    else:
        assert valid, f"the archive {members} should have been refused"
        assert np.all(np.isfinite(ds.train_features)) and ds.train_features.shape[1] == 4
        assert ds.num_train + ds.num_test == 30 and (ds.train_clients is not None) == ("clients" in arrays)
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


# ---------------------------------------------------------------- partitions
@settings(
    max_examples=30,
    deadline=5000,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    C=st.integers(1, 5),
    n=st.integers(1, 40),
    K=st.one_of(
        st.integers(1, 8), st.integers(1, 8), st.integers(-1, 45), st.sampled_from([2.5, True, None])
    ),
    alpha=st.sampled_from([0.05, 1.0, 100.0, 0.05, 1.0, 100.0, 0.0, -1.0, float("nan"), float("inf")]),
    min_size=st.sampled_from([0, 1, 2, 5, -1]),
    per_client=st.sampled_from([1, 2, 3, 0, 10]),
    seed=st.integers(0, 2**20),
)
@pytest.mark.parametrize("scheme", ["dirichlet", "dirichlet-class", "shards", "iid", "natural", "bogus"])
def test_partition_splits_valid_input_and_refuses_the_rest(
    C, n, K, scheme, alpha, min_size, per_client, seed
):
    from privfed.federation import partition

    y = np.random.default_rng(seed).permutation(np.arange(n) % C)
    present = np.unique(y).size
    good_K = isinstance(K, int) and not isinstance(K, bool) and 1 <= K <= n
    want = None  # None: a partition; else a word of the one refusal allowed
    may_fail = False
    if scheme == "bogus":
        want = "unknown partition scheme"
    elif scheme == "natural":  # K comes from the ids; another positive num_clients is reported as ignored
        if K is not None and (isinstance(K, bool) or not isinstance(K, int) or K < 1):
            want = "num_clients"
    elif not good_K:
        want = "num_clients"
    elif scheme in ("dirichlet", "dirichlet-class") and not (np.isfinite(alpha) and alpha > 0):
        want = "alpha"
    elif scheme == "dirichlet-class" and min_size < 0:
        want = "min_size"
    elif scheme == "dirichlet-class" and min_size * K > n:
        want = "min_size"
    elif scheme == "dirichlet-class":
        may_fail = True  # max_tries draws may all leave a client below min_size: a documented refusal
    elif scheme == "shards" and not 1 <= per_client <= present:
        want = "classes_per_client"
    natural = np.arange(n) % (K if good_K else 1)
    try:
        part = partition(
            y,
            K,
            scheme,
            alpha=alpha,
            min_size=min_size,
            classes_per_client=per_client,
            natural=natural if scheme == "natural" else None,
            rng=seed,
            max_tries=50,
        )
    except PrivfedError as exc:
        msg = str(exc)
        assert "\n" not in msg
        if may_fail and "could not give every one" in msg:
            return
        assert want is not None, f"valid partition({scheme!r}, K={K}) refused: {msg}"
        assert want in msg, (want, msg)
        return
    assert want is None, f"partition({scheme!r}, K={K}, alpha={alpha}) should have been refused ({want})"
    k, sizes = part.clients, part.sizes()
    assert k.shape == (n,) and k.min() >= -1 and k.max() < part.num_clients
    if scheme == "natural":
        assert np.array_equal(k, natural) and part.num_clients == natural.max() + 1
    elif scheme == "dirichlet":  # FedNCM: exactly floor(N / K) samples per client, the rest dropped
        assert np.all(sizes == n // K) and part.dropped.size == n - K * (n // K)
    elif scheme == "dirichlet-class":
        assert sizes.min() >= min_size and part.dropped.size == 0
    elif scheme == "shards":  # FedLog: at most s distinct classes per client
        assert np.all((part.class_counts(y) > 0).sum(axis=1) <= per_client)
    else:  # iid: near-equal parts, every sample kept
        assert sizes.max() - sizes.min() <= 1 and part.dropped.size == 0


# ---------------------------------------------------------------- client statistics
_DTYPES = [
    "float64",
    "float32",
    "float16",
    "int64",
    "int32",
    "uint8",
    "bool",
    "complex128",
    "object",
    "<U3",
    "m8[s]",
]


@FAST
@given(
    dtype=st.sampled_from(_DTYPES),
    field=st.sampled_from(["counts", "sums", "second"]),
    K=st.integers(1, 4),
    C=st.integers(1, 3),
    d=st.integers(1, 3),
    bad_shape=st.booleans(),
    seed=st.integers(0, 2**20),
)
def test_client_statistics_take_real_arrays_as_given_and_refuse_the_rest(
    dtype, field, K, C, d, bad_shape, seed
):
    shapes = {"counts": (K, C), "sums": (K, C, d), "second": (K, d, d)}
    arrays = {f: np.arange(np.prod(s), dtype=np.float64).reshape(s) for f, s in shapes.items()}
    shape = shapes[field][:-1] + (shapes[field][-1] + 1,) if bad_shape else shapes[field]
    given_ = np.random.default_rng(seed).integers(0, 100, size=shape).astype(dtype)
    arrays[field] = given_
    valid = dtype in _DTYPES[:6] and not bad_shape
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no cast warning on the way in
        try:
            st_ = ClientStats(**arrays)
        except PrivfedError as exc:
            assert not valid, f"{field} of dtype {dtype} refused: {exc}"
            assert field in str(exc) or "ClientStats" in str(exc), str(exc)
            return
    assert valid, f"{field} of dtype {dtype} and shape {shape} should have been refused"
    got = getattr(st_, field)
    assert got.dtype == np.float64 and np.array_equal(got, given_.astype(np.float64))


@FAST
@given(
    n=st.integers(1, 30),
    d=st.integers(1, 4),
    C=st.integers(1, 4),
    K=st.integers(1, 5),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    seed=st.integers(0, 2**20),
)
def test_computed_statistics_equal_the_sums_they_stand_for(n, d, C, K, scale, seed):
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(n, d)) * scale
    y, k = rng.integers(0, C, n), rng.integers(0, K, n)
    st_ = compute_client_stats(F, y, k, num_classes=C, num_clients=K, fields=("counts", "sums", "second"))
    for kk in range(K):
        for c in range(C):
            rows = (k == kk) & (y == c)
            assert st_.counts[kk, c] == rows.sum()
            np.testing.assert_allclose(st_.sums[kk, c], F[rows].sum(axis=0), rtol=1e-12, atol=1e-12 * scale)
        Fk = F[k == kk]
        np.testing.assert_allclose(st_.second[kk], Fk.T @ Fk, rtol=1e-12, atol=1e-12 * scale**2)
    np.testing.assert_allclose(st_.gram(), F.T @ F, rtol=1e-12, atol=1e-12 * scale**2)
