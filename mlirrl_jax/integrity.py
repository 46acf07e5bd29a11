"""Checksums of saved artifacts, checked before they load.

A folder (a surrogate, a checkpoint step, a finished training run, the shipped data) carries
a manifest, `checksums.json`: the sha256 of every file under it, and the sha256 of those
entries themselves, so that damage to the manifest is named as such rather than blamed on the
files it lists. A single file (a Parquet export) carries a sidecar, `FILE.sha256`, in the
format of `sha256sum`, so `sha256sum -c FILE.sha256` checks it too.

Loading verifies first, before any slow work; a damaged, missing or unreadable file is one
`IntegrityError` (a ValueError: the CLI prints it as one line) naming the file and saying what
to do. Artifacts saved before manifests existed carry none and load as before, unverified; the
shipped ones (`data/agent`, `data/cost_model_multi`, `data/cost_model`, the Parquet files of
`data/seed`) must carry theirs.

After changing the shipped data on purpose (a retrained agent copied into `data/agent`, a
refitted surrogate into `data/cost_model_multi`, a new seed export), seal it again::

    python -m mlirrl_jax.integrity seal --force data/agent data/cost_model_multi data/seed

(a folder gets a manifest; the Parquet files of `data/seed` get sidecars, as `store export`
writes them). Without `--force`, `seal` refuses a path whose files differ from the checksums
it carries, naming them, so that damage is not sealed by mistake; with it, it names what it
seals anew. `verify` in place of `seal` checks the same paths and prints the time it took.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from mlirrl_jax.errors import Error
from mlirrl_jax.runfolder import LOCK, write_atomic
from mlirrl_jax.shipped import (
    DATA,
    SHIPPED_AGENT,
    SHIPPED_SEEDS,
    SHIPPED_SURROGATE,
    SINGLE_MACHINE_SURROGATE,
)

MANIFEST = "checksums.json"
SIDECAR = ".sha256"  # suffix of a single file's checksum
FORMAT = "mlirrl-jax checksums 1"
# folders that must carry a manifest (the seeds' folder: a sidecar per Parquet file)
SHIPPED_FOLDERS = (
    SHIPPED_AGENT,
    SHIPPED_SURROGATE,
    SINGLE_MACHINE_SURROGATE,
    SHIPPED_SEEDS,
)
_HEX = re.compile(r"[0-9a-f]{64}")


class IntegrityError(Error, ValueError):
    """A file of a saved artifact that is damaged, missing or unreadable."""


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _entries_sha256(files: dict[str, str]) -> str:
    text = json.dumps(files, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it, else absolute."""
    relative = os.path.relpath(Path(path).absolute())
    return relative if not relative.startswith("..") else str(Path(path).absolute())


def _shipped_folder(path: Path) -> Path | None:
    """The shipped folder `path` lies in (or is), if any."""
    resolved = Path(path).resolve()
    for folder in SHIPPED_FOLDERS:
        if resolved == folder or folder in resolved.parents:
            return folder
    return None


def must_be_sealed(folder: str | os.PathLike) -> bool:
    """Whether `folder` is a shipped folder, which must carry a manifest."""
    return Path(folder).resolve() in SHIPPED_FOLDERS


def _remedy(path: Path, redo: str) -> str:
    """What to do about a damaged file at `path`: restore the shipped folder from git, or
    restore from a copy; or `redo` (make the artifact again)."""
    shipped = _shipped_folder(path)
    if shipped is not None and DATA.parent in shipped.parents:
        return f"restore it with `git checkout -- {shipped.relative_to(DATA.parent)}`, or {redo}"
    return f"restore it from a copy, or {redo}"


def damaged(path: Path, why: str, redo: str) -> IntegrityError:
    """The one-line error for a file of an artifact that cannot be used."""
    return IntegrityError(f"{_shown(path)}: {why}; {_remedy(path, redo)}")


def _sealable(folder: Path, only: Callable[[str], bool] | None = None) -> dict[str, str]:
    """The sha256 of every file a manifest of `folder` lists (or of those whose path relative
    to it `only` accepts), by relative path."""
    # the run's lock is the running process's, not the artifact's (released: removed); a
    # temporary file of `write_atomic` is a write that a kill cut off
    skip = {folder / MANIFEST, folder / LOCK}
    return {
        path.relative_to(folder).as_posix(): sha256_of(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and path not in skip
        and not (path.name.startswith(".") and path.name.endswith(".tmp"))
        and (only is None or only(path.relative_to(folder).as_posix()))
    }


def seal(folder: str | os.PathLike, only: Callable[[str], bool] | None = None) -> Path:
    """Write `folder`'s manifest: the sha256 of every file under it (or of those whose path
    relative to it `only` accepts); returns its path."""
    folder = Path(folder)
    files = _sealable(folder, only)
    record = {"format": FORMAT, "files": files, "sha256": _entries_sha256(files)}
    write_atomic(folder / MANIFEST, json.dumps(record, indent=1) + "\n")
    return folder / MANIFEST


def listed(folder: str | os.PathLike, redo: str = "make it again") -> dict[str, str]:
    """The files (relative path -> sha256) of `folder`'s manifest, the manifest checked
    against its own sha256."""
    manifest = Path(folder) / MANIFEST
    record = read_json(manifest, redo)
    files = record.get("files") if isinstance(record, dict) else None
    if (
        not isinstance(files, dict)
        or not all(isinstance(v, str) and _HEX.fullmatch(v) for v in files.values())
        or record.get("sha256") != _entries_sha256(files)
    ):
        raise damaged(manifest, "damaged (its entries do not match its own sha256)", redo)
    return files


def verify(folder: str | os.PathLike, redo: str) -> bool:
    """Check every file `folder`'s manifest lists; False if it has none (saved before
    manifests: allowed, but for the shipped folders). `redo` says how to make it again."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        if must_be_sealed(folder):
            raise damaged(manifest, "missing", redo)
        return False
    for name, expected in listed(folder, redo).items():
        path = folder / name
        if not path.is_file():
            raise damaged(path, f"missing (listed in {MANIFEST})", redo)
        if sha256_of(path) != expected:
            raise damaged(path, f"damaged (its sha256 does not match {MANIFEST})", redo)
    return True


def sidecar_of(path: str | os.PathLike) -> Path:
    """Where a single file's checksum lies: beside it, `.sha256` appended."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR)


def seal_file(path: str | os.PathLike) -> Path:
    """Write `path`'s sidecar checksum; returns its path."""
    path = Path(path)
    sidecar = sidecar_of(path)
    write_atomic(sidecar, f"{sha256_of(path)}  {path.name}\n")
    return sidecar


def _recorded_sha256(sidecar: Path) -> str | None:
    """The sha256 a sidecar records; None if it is not a `sha256sum` line."""
    fields = sidecar.read_bytes().split()
    if len(fields) != 2 or not _HEX.fullmatch(fields[0].decode("latin-1")):
        return None
    return fields[0].decode()


def verify_file(path: str | os.PathLike, redo: str) -> bool:
    """Check a file against its sidecar; False if it has none (allowed but for the shipped
    seeds). `redo` says how to make it again."""
    path = Path(path)
    sidecar = sidecar_of(path)
    if not sidecar.is_file():
        if _shipped_folder(path) is not None:
            raise damaged(sidecar, "missing", redo)
        return False
    recorded = _recorded_sha256(sidecar)
    if recorded is None:
        raise damaged(sidecar, "damaged (not a sha256 line)", redo)
    if not path.is_file():
        raise damaged(path, f"missing (its checksum is {sidecar.name})", redo)
    if sha256_of(path) != recorded:
        raise damaged(path, f"damaged (its sha256 does not match {sidecar.name})", redo)
    return True


def changed_since_sealed(path: str | os.PathLike, single: bool) -> list[str]:
    """What of a folder (or a `single` file) differs from the checksums it carries: files
    changed, missing or new (so marked), or the manifest (sidecar) itself when damaged; []
    when it carries none."""
    path = Path(path)
    if single:
        sidecar = sidecar_of(path)
        if not sidecar.is_file():
            return []
        recorded = _recorded_sha256(sidecar)
        if recorded is None:
            return [sidecar.name]
        return [] if sha256_of(path) == recorded else [path.name]
    if not (path / MANIFEST).is_file():
        return []
    try:
        before = listed(path)
    except IntegrityError:
        return [MANIFEST]
    now = _sealable(path)
    marks = {name: " (missing)" for name in before.keys() - now.keys()}
    marks |= {name: " (new)" for name in now.keys() - before.keys()}
    differ = sorted(
        name for name in before.keys() | now.keys() if before.get(name) != now.get(name)
    )
    return [name + marks.get(name, "") for name in differ]


def read_json(path: str | os.PathLike, redo: str):
    """A JSON file's content; one line naming the file if it is cut short or garbled."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(path, f"damaged (not valid JSON: {exc})", redo) from None


@contextlib.contextmanager
def reading(path: str | os.PathLike, redo: str) -> Iterator[None]:
    """Errors of a reader (orbax) on a damaged checkpoint that has no manifest (saved before
    manifests) as one line naming `path`."""
    try:
        yield
    except (KeyError, ValueError, OSError) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise damaged(Path(path), f"unreadable checkpoint ({reason})", redo) from exc


def _targets(path: Path) -> list[tuple[Path, bool]]:
    """(path, is a single file) to seal or verify for a command-line path: a folder, a file,
    or the seeds' folder (each Parquet file in it)."""
    if path.is_dir() and path.resolve() == SHIPPED_SEEDS:
        return [(p, True) for p in sorted(path.glob("*.parquet"))]
    return [(path, path.is_file())]


def listing(names: list[str], shown: int = 6) -> str:
    """The first `shown` names, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mlirrl_jax.integrity", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=["seal", "verify"])
    parser.add_argument("paths", nargs="+", type=Path, help="folders, or single files")
    parser.add_argument(
        "--force",
        action="store_true",
        help="seal files that changed since they were last sealed (named); without it, seal "
        "refuses them",
    )
    args = parser.parse_args(argv)
    try:
        for given in args.paths:
            if not given.exists():
                raise FileNotFoundError(f"{given}: no such file or folder")
            for path, single in _targets(given):
                started = time.perf_counter()
                if args.action == "seal":
                    changed = changed_since_sealed(path, single)
                    names = listing(changed)
                    if changed and not args.force:
                        raise IntegrityError(
                            f"{path}: {names} changed since it was sealed: check them, then "
                            "seal with --force to seal them as they are"
                        )
                    written = seal_file(path) if single else seal(path)
                    print(f"sealed {path}: {written}" + (f" (anew: {names})" if changed else ""))
                    continue
                redo = "make it again"
                checked = verify_file(path, redo) if single else verify(path, redo)
                took = f"{(time.perf_counter() - started) * 1e3:.1f} ms"
                print(f"{path}: {'intact' if checked else 'no checksums to verify'} ({took})")
    except (Error, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
