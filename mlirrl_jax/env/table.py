"""Programs encoded as a `ProgramTable` (`env.state`): one row per program, padded to the
environment's fixed shapes, with each program's static features computed once."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mlirrl_jax.actions import MAX_LOOPS, MAX_OPS, N_TILE_CHOICES, tile_candidates
from mlirrl_jax.env.features import static_features
from mlirrl_jax.env.state import (
    ARITH_KINDS,
    CONTIGUOUS,
    MACHINE_FIELDS,
    MAX_OPERANDS,
    OP_KINDS,
    STRIDED,
    EncodingError,
    ProgramTable,
    check_fits,
)
from mlirrl_jax.measure.profile import MachineProfile, this_machine_profile
from mlirrl_jax.programs.analysis import decomposable, packable_inputs, vectorizable, window_loops
from mlirrl_jax.programs.ir import Program

_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8}


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
        "decomposable": np.zeros(MAX_OPS, bool),
        "vectorizable": np.zeros(MAX_OPS, bool),
        "vector_lanes": np.int32(lanes),
        "machine": np.array([getattr(machine, f) for f in MACHINE_FIELDS], np.float32),
        "threads": np.int32(threads),
    }
    for op in program.ops:
        i = op.id
        row["op_kind"][i] = OP_KINDS.index(op.kind)
        row["packable"][i] = bool(packable_inputs(op))
        row["decomposable"][i] = decomposable(op)
        row["vectorizable"][i] = vectorizable(op)
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
