"""Option groups the commands share, argument types, and flags generated from the config
dataclasses' fields.

One meaning per flag name across the commands:
- `--threads`: threads each measured kernel runs on (a list such as 1,2 where a command
  measures at several counts);
- `--budget`: real measurements of the agent's top-k schedules per program (k);
- `--seed`, `--timeout`, `--mem-limit`: the measurement worker's random inputs and limits;
- `--store`: the measurement store; `--out`: the folder a command writes; `--run`: an agent's
  training run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.measure.runner import (
    DEFAULT_COMPILE_TIMEOUT_S,
    DEFAULT_MEM_LIMIT_MB,
    DEFAULT_REFERENCE_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
)
from mlirrl_jax.util.configs import doc_of


def _positive(kind: type):
    """An argparse type: a finite number of `kind` above 0."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return value

    return parse


POSITIVE_INT, POSITIVE_FLOAT = _positive(int), _positive(float)


def thread_counts(text: str) -> tuple[int, ...]:
    """`--threads` of a command that measures at several counts: 1 or 1,2."""
    try:
        counts = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads {text!r}: expected e.g. 1 or 1,2") from None
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"--threads {text!r}: thread counts must be >= 1")
    return counts


def cpu_list(text: str) -> tuple[int, ...]:
    try:
        cpus = tuple(int(c) for c in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected core numbers, e.g. 0 or 0,1"
        ) from None
    if any(c < 0 for c in cpus):
        raise argparse.ArgumentTypeError(f"{text!r}: core numbers are >= 0")
    return cpus


def flag_names(names) -> str:
    """`a_b, c` as `--a-b, --c`."""
    return ", ".join("--" + name.replace("_", "-") for name in names)


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """The seed and the limits of the measurement worker, for every command that measures."""
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--timeout",
        type=POSITIVE_FLOAT,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a kernel's run (the verified call and the timed repeats) may take "
        f"before its worker is killed ({DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--mem-limit",
        type=POSITIVE_INT,
        default=DEFAULT_MEM_LIMIT_MB,
        help=f"worker address-space limit in MiB ({DEFAULT_MEM_LIMIT_MB})",
    )


def worker_settings(args: argparse.Namespace) -> dict:
    """`add_worker_options`' flags as the config dataclasses name them."""
    return {"seed": args.seed, "timeout_s": args.timeout, "mem_limit_mb": args.mem_limit}


def add_phase_limits(parser: argparse.ArgumentParser) -> None:
    """The time limits of a measurement's phases other than the kernel's run (--timeout)."""
    parser.add_argument(
        "--compile-timeout",
        type=POSITIVE_FLOAT,
        default=DEFAULT_COMPILE_TIMEOUT_S,
        help=f"seconds compiling a kernel may take ({DEFAULT_COMPILE_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--reference-timeout",
        type=POSITIVE_FLOAT,
        default=DEFAULT_REFERENCE_TIMEOUT_S,
        help="seconds computing a program's NumPy reference outputs may take, once per program "
        f"and seed: they are kept on disk ({DEFAULT_REFERENCE_TIMEOUT_S:g})",
    )


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """Which built-in programs a command takes when it is given no files."""
    parser.add_argument("--suite", help="built-in suite (default dl-v0)")
    parser.add_argument("--split", choices=["train", "surrogate-validation", "test"], help="(test)")
    parser.add_argument("--kind", help="only programs of these op kinds (comma-separated)")
    parser.add_argument("--programs", type=POSITIVE_INT, help="at most this many, evenly spaced")
    parser.add_argument(
        "--max-mflops", type=POSITIVE_FLOAT, help="only programs of at most this many MFLOP"
    )


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """A config dataclass field as the command line shows it."""

    name: str
    annotation: str
    default: object  # None where the field has none (or it is built per instance)
    doc: str


def _named(spec: str):
    """The object "module:NAME" names. The config modules import neither JAX nor the rest of
    their packages (which load their modules at first use: `util.lazy`), so the command line
    reads them before starting JAX."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def module_constant(spec: str):
    """A module-level constant, "module:NAME"."""
    return _named(spec)


def dataclass_fields(spec: str) -> dict[str, FieldInfo]:
    """The fields of the dataclass "module:Class" (`dataclasses.fields`), each with its
    documentation (`util.configs.option`'s metadata) and its default."""
    found = {}
    for f in dataclasses.fields(_named(spec)):
        default = None if f.default is dataclasses.MISSING else f.default
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        found[f.name] = FieldInfo(f.name, annotation, default, doc_of(f))
    return found


def _kind(info: FieldInfo) -> type:
    """A field's flag type from its default, else its annotation (`int | None`: int)."""
    if info.default is not None:
        return type(info.default)
    for kind in (bool, int, float):
        if kind.__name__ in info.annotation.replace("|", " ").split():
            return kind
    return str


def add_field_flags(
    parser,
    spec: str,
    names,
    rename: dict[str, str] | None = None,
    types: dict | None = None,
    choices: dict | None = None,
) -> None:
    """A flag for each field in `names` of the dataclass "module:Class" (`spec`):
    `--field-name` (or `rename[field]`), typed as its default or annotation (a bool an on/off
    pair) unless `types` says otherwise, its help the field's documentation and default.
    Unset flags stay None: the dataclass keeps its own default (`given`)."""
    rename, types, choices = rename or {}, types or {}, choices or {}
    fields = dataclass_fields(spec)
    for name in names:
        info = fields[name]
        flag = "--" + rename.get(name, name).replace("_", "-")
        shown = "" if info.default is None else f" (default: {info.default})"
        help_text = ((info.doc or name.replace("_", " ")) + shown).replace("%", "%%")
        kind = types.get(name) or _kind(info)
        if kind is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, help=help_text
            )
        else:
            parser.add_argument(
                flag, dest=name, type=kind, choices=choices.get(name), help=help_text
            )


def refuse_without(args: argparse.Namespace, flag: str, needed: str, present: bool) -> None:
    """Refuse `flag`, if given, where the flag it needs (`needed`) is not (`present` False):
    nothing would read it. Such a flag's default is None (the library's default applies)."""
    if getattr(args, flag.lstrip("-").replace("-", "_")) is not None and not present:
        raise ConfigError(f"{flag} needs {needed}: pass {needed} too, or drop {flag}")


def given(args: argparse.Namespace, names) -> dict:
    """The flags of `names` that were set (the rest keep the dataclasses' defaults)."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
