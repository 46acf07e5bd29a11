"""Fixed-shape arrays for the JAX environment: the program table and the environment state.

A `ProgramTable` holds one row per program padded to MAX_OPS x MAX_LOOPS, so a batch of
environments can each run a different program (`env.table.encode_programs` builds it);
`EnvState` holds one environment's schedule so far. Neither has Python objects. This module
imports no other environment module: features, transitions and the table all build on it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.actions import MAX_LOOPS, MAX_OPS, MAX_TILE_LEVELS
from mlirrl_jax.errors import Error
from mlirrl_jax.programs.ir import Program

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


class EncodingError(Error, ValueError):
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
    packable: jax.Array  # (P, MAX_OPS) bool: `pack` applies (programs.analysis.packable_inputs)
    decomposable: (
        jax.Array
    )  # (P, MAX_OPS) bool: `decompose` applies (programs.analysis.decomposable)
    vectorizable: (
        jax.Array
    )  # (P, MAX_OPS) bool: vectorizes undecomposed (programs.analysis.vectorizable)
    vector_lanes: jax.Array  # (P,) int32: f32 lanes of the vectors the candidates are made for
    machine: jax.Array  # (P, len(MACHINE_FIELDS)) float32: the profile of the machine it runs on
    threads: jax.Array  # (P,) int32: threads per kernel
    static_op: jax.Array | None = None  # (P, MAX_OPS, STATIC_OP_FEATURES) float32
    static_loop: jax.Array | None = None  # (P, MAX_OPS, MAX_LOOPS, STATIC_LOOP_FEATURES) float32
    op_slots: int = struct.field(pytree_node=False, default=MAX_OPS)  # most ops of its programs

    @property
    def n_programs(self) -> int:
        return int(self.n_ops.shape[0])


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
