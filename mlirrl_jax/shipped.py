"""Where the project's data lies: what ships with it (the seed measurements, the surrogates,
the agent, the profiles of known machines) and what a user's runs write.

Shipped data is package data (`mlirrl_jax/data` in an installed package, `data/` in a
checkout); nothing is ever written there. A user's measurement store and the agents adapted
to their machines go to the per-user data directory (`user_data_dir`): `$MLIRRL_HOME`, else
`$XDG_DATA_HOME/mlirrl-jax`, else `~/.local/share/mlirrl-jax`. What can be made again (this
machine's profile, reference outputs, XLA's compiled programs) goes to the per-user cache
folder (`user_cache_dir`): `$MLIRRL_HOME/cache`, else `$XDG_CACHE_HOME/mlirrl-jax`, else
`~/.cache/mlirrl-jax`.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DATA = Path(__file__).resolve().parent / "data"  # an installed package
_CHECKOUT_DATA = Path(__file__).resolve().parent.parent / "data"  # a checkout
DATA = _PACKAGE_DATA if _PACKAGE_DATA.is_dir() else _CHECKOUT_DATA
# the surrogate `train` and the demo use by default: an ensemble of 3 fitted on the seed data
# of every machine in `data/seed`, at one and two threads (feature version 5)
SHIPPED_SURROGATE = DATA / "cost_model_multi"
# the earlier one: one network fitted on machine 63f92bffe2fc's rows alone (feature version 4,
# no machine inputs), kept to compare with and for the agents trained against it
SINGLE_MACHINE_SURROGATE = DATA / "cost_model"
SHIPPED_SEEDS = DATA / "seed"  # the seed dataset(s), Parquet, with a data card
SHIPPED_AGENT = DATA / "agent"  # a trained agent checkpoint with its card (`optimize`, the demo)
KNOWN_MACHINES = DATA / "machines.json"  # profiles of known machines (`measure.profile`)


def user_data_dir() -> Path:
    """This user's data directory: `$MLIRRL_HOME`, else `$XDG_DATA_HOME/mlirrl-jax`, else
    `~/.local/share/mlirrl-jax`."""
    if os.environ.get("MLIRRL_HOME"):
        return Path(os.environ["MLIRRL_HOME"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "mlirrl-jax"


def user_cache_dir() -> Path:
    """This user's cache folder: `$MLIRRL_HOME/cache`, else `$XDG_CACHE_HOME/mlirrl-jax`, else
    `~/.cache/mlirrl-jax`."""
    if os.environ.get("MLIRRL_HOME"):
        return user_data_dir() / "cache"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "mlirrl-jax"


def adapted_dir() -> Path:
    """Per machine id, the runs of the shipped agent and surrogate adapted to it
    (`adopted.py`), in the user data directory as it is now (`$MLIRRL_HOME` read at the call,
    not at import)."""
    return user_data_dir() / "adapted"


# where a checkout kept them before: still read, never written
CHECKOUT_ADAPTED = _CHECKOUT_DATA / "adapted"


def default_store() -> str:
    """The measurement store every command uses unless given --store (read at the call)."""
    return str(user_data_dir() / "measurements.db")


# where a checkout kept it before (relative to the checkout): named when it is there
OLD_DEFAULT_STORE = "data/measurements.db"
