"""The named splits of every program: train, surrogate-validation and test. Their one owner.

- **test**: each suite's own test split (dl-v0: all of VGG-16 plus a hashed 15% of the other
  shapes; the shapes-v* suites: a hashed 15%). Neither the surrogate nor the agent ever trains
  on it; the agent's validation reports on it alone.
- **surrogate-validation**: the programs the surrogate is evaluated on while it is fitted:
  dl-v0's ResNet-50 family plus a hashed 15% of dl-v0's other non-test shapes. Neither the
  surrogate nor the agent trains on it.
- **train**: everything else, programs outside the built-in suites included (a user's own).
  The surrogate fits on it and the agent trains on it.

Every rule is a function of the program's name, so a split never depends on what a store
holds, and the rules are versioned with `SPLITS_VERSION`: a checkpoint records the version
its data was split by.
"""

from __future__ import annotations

import hashlib

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.programs import suites

TRAIN, SURROGATE_VALIDATION, TEST = "train", "surrogate-validation", "test"
SPLITS = (TRAIN, SURROGATE_VALIDATION, TEST)
SPLITS_VERSION = 1  # bump when a rule below changes
VALIDATION_SUITE = "dl-v0"
VALIDATION_FAMILIES = ("resnet50",)
VALIDATION_PERCENT = 15


def suite_of(name: str) -> str | None:
    """The built-in suite a program name (`suite://<suite>/<name>`) belongs to, if any."""
    if not name.startswith(suites.SCHEME):
        return None
    suite = name[len(suites.SCHEME) :].split("/", 1)[0]
    return suite if suite in suites.list_suites() else None


def _hashed_percent(name: str) -> int:
    digest = hashlib.sha256(f"{SURROGATE_VALIDATION}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100


def split_of(name: str) -> str:
    """The split of the program called `name` (a suite URI or any other name)."""
    suite = suite_of(name)
    if suite is None:
        return TRAIN
    try:
        entry = suites.get(name)
    except suites.UnknownProgramError:
        return TRAIN  # a name that looks like a suite URI but is not one: a user's program
    if entry.split == "test":
        return TEST
    if suite == VALIDATION_SUITE and (
        entry.model in VALIDATION_FAMILIES or _hashed_percent(name) < VALIDATION_PERCENT
    ):
        return SURROGATE_VALIDATION
    return TRAIN


def check_split(split: str) -> str:
    """`split` if it names a split, else a ValueError that lists them."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
    return split


def entries(split: str, suite_names: list[str] | tuple[str, ...]) -> list[suites.SuiteEntry]:
    """The programs of `split` in the given built-in suites, in suite order."""
    check_split(split)
    return [e for name in suite_names for e in suites.suite(name) if split_of(e.uri) == split]
