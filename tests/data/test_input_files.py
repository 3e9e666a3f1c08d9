"""Inputs that are not plain files: refused at the door, never read and never waited on.

A FIFO given as a feature file used to hang the loader (``open`` blocks until a writer comes).  Every
file the library reads as input (feature files, cache files, a lock's record) is now opened without
blocking and checked on its descriptor: FIFOs, devices, sockets and directories are refused with one
line naming the file and its kind.  An archive holding two members of one name is refused too (numpy
would read one of them without a word).
"""

from __future__ import annotations

import io
import os
import socket
import stat
import tempfile
import threading
import warnings
import zipfile

import numpy as np
import pytest

from privfed._validation import open_regular
from privfed.data import cache as C
from privfed.data import load_dataset
from privfed.data.npzfile import load_feature_file, save_feature_file
from privfed.errors import ConfigError, InputError

posix = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX feature")


def _within(seconds: float, fn, release=None):
    """Run ``fn`` in a thread; a call still blocked after ``seconds`` fails the test (after ``release()``)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        if release is not None:
            release()
        t.join(5)
        pytest.fail(f"the call was still blocked after {seconds} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _unblock(fifo):
    """Open the FIFO's writing end once, so a reader blocked in open() returns."""

    def release():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)

    return release


@posix
def test_a_fifo_given_as_a_feature_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "features.npz"
    os.mkfifo(fifo)
    with pytest.raises(
        InputError, match=r"feature file .*features\.npz' is a FIFO \(named pipe\), not a regular file"
    ):
        _within(10, lambda: load_dataset(f"file:{fifo}"), _unblock(fifo))


@posix
def test_a_symlink_is_followed_to_a_plain_file_and_refused_to_a_fifo(tmp_path):
    good = save_feature_file(tmp_path / "good.npz", np.eye(6, 3), np.arange(6) % 2)
    (tmp_path / "to-good.npz").symlink_to(good)
    assert load_feature_file(tmp_path / "to-good.npz").train_features.shape[1] == 3
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "to-pipe.npz").symlink_to(tmp_path / "pipe")
    with pytest.raises(InputError, match="is a FIFO"):
        _within(10, lambda: load_feature_file(tmp_path / "to-pipe.npz"), _unblock(tmp_path / "pipe"))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_is_refused_not_read_forever():
    with pytest.raises(InputError, match="'/dev/zero' is a character device"):
        _within(10, lambda: load_feature_file("/dev/zero"))


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets")
def test_a_socket_and_a_directory_are_refused_naming_their_kind(tmp_path):
    short = tempfile.mkdtemp(prefix="pf")  # a socket path must stay under 108 bytes
    try:
        path = os.path.join(short, "s.npz")
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)
            assert stat.S_ISSOCK(os.stat(path).st_mode)
            with pytest.raises(InputError, match="is a socket, not a regular file"):
                load_feature_file(path)
    finally:
        for name in os.listdir(short):
            os.unlink(os.path.join(short, name))
        os.rmdir(short)
    with pytest.raises(InputError, match="is a directory, not a regular file"):
        load_feature_file(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        load_feature_file(tmp_path / "missing.npz")


@posix
def test_open_regular_checks_the_descriptor_it_reads(tmp_path):
    plain = tmp_path / "plain"
    plain.write_bytes(b"abc")
    with open_regular(plain, "the input") as fh:
        assert fh.read() == b"abc"
        assert os.get_blocking(fh.fileno())  # the non-blocking flag is cleared: reads block as usual
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match=r"^the input is a FIFO \(named pipe\), not a regular file.*; pass"):
        _within(10, lambda: open_regular(tmp_path / "fifo", "the input"), _unblock(tmp_path / "fifo"))


@posix
def test_a_fifo_in_the_cache_is_a_miss_that_is_rebuilt(tmp_path):
    desc = {"artefact": "t", "v": 1}
    path = C.artefact_path("t", desc, ".npz", cache_dir=tmp_path)[0]
    os.mkfifo(path)
    with pytest.warns(C.CacheIntegrityWarning, match=r"is a FIFO \(named pipe\), not a regular file"):
        arrays, _, hit = _within(
            10,
            lambda: C.cached_arrays("t", desc, lambda: {"x": np.arange(3)}, cache_dir=tmp_path),
            _unblock(path),
        )
    assert not hit and np.array_equal(arrays["x"], np.arange(3))
    assert stat.S_ISREG(os.stat(path).st_mode)  # the FIFO was replaced by the rebuilt artefact
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert C.cached_arrays("t", desc, lambda: {"x": np.zeros(1)}, cache_dir=tmp_path)[2]  # a hit now


@posix
def test_a_fifo_as_the_lock_record_does_not_hang_the_refusal(tmp_path):
    from privfed.results.guard import FolderLock

    out = tmp_path / "run"
    first = FolderLock(out, command="first")
    try:
        record = first.info
        record.unlink()
        os.mkfifo(record)
        with pytest.raises(ConfigError, match="in use by another privfed run .holder unknown"):
            _within(10, lambda: FolderLock(out, command="second"), _unblock(record))
    finally:
        first.release()


def _npy(arr) -> bytes:
    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


@pytest.mark.parametrize("second", ["features.npy", "features"])
def test_an_archive_with_two_members_of_one_name_is_refused(tmp_path, second):
    path = tmp_path / "dup.npz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name it writes
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("features.npy", _npy(np.zeros((10, 3))))
            z.writestr(second, _npy(np.ones((10, 3))))
            z.writestr("labels.npy", _npy(np.arange(10) % 2))
    with pytest.raises(InputError, match=r"holds 2 members named 'features' \(\['features.npy', '" + second):
        load_feature_file(path)


@pytest.mark.parametrize(
    "features, labels, match",
    [
        (
            np.ones((3, 2)),
            ["a", "b", "a"],
            "'labels' must hold integers",
        ),  # was written, then refused on load
        (np.ones((3, 2)), [0.5, 1, 0], "'labels' must hold whole numbers"),
        (np.ones((3, 2)), [0, 1], "'labels' has 2 entries but 'features' has 3 rows"),
        (np.full((3, 2), np.nan), [0, 1, 0], "NaN"),
    ],
)
def test_save_feature_file_refuses_what_the_reader_would(tmp_path, features, labels, match):
    from privfed.data.npzfile import save_feature_file

    with pytest.raises(InputError, match=match):
        save_feature_file(tmp_path / "f.npz", features, labels)
    assert not (tmp_path / "f.npz").exists()


def test_the_automatic_test_split_keeps_every_class_trainable_and_says_what_it_did(tmp_path):
    """A class of one sample could land in the test part (then refused as "appears in the test set but has no
    training sample", with no seed to change from the command line); a 3-sample file said "1 samples (20%)";
    test_fraction=0.999 of 400 samples was "too few samples"; test_fraction='abc' a raw ValueError."""
    from privfed.data import load_dataset
    from privfed.data.npzfile import load_feature_file

    rng = np.random.default_rng(0)
    path = tmp_path / "rare.npz"
    labels = np.r_[np.zeros(50, int), np.ones(49, int), [2]]
    np.savez(path, features=rng.normal(size=(100, 4)), labels=labels)
    for seed in range(10):
        ds = load_dataset(f"file:{path}", seed=seed)
        assert 2 in ds.train_labels and 2 not in ds.test_labels and ds.test_labels.size == 20
        assert np.bincount(ds.test_labels).tolist() == [10, 10]  # the rest stratified
        assert "1 class(es) of one sample kept for training" in ds.meta["test_split"]
    three = tmp_path / "three.npz"
    np.savez(three, features=np.eye(3)[[0, 1, 0]] + 1, labels=np.array([0, 1, 0]))
    assert "1 samples (33%) held out" in load_dataset(f"file:{three}").meta["test_split"]
    with pytest.raises(
        InputError, match=r"test_fraction=0.999 of its 100 samples holds out 100, leaving nothing"
    ):
        load_feature_file(path, test_fraction=0.999)
    for bad in ("abc", True, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="test_fraction must be a number in \\(0, 1\\)"):
            load_feature_file(path, test_fraction=bad)


def test_the_data_digest_follows_the_values_a_run_reads_and_nothing_else(tmp_path):
    """The digest covered every array as stored: a file with a datetime array beside the data no longer
    loaded (numpy has no buffer for it), and an ignored array, big-endian values or int32 labels refused
    the replay of a run on the same data."""
    from privfed.data.npzfile import load_feature_file

    rng = np.random.default_rng(0)
    F, y = rng.normal(size=(40, 3)), np.arange(40) % 2

    def digest(name, **arrays):
        np.savez(tmp_path / name, **arrays)
        return load_feature_file(tmp_path / name).meta["sha256"]

    base = digest("a.npz", features=F, labels=y)
    assert digest("b.npz", features=F, labels=y, when=np.array(["2026-01-01"], dtype="datetime64[D]")) == base
    assert digest("c.npz", features=F.astype(">f8"), labels=y.astype(np.int32), notes=np.zeros(3)) == base
    assert digest("d.npz", features=F, labels=y, clients=np.arange(40) % 4) != base
    G = F.copy()
    G[5, 1] = np.nextafter(G[5, 1], 1.0)
    assert digest("e.npz", features=G, labels=y) != base
    assert digest("f.npz", features=F, labels=1 - y) != base


def test_a_split_that_cannot_leave_a_training_sample_is_one_line(tmp_path):
    """sklearn's ValueError escaped when the classes of two samples or more held exactly the test part."""
    from privfed.data.npzfile import load_feature_file

    labels = np.r_[[0, 0], np.arange(1, 9)]  # one class of two, eight of one: a test part of 2 takes both
    np.savez(tmp_path / "f.npz", features=np.random.default_rng(0).normal(size=(10, 2)), labels=labels)
    with pytest.raises(InputError, match="too few to hold out the 2 of a test part"):
        load_feature_file(tmp_path / "f.npz")


@pytest.mark.parametrize("where", ["header", "data"])
def test_a_damaged_compressed_member_is_one_line(tmp_path, where):
    """A bad deflate block in a savez_compressed member is zlib's error while the header is read, bytes changed
    further in a CRC error of the read: each one line naming the file."""
    import struct
    import zipfile

    from privfed.data import load_dataset

    path = tmp_path / "comp.npz"
    np.savez_compressed(
        path, features=np.random.default_rng(0).normal(size=(500, 8)), labels=np.arange(500) % 3
    )
    raw = bytearray(path.read_bytes())
    info = zipfile.ZipFile(path).getinfo("features.npy")
    n, e = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + n + e
    if where == "header":
        raw[start] = 0x07  # the first deflate block's type: invalid
    else:
        raw[start + info.compress_size // 2 : start + info.compress_size // 2 + 64] = bytes(64)
    path.write_bytes(raw)
    want = {
        # zlib's own error, raised while the header is read before anything is expanded
        "header": r"comp\.npz': member 'features\.npy' is not a readable \.npy array \(Error -3 while decompress",
        "data": r"comp\.npz': 'features' is corrupt \(Bad CRC-32 for file 'features\.npy'\); write the file again",
    }[where]
    with pytest.raises(InputError, match=want):
        load_dataset(f"file:{path}")


def test_feature_file_paths_that_name_no_file_are_one_line(tmp_path):
    """~nouser raised RuntimeError, a NUL ValueError; a save under a file or into /proc a FileExistsError or a
    FileNotFoundError naming a temporary file."""
    from privfed.data import load_dataset
    from privfed.data.npzfile import save_feature_file

    with pytest.raises(InputError, match="names a home folder that does not exist"):
        load_dataset("file:~no-such-user-xyz/x.npz")
    with pytest.raises(InputError, match="holds a NUL character"):
        load_dataset("file:/tmp/a\x00b.npz")
    (tmp_path / "plain").write_text("x")
    F, y = np.arange(40.0).reshape(20, 2), np.arange(20) % 2
    for bad in (tmp_path / "plain" / "x.npz", "/proc/privfed-x.npz"):
        with pytest.raises(InputError, match=r"^save_feature_file cannot write .*; choose another path$"):
            save_feature_file(bad, F, y)
    assert save_feature_file(tmp_path / "ok.npz", F, y).is_file()
