"""A model's function as steps in order (`Step`): its layers, constants, views and moves, as the
cut finds them (`models.cut`) and the replay computes them (`models.execute`); `steps.json`
holds them, each step's JSON with only the fields its kind has."""

from __future__ import annotations

from dataclasses import dataclass, fields

from mlirrl_jax.records import Record


@dataclass
class Step(Record):
    """One step. `kind` is "layer" (a layer program run on `operands`), "constant" (a weight
    read from the model's `resource`, or literal `values`), or the MLIR op's name (a view, a
    move, a fill: what the replay computes itself from the fields of that op)."""

    kind: str
    layer: str | None = None  # "layer": the layer's name
    operands: list[str] | None = None  # the values it reads, by name
    result: str | None = None  # the value it makes
    shape: list[int] | None = None  # of the result
    dtype: str | None = None  # "constant": the element type
    resource: str | None = None  # "constant": the weight's name, or a large literal's
    values: list | None = None  # "constant": a small literal's values
    low: list[int] | None = None  # tensor.pad
    high: list[int] | None = None
    value: float | None = None  # tensor.pad's and linalg.fill's value
    offsets: list[int] | None = None  # tensor.extract_slice and insert_slice
    sizes: list[int] | None = None
    strides: list[int] | None = None
    dim: int | None = None  # tensor.concat

    @property
    def reads(self) -> list[str]:
        """The values the step reads (none for a constant)."""
        return self.operands or []

    def to_json(self) -> dict:
        """The fields the step has, in the order above; `result` always (null for an op that
        makes no tensor)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None or f.name == "result"
        }


def steps_of(plan: dict) -> list[Step]:
    """The typed steps of a `steps.json` as read (its "steps" list)."""
    return [Step.from_json(step) for step in plan["steps"]]
