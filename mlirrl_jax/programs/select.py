"""Which programs a job takes: files or a built-in suite's split, filtered by op kind and size,
evenly thinned; and the op kind a program is reported under."""

from __future__ import annotations

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.programs.ir import Program, load_program, parse_program
from mlirrl_jax.programs.suites import UnknownProgramError, get
from mlirrl_jax.util.stats import pick_evenly


def program_kind(program: Program) -> str:
    """The op kind of a suite program, else of its op with the most flops."""
    try:
        return get(program.name).kind
    except UnknownProgramError:
        return max(program.ops, key=lambda op: op.flops).kind


def choose_programs(
    files=(),
    suite: str | None = None,
    split: str | None = None,
    kinds: str | None = None,
    max_mflops: float | None = None,
    count: int | None = None,
) -> list[Program]:
    """`files` (paths or suite:// URIs), else the `split` (default test) of `suite` (default
    dl-v0); only ops of `kinds` (comma-separated), of at most `max_mflops` MFLOP; at most
    `count` of them, evenly spaced. Refuses a choice that leaves nothing, naming why."""
    from mlirrl_jax.splits import entries

    if files and (suite or split):
        raise ConfigError("give programs as FILES or as --suite/--split, not both")
    if files:
        programs = [load_program(f) for f in files]
    else:
        chosen = entries(split or "test", (suite or "dl-v0",))
        if not chosen:
            raise ConfigError(f"the suite {suite or 'dl-v0'} has no {split or 'test'} programs")
        programs = [parse_program(e.text, e.uri) for e in chosen]
    if kinds:
        programs = [p for p in programs if program_kind(p) in set(kinds.split(","))]
        if not programs:
            raise ConfigError(f"no program of kind {kinds}")
    if max_mflops is not None:
        programs = [p for p in programs if p.flops <= max_mflops * 1e6]
        if not programs:
            raise ConfigError(f"no program of at most {max_mflops:g} MFLOP")
    if count is not None:
        if count < 1:
            raise ConfigError(f"--programs must be at least 1, got {count}")
        programs = pick_evenly(programs, count)
    return programs
