"""Where the data that ships with the project lies: the seed measurements, the surrogate, the
profiles of known machines."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
# the surrogate `train` and the demo use by default: an ensemble of 3 fitted on the seed data
# of every machine in `data/seed`, at one and two threads (feature version 5)
SHIPPED_SURROGATE = DATA / "cost_model_multi"
# the earlier one: one network fitted on machine 63f92bffe2fc's rows alone (feature version 4,
# no machine inputs), kept to compare with and for the agents trained against it
SINGLE_MACHINE_SURROGATE = DATA / "cost_model"
SHIPPED_SEEDS = DATA / "seed"  # the seed dataset(s), Parquet, with a data card
SHIPPED_AGENT = DATA / "agent"  # a trained agent checkpoint with its card (`optimize`, the demo)
ADAPTED = DATA / "adapted"  # per machine id: the shipped agent and surrogate adapted to it
KNOWN_MACHINES = DATA / "machines.json"  # profiles of known machines (`measure.profile`)
