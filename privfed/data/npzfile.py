"""Feature files the user brings: ``.npz`` archives of precomputed features.

Arrays (names are fixed):

``features``       (N, d) real numbers: the training features
``labels``         (N,) integers in 0..C-1
``clients``        (N,) integers >= 0, optional: a natural client split
``test_features``  (N_test, d), optional (with ``test_labels``)
``test_labels``    (N_test,), optional (with ``test_features``)

Files are read with ``allow_pickle=False``: an archive holding Python
objects is refused with a clear error, never unpickled.  Without test arrays
a seeded, stratified 20 % test part is carved out of the training arrays and
``meta["test_split"]`` says so.

Before any array is expanded, the sizes its ``.npy`` header declares are
added up and a file declaring more than ``max_bytes`` (default 1 GiB,
:data:`DEFAULT_MAX_BYTES`, enough for CIFAR-100 through every supported
backbone in float64; ``$PRIVFED_MAX_FILE_BYTES`` or the ``max_bytes``
argument raise it) is refused, so a header declaring shape (10^6, 10^6) or
a small compressed file that inflates to gigabytes never allocates.

Write one with :func:`save_feature_file` (or ``numpy.savez``).
"""

from __future__ import annotations

import difflib
import hashlib
import io
import math
import os
import pathlib
import zipfile
import zlib

import numpy as np

from privfed._files import path_of
from privfed._validation import check_real_dtype, open_regular, parse_byte_size, refuse_masked
from privfed._validation.seeds import check_seed
from privfed.data import FeatureDataset
from privfed.data.cache import atomic_write_bytes
from privfed.data.split import stratified_split
from privfed.errors import ConfigError, InputError

__all__ = ["DEFAULT_MAX_BYTES", "FILE_ARRAYS", "MAX_BYTES_ENV", "load_feature_file", "save_feature_file"]

#: Largest total of array bytes a feature file may declare, unless raised.
DEFAULT_MAX_BYTES = 1 << 30
#: Environment variable that sets that limit (bytes; suffixes K, M, G, T accepted).
MAX_BYTES_ENV = "PRIVFED_MAX_FILE_BYTES"

#: Array names a feature file may hold.
FILE_ARRAYS = ("features", "labels", "clients", "test_features", "test_labels")

#: Fraction of the training arrays held out when a file has no test arrays.
DEFAULT_TEST_FRACTION = 0.2


#: How a caller raises the size limit, as the refusals say it.
_RAISE_WITH = f"load_dataset(..., max_file_bytes=), load_feature_file(..., max_bytes=) or ${MAX_BYTES_ENV}"


def resolve_max_bytes(max_bytes=None, name: str = "max_bytes") -> int:
    """The file-size limit: ``max_bytes``, else ``$PRIVFED_MAX_FILE_BYTES``, else 1 GiB (``name``: the
    argument a refusal names)."""
    if max_bytes is not None:
        if isinstance(max_bytes, str):
            return parse_byte_size(max_bytes, name)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or max_bytes <= 0:
            raise ConfigError(f"{name} must be a positive int, got {max_bytes!r}")
        return int(max_bytes)
    env = os.environ.get(MAX_BYTES_ENV)
    return parse_byte_size(env, f"${MAX_BYTES_ENV}") if env else DEFAULT_MAX_BYTES


def _declared_sizes(fh, where: str, limit: int, file_size: int) -> None:
    """Check every member of the archive before anything is expanded; refuse more than ``limit`` bytes.

    Every member counts, whatever its name (``features`` without the ``.npy``
    suffix is read by numpy all the same): both the uncompressed size the zip
    directory declares (zipfile never expands a member beyond it) and the
    size its ``.npy`` header declares.  A member that is not a ``.npy`` array
    or whose header is malformed is refused here, by name, before any member
    is expanded.
    """
    total, biggest, short = 0, ("", 0, ()), ""
    try:
        zf = zipfile.ZipFile(fh)
    except (*_ZIP_ERRORS, ValueError) as exc:
        raise InputError(
            f"{where} cannot be read as a .npz archive ({exc}); save it with numpy.savez"
        ) from None
    with zf:
        infos = zf.infolist()
        names: dict[str, list[str]] = {}
        for info in infos:  # numpy names a member by its file name less ".npy"
            names.setdefault(info.filename.removesuffix(".npy"), []).append(info.filename)
        twice = {k: v for k, v in names.items() if len(v) > 1}
        if twice:
            name, members = next(iter(twice.items()))
            raise InputError(
                f"{where} holds {len(members)} members named {name!r} ({members}); numpy would read only one "
                "of them without a word, so the file is refused: write it again with one array per name"
            )
        for info in infos:
            name = info.filename.removesuffix(".npy")
            try:
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
                    header = fh.tell()
            except _HEADER_ERRORS as exc:
                raise InputError(
                    f"{where}: member {info.filename!r} is not a readable .npy array ({exc}); the file is damaged "
                    "or was not written by numpy.savez"
                ) from None
            size = int(np.prod([int(s) for s in shape], dtype=object) if shape else 1) * int(dtype.itemsize)
            if size + header > int(info.file_size) and not (short or dtype.hasobject):  # pickles: own size
                short = f"{info.filename!r} declares {size:,} bytes of array but holds {info.file_size - header:,}"
            total += size
            if size > biggest[1]:
                biggest = (name, size, tuple(int(s) for s in shape))
        stored = sum(int(i.file_size) for i in infos)
    if short:  # conclusive, whatever the limit: raising it would only let numpy allocate what is not there
        raise InputError(f"{where}: member {short}; the file is damaged (cut short): write it again")
    if total <= limit < stored:  # the headers understate what the zip directory says the members expand to
        big = max(infos, key=lambda i: i.file_size)
        raise InputError(
            f"{where} declares {stored:,} bytes once expanded ({big.filename!r}: {big.file_size:,}; the file "
            f"itself is {file_size:,} bytes), over the {limit:,}-byte limit, and is refused before it "
            f"is expanded; if the file is genuine, raise the limit with {_RAISE_WITH} "
            f"(e.g. {MAX_BYTES_ENV}={-(-stored // 2**30)}G)"
        )
    if total > limit:
        raise InputError(
            f"{where} declares {total:,} bytes of arrays ({biggest[0]!r} has shape {biggest[2]}; the file "
            f"itself is {file_size:,} bytes), over "
            f"the {limit:,}-byte limit, and is refused before it is expanded; if the file is genuine, raise the "
            f"limit with {_RAISE_WITH} (e.g. {MAX_BYTES_ENV}={-(-total // 2**30)}G)"
        )


#: What reading the .npy header of a damaged or foreign member may raise.
_ZIP_ERRORS = (OSError, EOFError, zipfile.BadZipFile, zlib.error)
_HEADER_ERRORS = (*_ZIP_ERRORS, ValueError, KeyError, SyntaxError, RuntimeError, NotImplementedError)


def read_npz(path: pathlib.Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` file, every check made on one open descriptor of a regular file."""
    where = f"feature file {str(path)!r}"
    with open_regular(path, where, "pass file:PATH with the path of a .npz file") as fh:
        return _read_open_npz(fh, where, max_bytes)


def content_sha256(arrays: dict[str, np.ndarray]) -> str:
    """The hex SHA-256 of the data a feature file gives a run: each of its arrays the loader reads (by name;
    others are ignored), as the values it reads them as (features float64, labels and clients int64, little
    endian, C order) with its shape; the same for any file holding those values (compressed or not, saved
    at any time, in any byte order or width)."""
    h = hashlib.sha256()
    for name in sorted(n for n in set(arrays) & set(FILE_ARRAYS) if arrays[n] is not None):
        a = np.asarray(arrays[name])
        h.update(f"{name}\0{a.shape}\0".encode())
        a = np.atleast_1d(a)
        rows = max(1, (1 << 20) // max(1, a[:1].size))  # 8 MiB of float64 at a time, never the whole copy
        for i in range(0, len(a), rows):
            h.update(
                np.ascontiguousarray(a[i : i + rows], dtype="<f8" if name.endswith("features") else "<i8")
            )
    return h.hexdigest()


def _read_open_npz(fh, where: str, max_bytes: int) -> dict[str, np.ndarray]:
    try:
        magic = fh.read(6)
        size = os.fstat(fh.fileno()).st_size
        fh.seek(0)
    except OSError as exc:
        raise InputError(f"{where} cannot be read ({exc.strerror or exc}); check the file") from None
    if not (magic.startswith(b"PK") or magic == b"\x93NUMPY"):
        raise InputError(
            f"{where} cannot be read as a .npz archive (it is not a zip file); "
            "save it with numpy.savez(path, features=..., labels=...)"
        )
    if magic.startswith(b"PK"):
        _declared_sizes(fh, where, max_bytes, size)
        fh.seek(0)
    elif size > max_bytes:
        raise InputError(f"{where} is over the {max_bytes:,}-byte limit; raise it with {_RAISE_WITH}")
    try:
        archive = np.load(fh, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise InputError(
                f"{where} holds pickled Python objects, which are not loaded for safety; "
                "save plain numeric arrays with numpy.savez"
            ) from None
        raise InputError(
            f"{where} cannot be read as a .npz archive ({exc}); save it with numpy.savez"
        ) from None
    except _ZIP_ERRORS as exc:
        raise InputError(
            f"{where} cannot be read as a .npz archive ({exc}); save it with numpy.savez"
        ) from None
    if isinstance(archive, np.ndarray):
        raise InputError(
            f"{where} holds a single .npy array; save a .npz with named arrays "
            "(numpy.savez(path, features=..., labels=...))"
        )
    out = {}
    with archive as z:
        for name in z.files:
            try:
                out[name] = z[name]
            except ValueError as exc:
                if "pickle" in str(exc).lower():
                    raise InputError(
                        f"{where}: {name!r} holds pickled Python objects (dtype object), which are not "
                        "loaded for safety; store it as a numeric array"
                    ) from None
                raise InputError(f"{where}: {name!r} cannot be read ({exc})") from None
            except _ZIP_ERRORS as exc:
                raise InputError(f"{where}: {name!r} is corrupt ({exc}); write the file again") from None
    return out


def checked_features(arr: np.ndarray, name: str, where: str) -> np.ndarray:
    check_real_dtype(
        arr, f"{where}: {name!r}"
    )  # no complex, boolean or extended-precision array cast silently
    if arr.ndim != 2:
        raise InputError(f"{where}: {name!r} must be a 2-D (N, d) array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"{where}: {name!r} is empty (shape {arr.shape})")
    out = arr.astype(np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise InputError(
            f"{where}: {name!r} has {int(bad.sum())} NaN/inf values (first in row {int(rows[0])}); "
            "remove or impute those samples"
        )
    return out


def checked_ints(arr: np.ndarray, name: str, n: int, rows_of: str, where: str) -> np.ndarray:
    if arr.dtype.kind not in "iuf":
        raise InputError(f"{where}: {name!r} must hold integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise InputError(f"{where}: {name!r} must be a 1-D array, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise InputError(
            f"{where}: {name!r} has {arr.shape[0]} entries but {rows_of!r} has {n} rows; they must match"
        )
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise InputError(
                f"{where}: {name!r} must hold whole numbers; found non-integer or non-finite values"
            )
    from privfed._validation import int64_range

    int64_range(arr, f"{where}: {name!r}")
    out = arr.astype(np.int64)
    if out.size and out.min() < 0:
        raise InputError(f"{where}: {name!r} must be >= 0, found {int(out.min())}")
    return out


def load_feature_file(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    max_bytes: int | str | None = None,
) -> FeatureDataset:
    """Read and validate a ``.npz`` feature file.

    Parameters
    ----------
    path : path
        The ``.npz`` file (see the module docstring for its arrays).
    seed : int
        Seed of the test split carved out when the file has no test arrays.
    test_fraction : float
        Size of that test split, in (0, 1).
    max_bytes : int or str, optional
        Largest total of array bytes the file may declare (``"8G"`` works);
        defaults to ``$PRIVFED_MAX_FILE_BYTES``, else 1 GiB.

    Returns
    -------
    FeatureDataset
        ``name="file:<path>"``; ``train_clients`` from ``clients`` when
        present; ``meta`` records the file, d, the split and ignored arrays.

    Raises
    ------
    InputError
        Missing / unreadable file, pickled arrays, missing ``features`` or
        ``labels``, shapes that disagree, NaN/inf, negative or non-integer
        labels or clients, a class in the test set with no training sample,
        labels or client ids beyond what the file's samples can hold, a file
        declaring more than ``max_bytes``.
    """
    seed = check_seed(seed)
    try:  # a number, never text or a bool read as one
        fraction = math.nan if isinstance(test_fraction, (bool, str, bytes)) else float(test_fraction)
    except (TypeError, ValueError):
        fraction = math.nan
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}")
    path = path_of(path, "the feature file", "pass the path of a .npz feature file")
    where = f"feature file {str(path)!r}"
    arrays = read_npz(path, resolve_max_bytes(max_bytes))
    return _dataset(arrays, path, where, int(seed), fraction)


def _dataset(arrays: dict, path: pathlib.Path, where: str, seed: int, fraction: float) -> FeatureDataset:
    """The data set a feature file's ``arrays`` give, every check the reader makes (the writer makes them too)."""
    for required in ("features", "labels"):
        if required not in arrays:
            raise InputError(
                f"{where} has no {required!r} array (it has {sorted(arrays)}); "
                "save it with numpy.savez(path, features=..., labels=...)"
            )
    F = checked_features(arrays["features"], "features", where)
    y = checked_ints(arrays["labels"], "labels", F.shape[0], "features", where)
    clients = None
    if "clients" in arrays:
        clients = checked_ints(arrays["clients"], "clients", F.shape[0], "features", where)
        if int(clients.max()) >= clients.size:  # on the whole file: whether it loads never hangs on the split
            raise InputError(
                f"{where}: 'clients' goes up to {int(clients.max())} but 'features' has only {clients.size} "
                "rows; renumber clients 0..K-1"
            )
    has_tf, has_tl = "test_features" in arrays, "test_labels" in arrays
    if has_tf != has_tl:
        present, absent = ("test_features", "test_labels") if has_tf else ("test_labels", "test_features")
        raise InputError(f"{where} has {present!r} but no {absent!r}; give both or neither")
    n_all = F.shape[0] + (
        int(np.shape(arrays["test_labels"])[0]) if has_tl and np.ndim(arrays["test_labels"]) else 0
    )
    if int(y.max()) >= n_all:  # classes without any sample: refused before anything is sized by them
        raise InputError(
            f"{where}: labels go up to {int(y.max())} but the file has only {n_all} samples, so most "
            "classes have none; re-encode the labels as 0..C-1"
        )
    meta: dict = {"source": str(path), "d": int(F.shape[1]), "backbone": "unknown (feature file)"}
    ignored = sorted(set(arrays) - set(FILE_ARRAYS))
    absent = [a for a in FILE_ARRAYS[2:] if a not in arrays]  # optional arrays: extra 'features2' is no typo
    near = [(a, m[0]) for a in ignored if (m := difflib.get_close_matches(a.lower(), absent, 1, 0.85))]
    if near:  # a misspelt optional array was ignored: the run tested on a split of its own, silently
        raise InputError(f"{where} holds {near[0][0]!r}, not read: did you mean {near[0][1]!r}? rename it")
    if ignored:
        meta["ignored_arrays"] = ignored
    if has_tf:
        Ft = checked_features(arrays["test_features"], "test_features", where)
        if Ft.shape[1] != F.shape[1]:
            raise InputError(
                f"{where}: 'test_features' has {Ft.shape[1]} columns but 'features' has {F.shape[1]}; "
                "they must match"
            )
        yt = checked_ints(arrays["test_labels"], "test_labels", Ft.shape[0], "test_features", where)
        # the data the run reads, hashed: a replay of a run on this file checks it reads the same (tradeoff)
        meta["sha256"] = content_sha256(
            {"features": F, "labels": y, "clients": clients, "test_features": Ft, "test_labels": yt}
        )
        meta["test_split"] = "from the file"
    else:
        meta["sha256"] = content_sha256({"features": F, "labels": y, "clients": clients})
        singles = int(np.count_nonzero(np.bincount(y) == 1))
        train, test, stratified = stratified_split(y, fraction, int(seed), where)
        F, Ft, yt, y = F[train], F[test], y[test], y[train]
        if clients is not None:
            clients = clients[train]
        meta["test_split"] = (
            f"no test arrays in the file: {test.size} samples ({test.size / (test.size + y.size):.0%}) held out, "
            + ("stratified by class" if stratified else "not stratified (too few samples per class)")
            + (f", {singles} class(es) of one sample kept for training" if singles else "")
            + f", seed {seed}"
        )
        meta["test_indices"] = test.tolist()
    C = int(max(y.max(), yt.max())) + 1
    if C > y.size + yt.size:  # classes without any sample: refused before counting them
        raise InputError(
            f"{where}: labels go up to {C - 1} but the file has only {y.size + yt.size} samples, so most "
            "classes have none; re-encode the labels as 0..C-1"
        )
    train_counts = np.bincount(y, minlength=C)
    all_counts = train_counts + np.bincount(yt, minlength=C)
    gaps = np.flatnonzero(all_counts == 0)
    if gaps.size:
        raise InputError(
            f"{where}: labels skip class(es) {gaps[:10].tolist()} (no sample anywhere); "
            "re-encode the labels as 0..C-1"
        )
    untrained = np.flatnonzero(train_counts == 0)
    if untrained.size:
        raise InputError(
            f"{where}: class(es) {untrained[:10].tolist()} appear in the test set but have no "
            "training sample; a classifier cannot learn them"
        )
    if clients is not None:
        sizes = np.bincount(clients)
        meta["natural_clients"] = int(clients.max()) + 1
        empty = np.flatnonzero(sizes == 0)
        if empty.size:
            meta["empty_natural_clients"] = empty.tolist()
    return FeatureDataset(
        name=f"file:{path}",
        train_features=F,
        train_labels=y,
        test_features=Ft,
        test_labels=yt,
        num_classes=C,
        train_clients=clients,
        meta=meta,
    )


def save_feature_file(
    path: str | os.PathLike,
    features,
    labels,
    *,
    clients=None,
    test_features=None,
    test_labels=None,
) -> pathlib.Path:
    """Write a feature file that :func:`load_feature_file` reads (``.npz``, no pickles).

    Returns
    -------
    pathlib.Path
        The written path (``.npz`` appended by numpy when missing).
    """
    path = path_of(path, "save_feature_file's path", "pass the path to write the .npz to")
    if path.suffix.lower() != ".npz":  # 'x.NPZ' was written as 'x.NPZ.npz'
        path = path.with_name(path.name + ".npz")
    for name, value in (
        ("features", features),
        ("labels", labels),
        ("clients", clients),
        ("test_features", test_features),
        ("test_labels", test_labels),
    ):
        refuse_masked(value, name)
    arrays = {"features": np.asarray(features), "labels": np.asarray(labels)}
    if clients is not None:
        arrays["clients"] = np.asarray(clients)
    if (test_features is None) != (test_labels is None):
        raise InputError("give both test_features and test_labels, or neither")
    if test_features is not None:
        arrays["test_features"] = np.asarray(test_features)
        arrays["test_labels"] = np.asarray(test_labels)
    for name, arr in arrays.items():
        if arr.dtype == object:
            raise InputError(f"{name} has dtype object; pass numeric arrays")
    # every check the reader makes, before anything is written: a file it would refuse (text labels, NaN
    # features, lengths or widths that disagree, skipped classes, a test class never trained) is refused here
    _dataset(arrays, path, f"save_feature_file({str(path)!r})", 0, DEFAULT_TEST_FRACTION)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buf.getvalue())
    except OSError as exc:  # a folder that is a file, /proc, no permission, a full disk
        raise InputError(
            f"save_feature_file cannot write {str(path)!r} ({exc.strerror or exc}); choose another path"
        ) from None
    return path
