"""Actions <-> Schedule on the host, and a Python replay of the environment's state.

`replay(program, actions)` applies an episode's actions with plain Python and NumPy,
independently of the JAX `step`, and returns the Schedule for the real pipeline together with
the state it describes; tests check that it equals the state the jitted environment reached.
`schedule_to_actions` goes the other way, for stored schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the grammar's names: the host replay and the jitted env (`jax_env`) speak the same actions
from mlirrl_jax.actions import (
    DECOMPOSE,
    ENDS_OP,
    INTERCHANGE,
    KIND_INDEX,
    KIND_NAMES,
    MAX_LOOPS,
    MAX_OPS,
    MAX_TILE_LEVELS,
    NEXT,
    PACK,
    PHASE_OF,
    POINTER_INDEX,
    TILE,
    TILE_FUSE,
    TILE_PARALLEL,
    TILES_INDEX,
    VECTORIZE,
    encode_action,
    tile_candidates,
)
from mlirrl_jax.env.state import CONTENT_FIELDS, EnvState, check_fits
from mlirrl_jax.programs.analysis import window_loops
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule, ScheduleError, Transform

# The schedule's content (`CONTENT_FIELDS`: a function of the Schedule alone) plus the step
# grammar's bookkeeping, which also depends on the no-op choices made.
SCHEDULE_FIELDS = ("cursor", "phase", "n_tiles", *CONTENT_FIELDS)


@dataclass
class HostState:
    """The schedule-describing fields of EnvState, as NumPy arrays."""

    cursor: int
    phase: np.ndarray
    n_tiles: np.ndarray
    extents: np.ndarray
    alive: np.ndarray
    order: np.ndarray
    parallel_sizes: np.ndarray
    tile_sizes: np.ndarray
    fused_into: np.ndarray
    did_fuse: np.ndarray
    interchanged: np.ndarray
    decomposed: np.ndarray
    vectorized: np.ndarray
    ragged: np.ndarray
    packed: np.ndarray

    @classmethod
    def initial(cls, program: Program) -> HostState:
        """The state before any action; EncodingError if the program does not fit the shapes."""
        check_fits(program)
        extents = np.zeros((MAX_OPS, MAX_LOOPS), np.int32)
        alive = np.zeros((MAX_OPS, MAX_LOOPS), bool)
        order = np.full((MAX_OPS, MAX_LOOPS), -1, np.int32)
        for op in program.ops:
            extents[op.id, : op.n_loops] = op.extents
            alive[op.id, : op.n_loops] = True
            order[op.id, : op.n_loops] = np.arange(op.n_loops)
        return cls(
            cursor=len(program.ops) - 1,
            phase=np.zeros(MAX_OPS, np.int32),
            # every field of the initial state, on the host (`EnvState` of `state.initial_state` in JAX)
            n_tiles=np.zeros(MAX_OPS, np.int32),
            extents=extents,
            alive=alive,
            order=order,
            parallel_sizes=np.zeros((MAX_OPS, MAX_LOOPS), np.int32),
            tile_sizes=np.zeros((MAX_OPS, MAX_TILE_LEVELS, MAX_LOOPS), np.int32),
            fused_into=np.full(MAX_OPS, -1, np.int32),
            did_fuse=np.zeros(MAX_OPS, bool),
            interchanged=np.zeros(MAX_OPS, bool),
            decomposed=np.zeros(MAX_OPS, bool),
            vectorized=np.zeros(MAX_OPS, bool),
            ragged=np.zeros(MAX_OPS, bool),
            packed=np.zeros(MAX_OPS, bool),
        )

    @classmethod
    def from_env_state(cls, state) -> HostState:
        """The schedule fields of one (unbatched) EnvState."""
        values = {name: np.asarray(getattr(state, name)) for name in SCHEDULE_FIELDS}
        values["cursor"] = int(values["cursor"])
        return cls(**values)

    def to_env_state(self, program_index: int) -> EnvState:
        """The EnvState (NumPy leaves, no batch axis) of this schedule on table row
        `program_index`; no interchange in progress, no predicted times."""
        values = {name: np.asarray(getattr(self, name)) for name in SCHEDULE_FIELDS}
        return EnvState(
            key=np.zeros(2, np.uint32),
            program=np.int32(program_index),
            steps=np.int32(0),
            ix_count=np.int32(0),
            ix_order=np.full(MAX_LOOPS, -1, np.int32),
            base_log_time=np.float32(0.0),
            log_time=np.float32(0.0),
            **{**values, "cursor": np.int32(self.cursor)},
        )

    def differences(self, other: HostState, fields: tuple[str, ...] = SCHEDULE_FIELDS) -> list[str]:
        return [n for n in fields if not np.array_equal(getattr(self, n), getattr(other, n))]


def _sizes(program: Program, op_id: int, tiles, lanes: int | None) -> np.ndarray:
    sizes = np.zeros(MAX_LOOPS, np.int32)
    for j, loop in enumerate(program.ops[op_id].loops):
        sizes[j] = tile_candidates(loop.extent, lanes)[int(tiles[j])]
    return sizes


def _apply(
    program: Program, state: HostState, kind: int, sizes=None, order: list[int] | None = None
) -> None:
    """One transformation of the current op (`state.cursor`): `sizes` per loop for tiling
    kinds, the complete loop `order` for an interchange; then the grammar's phase and cursor
    moves (`actions.GRAMMAR`)."""
    c = state.cursor
    if kind in (TILE_PARALLEL, TILE_FUSE):
        state.parallel_sizes[c] = sizes
        state.extents[c] = np.where(sizes > 0, sizes, state.extents[c])
        fuse = kind == TILE_FUSE and bool(sizes.any())
        state.did_fuse[c] = fuse
        if fuse:
            for producer in program.fusion_closure(c):
                loop_map = program.fusion_loop_map(producer)
                consumer = program.consumers(producer)[0]
                for j, m in enumerate(loop_map):
                    if m >= 0:
                        state.extents[producer, j] = state.extents[consumer, m]
                state.fused_into[producer] = c
    elif kind == INTERCHANGE and order is not None:
        state.order[c] = list(order) + [-1] * (MAX_LOOPS - len(order))
        state.interchanged[c] = True
    elif kind == TILE:
        state.ragged[c] |= bool(
            np.any((sizes > 0) & (state.extents[c] % np.maximum(sizes, 1) != 0))
        )
        state.tile_sizes[c, int(state.tile_sizes[c].any(axis=1).sum())] = sizes
        state.extents[c] = np.where(sizes > 0, sizes, state.extents[c])
        state.n_tiles[c] += 1
    elif kind == DECOMPOSE:
        for out_loop, window_loop in window_loops(program.ops[c]):
            if state.extents[c, out_loop] == 1 and state.extents[c, window_loop] == 1:
                break
        state.alive[c, [out_loop, window_loop]] = False
        kept = [j for j in state.order[c] if j >= 0 and j not in (out_loop, window_loop)]
        state.order[c] = kept + [-1] * (MAX_LOOPS - len(kept))
        state.decomposed[c] = True
    elif kind == VECTORIZE:
        state.vectorized[c] = True
    elif kind == PACK:
        state.packed[c] = True
    # the kind moves the op to its grammar phase (an interchange once all loops are placed)
    if kind != NEXT and (kind != INTERCHANGE or state.interchanged[c]):
        state.phase[c] = PHASE_OF[kind]
    if ENDS_OP[kind]:
        state.cursor -= 1


def replay(program: Program, actions, lanes: int | None = None) -> tuple[Schedule, HostState]:
    """Apply applied (legal) actions in Python; the Schedule and the state they reach.
    `lanes`: the vector width the actions' tile candidates were offered for (default: this
    machine's, as `encode_programs` offers them)."""
    state = HostState.initial(program)
    ix_order: list[int] = []
    for action in actions:
        if state.cursor < 0:
            break
        kind, c = int(action[KIND_INDEX]), state.cursor
        order = None
        if kind == INTERCHANGE:  # one level per step; the last loop completes the order
            ix_order.append(int(action[POINTER_INDEX]))
            alive = [j for j in range(MAX_LOOPS) if state.alive[c, j]]
            if len(ix_order) >= len(alive) - 1:
                order = ix_order + [j for j in alive if j not in ix_order]
                ix_order = []
        _apply(program, state, kind, _sizes(program, c, action[TILES_INDEX:], lanes), order)
    return schedule_of(program, state), state


KIND_OF_TRANSFORM = {name: kind for kind, name in enumerate(KIND_NAMES) if kind != NEXT}


def state_of_schedule(program: Program, schedule: Schedule) -> HostState:
    """The finished state a whole Schedule describes, any tile sizes included (not only the
    action space's candidates): what a cost model reads to score, say, the heuristic's
    schedule. A tile as large as its loop tiles nothing and is recorded as 0."""
    state = HostState.initial(program)
    for op in reversed(program.ops):
        if state.cursor != op.id:  # the episode's op order: consumers first, by id
            raise ScheduleError(f"{program.name}: op {op.id} out of the order the ops have")
        transforms = schedule.transforms_of(op.id)
        for t in transforms:
            kind = KIND_OF_TRANSFORM[t.kind]
            sizes = None
            if t.sizes:
                sizes = np.zeros(MAX_LOOPS, np.int32)
                sizes[: len(t.sizes)] = t.sizes
                sizes = np.where(sizes < state.extents[op.id], sizes, 0).astype(np.int32)
            _apply(program, state, kind, sizes, list(t.permutation) if t.permutation else None)
        if not transforms or not ENDS_OP[KIND_OF_TRANSFORM[transforms[-1].kind]]:
            _apply(program, state, NEXT)
    return state


def schedule_of(program: Program, state: HostState) -> Schedule:
    """The Schedule a state describes: each op's transformations in grammar order."""
    per_op = []
    for op in reversed(program.ops):
        i, n = op.id, op.n_loops
        steps = []
        if state.parallel_sizes[i].any():
            kind = "tile_fuse" if state.did_fuse[i] else "tile_parallel"
            steps.append(Transform(kind, tuple(int(s) for s in state.parallel_sizes[i, :n])))
        if state.interchanged[i]:
            steps.append(
                Transform(
                    "interchange", permutation=tuple(int(j) for j in state.order[i] if j >= 0)
                )
            )
        for level in range(MAX_TILE_LEVELS):
            if state.tile_sizes[i, level].any():
                steps.append(
                    Transform("tile", tuple(int(s) for s in state.tile_sizes[i, level, :n]))
                )
        if state.packed[i]:
            steps.append(Transform("pack"))
        if state.decomposed[i]:
            steps.append(Transform("decompose"))
        if state.vectorized[i]:
            steps.append(Transform("vectorize"))
        if steps:
            per_op.append((i, steps))
    return Schedule.of(per_op)


def _choices(
    program: Program, op_id: int, sizes: tuple[int, ...], lanes: int | None, nearest: bool = False
) -> list[int]:
    choices = []
    for loop, size in zip(program.ops[op_id].loops, sizes):
        offered = tile_candidates(loop.extent, lanes)
        if size and nearest and size not in offered[1:]:
            ratios = [abs(np.log(c / size)) if c else np.inf for c in offered]
            size = offered[int(np.argmin(ratios))]
        if size and size not in offered[1:]:
            raise ScheduleError(
                f"op {op_id}: tile size {size} is not offered for extent {loop.extent}"
            )
        choices.append(offered.index(size) if size else 0)
    return choices


def schedule_to_actions(
    program: Program, schedule: Schedule, lanes: int | None = None, nearest: bool = False
) -> list[np.ndarray]:
    """An action sequence that builds `schedule` (grammar order, sizes among the candidates
    offered for vectors of `lanes`, default this machine's). A size not offered is an error,
    or with `nearest` the offered size closest to it in ratio (a schedule like it); a step
    outside the action space is a ScheduleError too."""
    kinds = {
        "tile_parallel": TILE_PARALLEL,
        "tile_fuse": TILE_FUSE,
        "tile": TILE,
        "decompose": DECOMPOSE,
        "vectorize": VECTORIZE,
        "pack": PACK,
    }
    actions = []
    for op in reversed(program.ops):
        transforms = schedule.transforms_of(op.id)
        for t in transforms:
            if t.kind == "interchange":
                for loop in t.permutation[:-1]:
                    actions.append(encode_action(INTERCHANGE, pointer=loop))
            elif t.kind not in kinds:
                raise ScheduleError(
                    f"op {op.id}: {t.kind!r} is outside the action space (its steps: "
                    f"{', '.join(kinds)}, interchange)"
                )
            else:
                actions.append(
                    encode_action(
                        kinds[t.kind],
                        tiles=_choices(program, op.id, t.sizes, lanes, nearest) if t.sizes else (),
                    )
                )
        if not transforms or transforms[-1].kind != "vectorize":
            actions.append(encode_action(NEXT))
    return actions
