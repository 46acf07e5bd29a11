"""One process per run folder, outputs checked before slow work, files written whole.

`run_folder(path, keep)` is what a command that writes a folder (`train`, `validate`, `demo`,
`optimize`) holds while it runs:

- the folder is checked first (not a file, writable), before JAX is imported or an agent
  loaded, so a mistyped `--out` costs a second, not a start-up;
- a lock file in it, `run.lock`, names its owner (pid, host, start time, command). A second
  process on the folder is refused at once with a line naming the owner. The lock itself is
  an `flock` on that file: the kernel drops it when its holder dies however it dies, so a lock
  left by a dead process on this host is taken over, and of two processes racing for it only
  one wins (pids are never compared, so a reused pid cannot keep a dead run's lock). A lock
  recorded by another host is not taken over: this host cannot tell whether its owner still
  runs, so the message says which file to remove. The file goes when its lock is released
  (integrity's manifests leave it out: it is the process's, not the run's);
- a start that fails (an error or Ctrl-C before the run has anything to resume, as `keep`
  decides) removes what it created there, and only that: a folder that existed before stays.

`write_atomic` writes a file through a temporary one and a rename, so a full disk or a kill
leaves the old file or the new one, never a part of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from mlirrl_jax.errors import Error

log = logging.getLogger(__name__)

LOCK = "run.lock"
OWNER_WAIT_S = 1.0  # how long a refused process waits for the owner's record to be written


class RunFolderError(Error, ValueError):
    """A run folder that cannot be used: in use, a file, not writable, without a checkpoint."""


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """An OSError of the block that names no file (a failed write: a full disk) names `path`,
    so that the one-line error says what could not be written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` to `path` whole or not at all (temporary file, fsync, rename); an OSError
    (a full disk) names `path` and leaves no temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with naming(path), open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def has_checkpoint(run: str | os.PathLike) -> bool:
    """Whether `run` holds a complete checkpoint: a step folder orbax has renamed into place
    (`checkpoint.latest_step`'s test, here without importing orbax and JAX)."""
    folder = Path(run) / "checkpoints"
    return folder.is_dir() and any(
        entry.name.isdigit() and (entry / "_CHECKPOINT_METADATA").exists()
        for entry in folder.iterdir()
    )


def check_output_folder(folder: str | os.PathLike) -> None:
    """Refuse an output folder that is a file, lies under a file or cannot be written."""
    folder = Path(folder)
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        what = "is a file" if existing == folder else f"lies under {existing}, a file"
        raise RunFolderError(f"output folder {folder} {what}: choose another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunFolderError(
            f"output folder {folder}: cannot write in {existing} (permission denied); "
            "choose another folder"
        )


def check_inputs(
    files: Iterable[str | os.PathLike | None] = (), runs: Iterable[str | os.PathLike | None] = ()
) -> None:
    """Refuse missing input files and agent runs without a checkpoint (None: not given)."""
    for file in filter(None, files):
        if not str(file).startswith("suite://") and not Path(file).is_file():
            raise RunFolderError(f"{file}: no such file")
    for run in filter(None, runs):
        if not Path(run).is_dir():
            raise RunFolderError(f"{run}: no such run folder")
        if not has_checkpoint(run):
            raise RunFolderError(f"{run}: no checkpoint in {Path(run) / 'checkpoints'}")


def command_line(argv: list[str] | None = None) -> str:
    """The command as its user typed it, for the lock's record."""
    return shlex.join(["mlirrl-jax", *(sys.argv[1:] if argv is None else argv)])


def _owner_record(command: str) -> bytes:
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": command,
        }
    ).encode()


def _parse_owner(data: bytes) -> dict | None:
    try:
        owner = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return owner if isinstance(owner, dict) and "pid" in owner else None


def _describe(owner: dict) -> str:
    return (
        f"pid {owner['pid']} on host {owner.get('host', '?')} since {owner.get('since', '?')} "
        f"(`{owner.get('command', '?')}`)"
    )


def _refusal(folder: Path, path: Path) -> RunFolderError:
    """The error for a folder whose lock another process holds, naming it."""
    deadline = time.monotonic() + OWNER_WAIT_S
    while True:  # the owner writes its record just after taking the lock
        try:
            owner = _parse_owner(path.read_bytes())
        except FileNotFoundError:  # released meanwhile: the caller may simply try again
            owner = None
        if owner is not None or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    who = _describe(owner) if owner else f"another process (its record {path} is unreadable)"
    return RunFolderError(
        f"{folder} is in use by {who}: wait for it to end, or choose another folder"
    )


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (a releasing owner unlinks it)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _take(folder: Path, command: str) -> int:
    """Lock `folder` (which exists) for this process; returns the locked file's descriptor."""
    path = folder / LOCK
    while True:  # again only when the owner released (unlinked) the file between open and lock
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _refusal(folder, path) from None
        if _same_file(fd, path):
            break
        os.close(fd)
    try:
        before = _parse_owner(os.pread(fd, 4096, 0))
        if before is not None and before.get("host") != socket.gethostname():
            raise RunFolderError(
                f"{folder} is locked by {_describe(before)}; this host cannot tell whether it "
                f"still runs: if it has ended, remove {path} and run again"
            )
        if before is not None:  # its holder died: the kernel dropped its flock
            log.warning("%s: taking over the lock of %s, which ended", folder, _describe(before))
        with naming(path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, _owner_record(command), 0)
    except BaseException as exc:
        if not isinstance(exc, RunFolderError):  # the file is ours (or a dead owner's)
            path.unlink(missing_ok=True)
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def run_lock(folder: str | os.PathLike, command: str | None = None) -> Iterator[Path]:
    """Hold the lock of `folder` (which exists) for the block; released on exit, error and
    Ctrl-C. RunFolderError at once if another process holds it."""
    folder = Path(folder)
    fd = _take(folder, command or command_line())
    try:
        yield folder
    finally:
        (folder / LOCK).unlink(missing_ok=True)  # while still locked: no one else's file
        os.close(fd)


def _remove_new(folder: Path, before: set[str]) -> None:
    """Remove the entries of `folder` that are not in `before`, nor the lock."""
    for name in set(os.listdir(folder)) - before - {LOCK}:
        entry = folder / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def clear_folder(folder: str | os.PathLike) -> None:
    """Remove everything in `folder` but its lock (a run that replaces the one there)."""
    _remove_new(Path(folder), set())


def _remove_created(folder: Path, created: Path) -> None:
    """Remove `folder` and its parents up to `created` where they are empty."""
    for path in (folder, *folder.parents):
        try:
            path.rmdir()
        except OSError:  # not empty: something else lives there
            return
        if path == created:
            return


@contextlib.contextmanager
def run_folder(
    folder: str | os.PathLike,
    keep: Callable[[Path], bool],
    command: str | None = None,
) -> Iterator[Path]:
    """Hold the run folder `folder` for the block: checked, created if missing, locked. If the
    block fails and `keep(folder)` is false (nothing there to resume from), what the block
    created in it is removed, and the folder too if this call created it."""
    folder = Path(folder)
    check_output_folder(folder)
    created = next((p for p in reversed((folder, *folder.parents)) if not p.exists()), None)
    folder.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(folder))
    try:
        with run_lock(folder, command):
            try:
                yield folder
            except BaseException:
                if not keep(folder):
                    _remove_new(folder, before)
                raise
    except BaseException:
        if created is not None:
            _remove_created(folder, created)
        raise
