"""Command line: `mlirrl-jax COMMAND`, one module per command in this package, each adding its
parser (`register`) and calling one library function (`run`).

Only the project's own errors (`mlirrl_jax.errors.Error`), a missing file and a full disk are
reported as a one-line message with exit status 2; any other exception is a defect and keeps
its traceback. The library's messages (`logging`) and progress bars show here: `-v` adds its
debug messages, `-q` keeps only its warnings and errors and no bars.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sqlite3
import sys
from pathlib import Path

from mlirrl_jax.cli import (
    collect,
    demo,
    fit,
    import_model,
    measure,
    optimize,
    optimize_model,
    show,
    store,
    suite,
    train,
    validate,
)
from mlirrl_jax.errors import Error
from mlirrl_jax.interrupt import stop_on_ctrl_c
from mlirrl_jax.runfolder import command_line, has_checkpoint
from mlirrl_jax.shipped import OLD_DEFAULT_STORE, default_store
from mlirrl_jax.util.progress import show_progress

COMMANDS = (
    measure,
    demo,
    collect,
    store,
    fit,
    suite,
    show,
    train,
    validate,
    optimize,
    import_model,
    optimize_model,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlirrl-jax",
        description="Reinforcement-learning optimizer for MLIR Linalg code: a surrogate cost "
        "model, a PPO agent trained on it, checked on this machine's CPU.",
    )
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="store_true", help="debug messages too")
    loud.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("mlirrl_jax")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


def _name_an_old_default_store(args: argparse.Namespace) -> None:
    """Say so where a checkout holds a store at the old default place and the command would
    use the new one (the per-user data directory) without being told."""
    given, default = getattr(args, "store", None), default_store()
    if (given in (None, default)) and Path(OLD_DEFAULT_STORE).is_file():
        if not Path(default).exists():
            logging.getLogger("mlirrl_jax").warning(
                "%s is no longer the default store (now %s, or $MLIRRL_HOME/measurements.db): "
                "pass --store %s to use it, or move it there",
                OLD_DEFAULT_STORE,
                default,
                OLD_DEFAULT_STORE,
            )


def _full_disk(exc: Exception, args: argparse.Namespace) -> str | None:
    """The one-line error for a full disk (or an exhausted quota), naming what was being
    written; None for any other error."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = os.strerror(exc.errno).lower()
        # a failed write of an open file names none: the command's output, else its store
        path = exc.filename or getattr(args, "out", None) or getattr(args, "store", None)
    elif isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
        why = "no space left on device"
        path = getattr(args, "store", None) or default_store()  # train's default store
    else:
        return None
    again = "rerun"
    if args.command == "train" and has_checkpoint(args.out):
        again = "rerun with --resume"
    return f"error: {why} writing {path}: free space and {again}; nothing saved before was lost"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = command_line(argv)  # recorded in a run folder's lock
    _configure_logging(args)
    show_progress(not args.quiet)
    _name_an_old_default_store(args)
    try:
        with stop_on_ctrl_c():
            return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (Error, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.OperationalError) as exc:
        line = _full_disk(exc, args)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
