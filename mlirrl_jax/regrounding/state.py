"""What a run's rounds have done so far (`RoundState`, `state.json`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.records import Record
from mlirrl_jax.runfolder import write_atomic


@dataclass
class RoundState(Record):
    """The rounds completed, the real measurements spent, the training programs chosen to
    learn from so far (a program is chosen once), and the machine the rounds measure on."""

    machine_id: str
    completed: int = 0
    spent: int = 0
    chosen: list = field(default_factory=list)

    @classmethod
    def load(cls, path: Path, machine_id: str) -> RoundState:
        """The state in `path`, else a new one; refused when its rounds measured on another
        machine."""
        state = cls.from_json(json.loads(path.read_text())) if path.is_file() else cls(machine_id)
        if state.machine_id != machine_id:
            raise ConfigError(
                f"{path.parent} re-grounds on machine {state.machine_id}; this is {machine_id}: "
                "start a new run here"
            )
        return state

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.to_json(), indent=1))
