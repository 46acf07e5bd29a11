"""Where the data that ships with the project lies: the seed measurements, the surrogate, the
profiles of known machines."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
SHIPPED_SURROGATE = DATA / "cost_model"  # the surrogate `train` and the demo use by default
SHIPPED_SEEDS = DATA / "seed"  # the seed dataset(s), Parquet, with a data card
SHIPPED_AGENT = DATA / "agent"  # a trained agent checkpoint with its card (`optimize`, the demo)
ADAPTED = DATA / "adapted"  # per machine id: the shipped agent and surrogate adapted to it
KNOWN_MACHINES = DATA / "machines.json"  # profiles of known machines (`measure.profile`)
