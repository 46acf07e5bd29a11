"""The re-grounding options of `train`: flags generated from `RegroundConfig`'s fields, and
the re-grounding they ask for."""

from __future__ import annotations

import json
from pathlib import Path

from mlirrl_jax.cli.options import (
    POSITIVE_INT,
    add_field_flags,
    flag_names,
    given,
    module_constant,
)
from mlirrl_jax.errors import ConfigError

REGROUNDING = "mlirrl_jax.regrounding.config"
REGROUNDING_FIELDS = (
    "rounds",
    "real_budget",
    "round_programs",
    "top_k",
    "iterations_per_round",
    "selection",
    "update",
    "store",
    "threads",
)


def add_regrounding_options(parser) -> None:
    ground = parser.add_argument_group(
        "re-grounding",
        "measure the agent's top schedules on this machine and correct the surrogate between "
        "stretches of training (on with --rounds N > 0; a resumed run keeps its own settings)",
    )
    add_field_flags(
        ground,
        f"{REGROUNDING}:RegroundConfig",
        REGROUNDING_FIELDS,
        types={"real_budget": POSITIVE_INT, "threads": POSITIVE_INT},
        choices={
            "selection": module_constant(f"{REGROUNDING}:SELECTIONS"),
            "update": module_constant(f"{REGROUNDING}:UPDATES"),
        },
    )
    ground.add_argument(
        "--regrounding-config", help="JSON file of RegroundConfig fields (flags override it)"
    )


def regrounding_from_flags(args):
    """The re-grounding of a `train` command (`regrounding.rounds`): from its flags and
    --regrounding-config, or a resumed run's own; None for simulated training only."""
    from mlirrl_jax.regrounding import RegroundConfig, rounds

    settings = given(args, REGROUNDING_FIELDS)
    flags = list(settings)
    if args.regrounding_config:
        settings = {**json.loads(Path(args.regrounding_config).read_text()), **settings}
        flags.append("regrounding_config")
    if args.resume:
        if settings:
            raise ConfigError(
                f"a resumed run keeps its re-grounding settings: drop {flag_names(flags)}"
            )
        return rounds(None)
    if not settings.get("rounds"):
        if settings:
            raise ConfigError(f"{flag_names(flags)}: re-grounding needs rounds > 0 (--rounds N)")
        return None
    return rounds(RegroundConfig.from_json(settings))
