"""Schedules: plain data saying which loop transformations to apply to each op, in order.

Tile sizes and permutations always refer to the op's *original* loops (the order of its
iteration space in the program), whatever interchanges came before; 0 means "not tiled".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from mlirrl_jax.errors import Error

SCHEDULE_FORMAT = 1


class Kind(Enum):
    """Every transformation kind, named once. Its value is its name in schedules (JSON) and
    in the transform script (`transform.py`); its place in this list (`action`) is its index in
    the agent's kind head, after 0, "next op" (`actions.py`): append a new kind at the end, so
    the existing indices keep their meaning (docs/adding-a-transform.md)."""

    TILE_PARALLEL = "tile_parallel"  # tile_using_forall on parallel loops (threads)
    TILE_FUSE = "tile_fuse"  # tile_using_forall, then fuse the op's producers into the loop
    INTERCHANGE = "interchange"  # permute the op's loops (generalizes named ops)
    TILE = "tile"  # tile_using_for: one level of scf.for tiling
    DECOMPOSE = "decompose"  # 2-D conv/pooling with a size-1 window row -> 1-D, so it vectorizes
    VECTORIZE = "vectorize"  # vectorize the (tiled) op; contraction -> FMAs, hoisting
    PACK = "pack"  # copy the tile of a matmul's B into a contiguous panel per outer tile

    @property
    def action(self) -> int:
        """The kind head's index of this kind (0 is "next op")."""
        return list(Kind).index(self) + 1


# the kinds' names, as `Transform.kind` holds them (plain strings: JSON as it is)
TILE = Kind.TILE.value
TILE_PARALLEL = Kind.TILE_PARALLEL.value
TILE_FUSE = Kind.TILE_FUSE.value
INTERCHANGE = Kind.INTERCHANGE.value
VECTORIZE = Kind.VECTORIZE.value
DECOMPOSE = Kind.DECOMPOSE.value
PACK = Kind.PACK.value

KINDS = tuple(k.value for k in Kind)
TILING_KINDS = (TILE, TILE_PARALLEL, TILE_FUSE)  # the kinds that take tile sizes


class ScheduleError(Error, ValueError):
    """A schedule that is malformed as data (not one that fails to compile)."""


@dataclass(frozen=True)
class Transform:
    """One transformation of one op."""

    kind: str
    sizes: tuple[int, ...] = ()  # per original loop; 0 = not tiled (tiling kinds)
    permutation: tuple[int, ...] = ()  # original loop indices, outermost first (interchange)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ScheduleError(f"unknown transformation kind {self.kind!r}; known: {KINDS}")
        if self.kind in TILING_KINDS and not self.sizes:
            raise ScheduleError(f"{self.kind} needs tile sizes")
        if any(s < 0 for s in self.sizes):
            raise ScheduleError(f"{self.kind}: negative tile size in {self.sizes}")
        if self.kind == INTERCHANGE and (
            not self.permutation or len(set(self.permutation)) != len(self.permutation)
        ):
            raise ScheduleError(f"interchange: {self.permutation} is not a permutation")

    def to_json(self) -> dict:
        out: dict = {"kind": self.kind}
        if self.sizes:
            out["sizes"] = list(self.sizes)
        if self.permutation:
            out["permutation"] = list(self.permutation)
        return out

    @classmethod
    def from_json(cls, data: dict, where: str = "transform") -> Transform:
        """A transform from JSON; errors start with `where` (which op, which transform)."""
        if not isinstance(data, dict) or "kind" not in data:
            raise ScheduleError(f"{where}: a transform is an object with a 'kind'")
        unknown = set(data) - {"kind", "sizes", "permutation"}
        if unknown:
            raise ScheduleError(f"{where}: unknown fields {sorted(unknown)}")
        where = f"{where} ({data['kind']})"
        sizes = _integers(data.get("sizes", []), f"{where}: sizes")
        permutation = _integers(data.get("permutation", []), f"{where}: permutation")
        try:
            return cls(data["kind"], sizes, permutation)
        except ScheduleError as exc:
            raise ScheduleError(f"{where}: {exc}") from None


def _integers(value, what: str) -> tuple[int, ...]:
    """A JSON list of integers. Anything else is refused, not rounded: 8.5, 8.0, "8", true."""
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ScheduleError(
            f"{what} must be a list of integers, not {json.dumps(value, default=str)}"
        )
    return tuple(value)


@dataclass(frozen=True)
class OpSchedule:
    """The transformations of one op, applied in order."""

    op: int
    transforms: tuple[Transform, ...]


@dataclass(frozen=True)
class Schedule:
    """Transformations per op; ops are transformed in the listed order (consumers first)."""

    ops: tuple[OpSchedule, ...] = field(default=())

    def __post_init__(self):
        ids = [o.op for o in self.ops]
        if len(ids) != len(set(ids)):
            raise ScheduleError(f"an op appears twice in the schedule: {ids}")

    @classmethod
    def of(cls, per_op: dict[int, list[Transform]] | list[tuple[int, list[Transform]]]) -> Schedule:
        items = per_op.items() if isinstance(per_op, dict) else per_op
        return cls(tuple(OpSchedule(op, tuple(ts)) for op, ts in items))

    def transforms_of(self, op_id: int) -> tuple[Transform, ...]:
        for o in self.ops:
            if o.op == op_id:
                return o.transforms
        return ()

    @property
    def is_empty(self) -> bool:
        return all(not o.transforms for o in self.ops)

    def to_json(self) -> dict:
        return {
            "format": SCHEDULE_FORMAT,
            "ops": [
                {"op": o.op, "transforms": [t.to_json() for t in o.transforms]} for o in self.ops
            ],
        }

    def dumps(self) -> str:
        """Canonical JSON text (sorted keys, no spaces): the basis of the hash."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.dumps().encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, data: dict) -> Schedule:
        if not isinstance(data, dict) or "ops" not in data:
            raise ScheduleError("a schedule is a JSON object with an 'ops' list")
        if data.get("format", SCHEDULE_FORMAT) != SCHEDULE_FORMAT:
            raise ScheduleError(f"schedule format {data.get('format')} is not {SCHEDULE_FORMAT}")
        if not isinstance(data["ops"], list):
            raise ScheduleError("a schedule's 'ops' is a list")
        ops = []
        for index, entry in enumerate(data["ops"]):
            if not isinstance(entry, dict) or not {"op", "transforms"} <= set(entry):
                raise ScheduleError(
                    f"ops[{index}]: missing or wrong field: an entry has 'op' and 'transforms'"
                )
            op = entry["op"]
            if not isinstance(op, int) or isinstance(op, bool):
                raise ScheduleError(f"ops[{index}]: op must be an integer id, not {op!r}")
            if not isinstance(entry["transforms"], list):
                raise ScheduleError(f"op {op}: 'transforms' is a list")
            transforms = [
                Transform.from_json(t, f"op {op}, transform {i}")
                for i, t in enumerate(entry["transforms"])
            ]
            ops.append(OpSchedule(op, tuple(transforms)))
        return cls(tuple(ops))

    @classmethod
    def loads(cls, text: str) -> Schedule:
        try:
            return cls.from_json(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"schedule is not valid JSON: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        path = Path(path)
        if not path.is_file():
            raise ScheduleError(f"{path}: no such schedule file")
        try:
            return cls.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ScheduleError(f"{path}: not UTF-8 text, so not a schedule (JSON)") from None
        except ScheduleError as exc:
            raise ScheduleError(f"{path}: {exc}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    def describe(self) -> str:
        parts = []
        for o in self.ops:
            steps = []
            for t in o.transforms:
                arg = t.sizes or t.permutation
                steps.append(f"{t.kind}{list(arg) if arg else ''}")
            parts.append(f"op{o.op}: " + (" -> ".join(steps) or "-"))
        return "; ".join(parts) or "(no schedule)"
