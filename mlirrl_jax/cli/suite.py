"""`mlirrl-jax suite`: a built-in suite's programs, with their kind, model, split and size."""

from __future__ import annotations

import sys

from mlirrl_jax.splits import SPLITS


def register(sub) -> None:
    p = sub.add_parser("suite", help="list a built-in suite's programs")
    p.add_argument("--name", default="dl-v0")
    p.add_argument("--split", choices=list(SPLITS))
    p.add_argument("--kind")
    p.set_defaults(func=run)


def run(args) -> int:
    from mlirrl_jax.programs import suites
    from mlirrl_jax.splits import split_of

    entries = suites.suite(args.name)
    if args.split:
        entries = [e for e in entries if split_of(e.uri) == args.split]
    if args.kind:
        entries = [e for e in entries if e.kind == args.kind]
    for e in entries:
        print(f"{e.uri}\t{e.kind}\t{e.model}\t{split_of(e.uri)}\t{e.flops / 1e6:.1f} MFLOP")
    print(f"{len(entries)} programs", file=sys.stderr)
    return 0
