"""Reference outputs kept on disk, keyed by program hash and input seed.

The NumPy reference of a big kernel takes minutes (a batch-256 convolution evaluated in
float64), and a measurement worker that is killed (a timeout, a crash) loses what it held in
memory. A reference computed once is therefore written here, and any worker on the machine
loads it instead of computing it again. The inputs are not stored: regenerating them from the
seed takes about a second for a batch-256 convolution (118 MB), against minutes for its
reference, and a digest of them in the entry checks that they are the ones the reference was
computed from.

An entry is written whole or not at all (a temporary file renamed into place), checked when
read (digests of its inputs and outputs; a damaged or stale entry is deleted and computed
again), and the least recently used entries are deleted beyond a size cap. The folder is
`$MLIRRL_REFERENCE_CACHE`, else `reference` in the user's cache folder
(`mlirrl_jax.shipped.user_cache_dir`: under `$MLIRRL_HOME` when it is set); the cap is
`$MLIRRL_REFERENCE_CACHE_MB` MiB (8192 unless set).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from mlirrl_jax.measure import reference
from mlirrl_jax.shipped import user_cache_dir

CACHE_ENV = "MLIRRL_REFERENCE_CACHE"
CACHE_MB_ENV = "MLIRRL_REFERENCE_CACHE_MB"
DEFAULT_CACHE_MB = 8192
# A reference computed faster than this is not written: loading it would save little, and
# thousands of small entries (one per program a collection run meets) are not worth the files.
MIN_STORED_S = 0.5
# A temporary file older than this belongs to a writer that was killed: eviction deletes it.
STALE_TEMPORARY_S = 3600.0
_SUFFIX = ".npz"
_TEMPORARY_SUFFIX = ".tmp"
_DAMAGE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def default_folder() -> Path:
    """The cache folder: `$MLIRRL_REFERENCE_CACHE`, else under the user's cache folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return user_cache_dir() / "reference"


@functools.cache
def evaluator_version() -> str:
    """A digest of the reference's code (its module and the project's modules it uses) and of
    NumPy's version: an entry made by another evaluator, or from another random-number stream,
    is never found."""
    modules = {inspect.getmodule(value) for value in vars(reference).values()} | {reference}
    files = sorted(
        module.__file__ for module in modules if module and module.__name__.startswith("mlirrl_jax")
    )
    digest = hashlib.sha256(np.__version__.encode())
    for file in files:
        digest.update(Path(file).read_bytes())
    return digest.hexdigest()[:12]


def arrays_digest(arrays: list[np.ndarray]) -> str:
    """A digest of the arrays' types, shapes and contents."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return digest.hexdigest()


def _identity(program_hash: str, seed: int, inputs: list, outputs: list) -> dict:
    """What an entry must match to be read: its program, seed, and the digests of its arrays."""
    return {
        "program_hash": program_hash,
        "seed": seed,
        "inputs_digest": arrays_digest(inputs),
        "outputs_digest": arrays_digest(outputs),
    }


class ReferenceCache:
    """Reference outputs on disk under `folder`, at most `max_bytes` of them in all."""

    def __init__(self, folder: str | os.PathLike | None = None, max_bytes: int | None = None):
        self.folder = Path(folder) if folder is not None else default_folder()
        if max_bytes is None:
            max_bytes = int(os.environ.get(CACHE_MB_ENV) or DEFAULT_CACHE_MB) << 20
        self.max_bytes = max_bytes

    def path(self, program_hash: str, seed: int) -> Path:
        """The entry of a program's reference at `seed`."""
        return self.folder / f"{program_hash}-seed{seed}-{evaluator_version()}{_SUFFIX}"

    def load(
        self, program_hash: str, seed: int, inputs: list[np.ndarray]
    ) -> list[np.ndarray] | None:
        """The stored reference outputs for these inputs, or None if there is no sound entry
        (a damaged one, or one computed from other inputs, is deleted)."""
        path = self.path(program_hash, seed)
        try:
            with np.load(path, allow_pickle=False) as entry:
                meta = json.loads(str(entry["meta"][()]))
                outputs = [entry[f"output{i}"] for i in range(meta["outputs"])]
        except FileNotFoundError:
            return None
        except _DAMAGE:
            path.unlink(missing_ok=True)
            return None
        expected = _identity(program_hash, seed, inputs, outputs)
        if any(meta.get(key) != value for key, value in expected.items()):
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):  # its time of last use, for eviction
            os.utime(path)
        return outputs

    def store(
        self, program_hash: str, seed: int, inputs: list[np.ndarray], outputs: list[np.ndarray]
    ) -> bool:
        """Write the entry whole or not at all; False if it was not written (larger than the
        cap, or the folder is not writable)."""
        size = sum(output.nbytes for output in outputs)
        if size > self.max_bytes:
            return False
        meta = {
            **_identity(program_hash, seed, inputs, outputs),
            "outputs": len(outputs),
        }
        arrays = {f"output{i}": output for i, output in enumerate(outputs)}
        path = self.path(program_hash, seed)
        temporary = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._evict(room_for=size)
            with tempfile.NamedTemporaryFile(
                dir=self.folder, prefix=f".{path.stem}-", suffix=_TEMPORARY_SUFFIX, delete=False
            ) as file:
                temporary = Path(file.name)
                np.savez(file, meta=np.array(json.dumps(meta)), **arrays)
            os.replace(temporary, path)
        except OSError:
            if temporary is not None:
                temporary.unlink(missing_ok=True)
            return False
        return True

    def _evict(self, room_for: int) -> None:
        """Delete the least recently used entries until `room_for` more bytes fit under the cap,
        and the temporary files of writers that were killed."""
        entries = []
        now = time.time()
        for path in self.folder.iterdir():
            try:
                status = path.stat()
            except FileNotFoundError:  # deleted by another worker meanwhile
                continue
            if path.name.endswith(_TEMPORARY_SUFFIX):
                if now - status.st_mtime > STALE_TEMPORARY_S:
                    path.unlink(missing_ok=True)
            elif path.name.endswith(_SUFFIX):
                entries.append((status.st_mtime, status.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total + room_for <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
