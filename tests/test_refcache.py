"""The reference outputs kept on disk: sound entries load, damaged or stale ones do not, a
killed writer leaves no entry, and the least recently used entries go beyond the cap."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mlirrl_jax.measure.refcache import (
    CACHE_ENV,
    STALE_TEMPORARY_S,
    ReferenceCache,
    default_folder,
)


def _arrays(seed: int, shape=(32, 48)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random(shape), rng.integers(-8, 8, size=shape[:1]).astype(np.int32)]


@pytest.fixture
def cache(tmp_path) -> ReferenceCache:
    return ReferenceCache(tmp_path / "reference")


def test_an_entry_loads_back_exactly(cache):
    inputs, outputs = _arrays(0), _arrays(1)
    assert cache.load("p1", 0, inputs) is None
    assert cache.store("p1", 0, inputs, outputs)
    loaded = cache.load("p1", 0, inputs)
    assert len(loaded) == 2
    for got, want in zip(loaded, outputs, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert cache.load("p1", 1, inputs) is None  # another seed: another entry
    assert [p.name for p in cache.folder.iterdir()] == [cache.path("p1", 0).name]


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "empty"])
def test_a_damaged_entry_is_deleted_not_trusted(cache, damage):
    inputs, outputs = _arrays(0), _arrays(1, shape=(256, 64))
    cache.store("p1", 0, inputs, outputs)
    entry = cache.path("p1", 0)
    data = bytearray(entry.read_bytes())
    if damage == "truncated":
        data = data[: len(data) * 2 // 3]
    elif damage == "overwritten":  # the zip stays readable: only the digest tells
        middle = len(data) // 2
        data[middle : middle + 16] = b"\x7f" * 16
    else:
        data = bytearray()
    entry.write_bytes(bytes(data))
    assert cache.load("p1", 0, inputs) is None
    assert not entry.exists()


def test_an_entry_of_other_inputs_is_not_used(cache):
    cache.store("p1", 0, _arrays(0), _arrays(1))
    assert cache.load("p1", 0, _arrays(2)) is None
    assert not cache.path("p1", 0).exists()


def test_least_recently_used_entries_go_beyond_the_cap(cache):
    outputs = _arrays(1)
    size = sum(a.nbytes for a in outputs)
    cache.max_bytes = int(size * 3.5)  # three entries fit, with their files' few headers
    for i, name in enumerate(["p1", "p2", "p3"]):
        cache.store(name, 0, _arrays(0), outputs)
        os.utime(cache.path(name, 0), (1000.0 + i, 1000.0 + i))
    assert cache.load("p1", 0, _arrays(0)) is not None  # p1 used last now: p2 is the oldest
    cache.store("p4", 0, _arrays(0), outputs)
    assert sorted(p.name.split("-")[0] for p in cache.folder.iterdir()) == ["p1", "p3", "p4"]
    assert not cache.store("huge", 0, _arrays(0), [np.zeros(cache.max_bytes)])


def test_stale_temporary_files_are_deleted_young_ones_kept(cache):
    cache.folder.mkdir(parents=True)
    stale, young = cache.folder / ".a-1.tmp", cache.folder / ".b-2.tmp"
    stale.write_bytes(b"x")
    young.write_bytes(b"x")
    old = time.time() - STALE_TEMPORARY_S - 60
    os.utime(stale, (old, old))
    cache.store("p1", 0, _arrays(0), _arrays(1))
    assert not stale.exists() and young.exists()  # a young one may be another worker's


def _writing(folder) -> bool:
    """Whether a temporary file in `folder` has bytes in it."""
    for path in folder.glob("*.tmp") if folder.is_dir() else ():
        try:
            if path.stat().st_size:
                return True
        except FileNotFoundError:  # renamed into place meanwhile
            return True
    return False


def test_a_writer_killed_mid_write_leaves_no_entry(tmp_path):
    folder = tmp_path / "reference"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import numpy as np; from mlirrl_jax.measure.refcache import ReferenceCache; "
            "print('writing', flush=True); "
            f"ReferenceCache({str(folder)!r}).store('p1', 0, [], [np.ones(1 << 26)])",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline() == "writing\n"
    deadline = time.monotonic() + 30
    while not _writing(folder) and time.monotonic() < deadline:
        time.sleep(0.0005)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    entries = list(folder.glob("*.npz"))
    cache = ReferenceCache(folder)
    # the kill lands mid-write on any machine where 512 MB take longer than the poll above;
    # should the write have finished first, the entry it left must still be whole
    assert not entries or cache.load("p1", 0, []) is not None


def test_the_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert default_folder() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("MLIRRL_HOME", str(tmp_path / "home-of-mlirrl"))
    assert default_folder() == tmp_path / "home-of-mlirrl" / "cache" / "reference"
    monkeypatch.delenv("MLIRRL_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_folder() == tmp_path / "xdg" / "mlirrl-jax" / "reference"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_folder() == tmp_path / "home" / ".cache" / "mlirrl-jax" / "reference"
