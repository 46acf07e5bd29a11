"""Fixed-shape arrays for the JAX environment: the program table and the environment state.

`encode_programs` turns Programs into a `ProgramTable`, one row per program padded to
MAX_OPS x MAX_LOOPS, so a batch of environments can each run a different program. `EnvState`
holds one environment's schedule so far; it has no Python objects.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from mlirrl_jax.actions import MAX_LOOPS, MAX_OPS, MAX_TILE_LEVELS, N_TILE_CHOICES, tile_candidates
from mlirrl_jax.measure.profile import MachineProfile, this_machine_profile
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.transform import packable_inputs, window_loops

OP_KINDS = (
    "fill",
    "matmul",
    "batch_matmul",
    "conv",
    "depthwise_conv",
    "pooling",
    "elementwise",
    "contraction",
    "reduction",
)
ARITH_KINDS = ("add", "sub", "mul", "div", "exp", "max", "math", "other")
MAX_OPERANDS = 4
# access codes per (operand, loop): how a loop walks an operand
NOT_USED, STRIDED, CONTIGUOUS = 0, 1, 2


# the machine profile's figures a table holds per program (`measure.profile.MachineProfile`)
MACHINE_FIELDS = ("fma_peak_gflops", "bandwidth_gbs", "l1d_bytes", "l2_bytes", "l3_bytes", "cores")


class EncodingError(ValueError):
    """A program that does not fit the environment's fixed shapes."""


@struct.dataclass
class ProgramTable:
    """Programs as padded arrays; the leading axis P indexes programs."""

    n_ops: jax.Array  # (P,) int32
    op_kind: jax.Array  # (P, MAX_OPS) int32, index into OP_KINDS
    op_valid: jax.Array  # (P, MAX_OPS) bool
    extents: jax.Array  # (P, MAX_OPS, MAX_LOOPS) int32, 0 for padding
    loop_valid: jax.Array  # (P, MAX_OPS, MAX_LOOPS) bool
    is_reduction: jax.Array  # (P, MAX_OPS, MAX_LOOPS) bool
    candidates: jax.Array  # (P, MAX_OPS, MAX_LOOPS, N_TILE_CHOICES) int32, 0 = none/padding
    window_out: jax.Array  # (P, MAX_OPS, 2) int32: output loop of the H and W windows, -1
    window_in: jax.Array  # (P, MAX_OPS, 2) int32: window loop of the H and W windows, -1
    fusion_consumer: jax.Array  # (P, MAX_OPS) int32: the op it can fuse into, -1
    fusion_loop_map: jax.Array  # (P, MAX_OPS, MAX_LOOPS) int32: consumer loop tiling it, -1
    arith: jax.Array  # (P, MAX_OPS, len(ARITH_KINDS)) float32: body op counts
    access: jax.Array  # (P, MAX_OPS, MAX_OPERANDS, MAX_LOOPS) int32: NOT_USED/STRIDED/CONTIGUOUS
    operand_bytes: jax.Array  # (P, MAX_OPS, MAX_OPERANDS) float32
    operand_is_output: jax.Array  # (P, MAX_OPS, MAX_OPERANDS) bool
    stride: jax.Array  # (P, MAX_OPS, MAX_OPERANDS, MAX_LOOPS) float32: bytes a loop step moves
    packable: jax.Array  # (P, MAX_OPS) bool: `pack` applies (transform.packable_inputs)
    vector_lanes: jax.Array  # (P,) int32: f32 lanes of the vectors the candidates are made for
    machine: jax.Array  # (P, len(MACHINE_FIELDS)) float32: the profile of the machine it runs on
    threads: jax.Array  # (P,) int32: threads per kernel
    static_op: jax.Array | None = None  # (P, MAX_OPS, STATIC_OP_FEATURES) float32
    static_loop: jax.Array | None = None  # (P, MAX_OPS, MAX_LOOPS, STATIC_LOOP_FEATURES) float32
    op_slots: int = struct.field(pytree_node=False, default=MAX_OPS)  # most ops of its programs

    @property
    def n_programs(self) -> int:
        return int(self.n_ops.shape[0])


_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8}


def check_fits(program: Program) -> None:
    """Raise EncodingError if the program has more ops, loops or operands than the
    environment's fixed shapes hold (the table and the host replay both check here)."""
    if len(program.ops) > MAX_OPS:
        raise EncodingError(
            f"{program.name}: {len(program.ops)} ops, the environment takes {MAX_OPS}"
        )
    for op in program.ops:
        where = f"{program.name}: op {op.id} ({op.name})"
        if op.n_loops > MAX_LOOPS:
            raise EncodingError(f"{where}: {op.n_loops} loops, the environment takes {MAX_LOOPS}")
        if len(op.operands) > MAX_OPERANDS:
            raise EncodingError(f"{where}: {len(op.operands)} operands, at most {MAX_OPERANDS}")


def _encode_one(
    program: Program, lanes: int, machine: MachineProfile, threads: int
) -> dict[str, np.ndarray]:
    check_fits(program)
    row = {
        "n_ops": np.int32(len(program.ops)),
        "op_kind": np.zeros(MAX_OPS, np.int32),
        "op_valid": np.zeros(MAX_OPS, bool),
        "extents": np.zeros((MAX_OPS, MAX_LOOPS), np.int32),
        "loop_valid": np.zeros((MAX_OPS, MAX_LOOPS), bool),
        "is_reduction": np.zeros((MAX_OPS, MAX_LOOPS), bool),
        "candidates": np.zeros((MAX_OPS, MAX_LOOPS, N_TILE_CHOICES), np.int32),
        "window_out": np.full((MAX_OPS, 2), -1, np.int32),
        "window_in": np.full((MAX_OPS, 2), -1, np.int32),
        "fusion_consumer": np.full(MAX_OPS, -1, np.int32),
        "fusion_loop_map": np.full((MAX_OPS, MAX_LOOPS), -1, np.int32),
        "arith": np.zeros((MAX_OPS, len(ARITH_KINDS)), np.float32),
        "access": np.zeros((MAX_OPS, MAX_OPERANDS, MAX_LOOPS), np.int32),
        "operand_bytes": np.zeros((MAX_OPS, MAX_OPERANDS), np.float32),
        "operand_is_output": np.zeros((MAX_OPS, MAX_OPERANDS), bool),
        "stride": np.zeros((MAX_OPS, MAX_OPERANDS, MAX_LOOPS), np.float32),
        "packable": np.zeros(MAX_OPS, bool),
        "vector_lanes": np.int32(lanes),
        "machine": np.array([getattr(machine, f) for f in MACHINE_FIELDS], np.float32),
        "threads": np.int32(threads),
    }
    for op in program.ops:
        i = op.id
        row["op_kind"][i] = OP_KINDS.index(op.kind)
        row["packable"][i] = bool(packable_inputs(op))
        row["op_valid"][i] = True
        for j, loop in enumerate(op.loops):
            row["extents"][i, j] = loop.extent
            row["loop_valid"][i, j] = True
            row["is_reduction"][i, j] = loop.iterator == "reduction"
            row["candidates"][i, j] = tile_candidates(loop.extent, lanes)
        for w, (out_loop, window_loop) in enumerate(window_loops(op)[:2]):
            row["window_out"][i, w] = out_loop
            row["window_in"][i, w] = window_loop
        loop_map = program.fusion_loop_map(i)
        if loop_map is not None:
            row["fusion_consumer"][i] = program.consumers(i)[0]
            row["fusion_loop_map"][i, : len(loop_map)] = loop_map
        for name, count in op.arith_counts.items():
            row["arith"][i, ARITH_KINDS.index(name)] = count
        for k, operand in enumerate(op.operands):
            size = int(np.prod(operand.shape)) if operand.shape else 1
            element = _BYTES.get(operand.element_type, 4)
            row["operand_bytes"][i, k] = size * element
            # row-major buffers: a step of loop j moves sum_dims coeff * (elements after dim)
            dim_strides = np.cumprod((*operand.shape[1:], 1)[::-1])[::-1] * element
            row["operand_is_output"][i, k] = operand.is_output
            for r, access_row in enumerate(operand.access):
                innermost = r == len(operand.access) - 1
                for j, coeff in enumerate(access_row):
                    if coeff:
                        row["stride"][i, k, j] += abs(coeff) * dim_strides[r]
                        code = CONTIGUOUS if innermost and coeff == 1 else STRIDED
                        row["access"][i, k, j] = max(row["access"][i, k, j], code)
    return row


def encode_programs(
    programs: list[Program],
    lanes: int | Sequence[int] | None = None,
    machine: MachineProfile | Sequence[MachineProfile] | None = None,
    threads: int | Sequence[int] = 1,
) -> ProgramTable:
    """Stack programs into one table (raises EncodingError for a program that does not fit).

    Each of `lanes`, `machine` and `threads` is one value for every program or a sequence of
    one per program. `machine`: the profile of the machine the programs run on (default:
    this one's, `measure.profile.this_machine_profile`); `threads`: threads per kernel.
    `lanes`: the vector width (f32) whose whole vectors the tile candidates offer (default:
    the machine's; a store of another machine's rows is replayed with that machine's)."""
    if not programs:
        raise EncodingError("no programs to encode")
    from mlirrl_jax.env.features import static_features

    if machine is None:
        machine = this_machine_profile()
    machines = _per_program(machine, programs, "machine")
    lanes = [m.vector_lanes for m in machines] if lanes is None else lanes
    rows = [
        _encode_one(p, n, m, t)
        for p, n, m, t in zip(
            programs,
            _per_program(lanes, programs, "lanes"),
            machines,
            _per_program(threads, programs, "threads"),
        )
    ]
    table = ProgramTable(
        **{k: jnp.asarray(np.stack([r[k] for r in rows])) for k in rows[0]},
        op_slots=max(len(p.ops) for p in programs),
    )
    static_op, static_loop = jax.jit(static_features)(table)  # one compile, not one per op
    return table.replace(static_op=static_op, static_loop=static_loop)


def _per_program(value, programs: list[Program], name: str) -> list:
    """`value` for each program: itself repeated, or a sequence of one per program."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(programs):
            raise ValueError(f"{len(value)} {name} values for {len(programs)} programs")
        return list(value)
    return [value] * len(programs)


# Fields of EnvState that describe the schedule: a function of the Schedule alone
CONTENT_FIELDS = (
    "extents",
    "alive",
    "order",
    "parallel_sizes",
    "tile_sizes",
    "fused_into",
    "did_fuse",
    "interchanged",
    "decomposed",
    "vectorized",
    "ragged",
    "packed",
)
# EnvState fields with one entry per op (their first axis)
_STATE_OP_FIELDS = ("phase", "n_tiles", *CONTENT_FIELDS)


def trim_ops(
    table: ProgramTable, states: EnvState, slots: int | None = None
) -> tuple[ProgramTable, EnvState]:
    """The table and a batch of its states (leading batch axis) cut to `slots` op slots
    (default: the table's `op_slots`): the op slots past the programs' ops are padding in
    every state, and the work per state (features, the surrogate) grows with the slots it runs
    over. Only states of programs of at most `slots` ops may be cut to `slots`."""
    slots = slots or table.op_slots
    if slots == table.extents.shape[1] == states.extents.shape[1]:
        return table, states
    cut = {name: getattr(states, name)[:, :slots] for name in _STATE_OP_FIELDS}
    return trim_table(table, slots), states.replace(**cut)


def trim_table(table: ProgramTable, slots: int) -> ProgramTable:
    """The table cut to its first `slots` op slots (`trim_ops`)."""
    if slots == table.extents.shape[1]:
        return table
    cut = jax.tree.map(lambda a: a if a.ndim < 2 else a[:, :slots], table)
    # the machine's figures are per program, not per op slot
    return cut.replace(op_slots=min(slots, table.op_slots), machine=table.machine)


def slot_sizes(op_slots: int) -> list[int]:
    """The op-slot counts that batched prediction and training compile for, up to
    `op_slots`: most programs have 1 to 3 ops; each count is one more compiled variant."""
    return sorted({s for s in (1, 2, 3) if s < op_slots} | {op_slots})


@struct.dataclass
class EnvState:
    """One environment: which program, which op, and the schedule chosen so far."""

    key: jax.Array  # PRNG key
    program: jax.Array  # () int32, row of the program table
    cursor: jax.Array  # () int32, the op being scheduled; -1 when the episode is over
    steps: jax.Array  # () int32, steps taken in the episode
    phase: jax.Array  # (MAX_OPS,) int32, last grammar phase reached per op
    n_tiles: jax.Array  # (MAX_OPS,) int32, tiling levels applied
    extents: jax.Array  # (MAX_OPS, MAX_LOOPS) int32, current (tile) extent per original loop
    alive: jax.Array  # (MAX_OPS, MAX_LOOPS) bool, loop still exists (decompose removes two)
    order: jax.Array  # (MAX_OPS, MAX_LOOPS) int32, original loop index at each position, -1
    parallel_sizes: jax.Array  # (MAX_OPS, MAX_LOOPS) int32, scf.forall tile sizes, 0 = none
    tile_sizes: jax.Array  # (MAX_OPS, MAX_TILE_LEVELS, MAX_LOOPS) int32, 0 = not tiled
    fused_into: jax.Array  # (MAX_OPS,) int32, consumer whose loop holds this op, -1
    did_fuse: jax.Array  # (MAX_OPS,) bool, this op's parallel tiling fused its producers
    interchanged: jax.Array  # (MAX_OPS,) bool
    decomposed: jax.Array  # (MAX_OPS,) bool
    vectorized: jax.Array  # (MAX_OPS,) bool
    ragged: jax.Array  # (MAX_OPS,) bool, a tiling left a partial last tile (peeled)
    packed: jax.Array  # (MAX_OPS,) bool
    ix_count: jax.Array  # () int32, levels placed by the interchange in progress (0: none)
    ix_order: jax.Array  # (MAX_LOOPS,) int32, loops placed so far, -1
    base_log_time: jax.Array  # () float32, predicted log time of the unscheduled program
    log_time: jax.Array  # () float32, predicted log time of the current schedule

    @property
    def done(self) -> jax.Array:
        return self.cursor < 0


def initial_state(table: ProgramTable, program: jax.Array, key: jax.Array) -> EnvState:
    """The state before any action on `program` (predicted times filled in by the env)."""
    extents = table.extents[program]
    valid = table.loop_valid[program]
    positions = jnp.arange(MAX_LOOPS, dtype=jnp.int32)
    return EnvState(
        key=key,
        program=jnp.asarray(program, jnp.int32),
        cursor=table.n_ops[program] - 1,
        steps=jnp.int32(0),
        phase=jnp.zeros(MAX_OPS, jnp.int32),
        n_tiles=jnp.zeros(MAX_OPS, jnp.int32),
        extents=extents,
        alive=valid,
        order=jnp.where(valid, positions[None, :], -1),
        parallel_sizes=jnp.zeros((MAX_OPS, MAX_LOOPS), jnp.int32),
        tile_sizes=jnp.zeros((MAX_OPS, MAX_TILE_LEVELS, MAX_LOOPS), jnp.int32),
        fused_into=jnp.full(MAX_OPS, -1, jnp.int32),
        did_fuse=jnp.zeros(MAX_OPS, bool),
        interchanged=jnp.zeros(MAX_OPS, bool),
        decomposed=jnp.zeros(MAX_OPS, bool),
        vectorized=jnp.zeros(MAX_OPS, bool),
        ragged=jnp.zeros(MAX_OPS, bool),
        packed=jnp.zeros(MAX_OPS, bool),
        ix_count=jnp.int32(0),
        ix_order=jnp.full(MAX_LOOPS, -1, jnp.int32),
        base_log_time=jnp.float32(0.0),
        log_time=jnp.float32(0.0),
    )
