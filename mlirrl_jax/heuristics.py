"""A rule-based schedule for any program: the hand-written baseline the agent must beat.

Per op: an optional cache-level tiling, then a register tile whose innermost loop is the one
that walks the output's contiguous dimension (the vector lanes), a few rows of the next output
dimension, every other loop at 1 (and a sliding window's output row and window row at 1, so the
op decomposes to a 1-D convolution), then vectorization.
"""

from __future__ import annotations

from mlirrl_jax.programs.ir import LinalgOp, Program
from mlirrl_jax.schedule import DECOMPOSE, TILE, TILE_PARALLEL, VECTORIZE, Schedule, Transform
from mlirrl_jax.transform import window_loops

VECTOR_LANES = 32  # two AVX-512 registers of f32, four of AVX2; the vectorizer splits wider
ROWS = 8  # rows of the register tile: ROWS x VECTOR_LANES accumulators stay in registers
CACHE_TILE = 64


def largest_divisor(extent: int, limit: int) -> int:
    """The largest divisor of `extent` that is at most `limit`."""
    return max(d for d in range(1, min(extent, limit) + 1) if extent % d == 0)


def _output_loops(op: LinalgOp) -> list[int]:
    """Loops indexing the first output's dimensions, outermost dimension first."""
    loops = []
    for row in op.outputs[0].access:
        nonzero = [i for i, c in enumerate(row) if c]
        if len(nonzero) == 1 and op.loops[nonzero[0]].iterator == "parallel":
            loops.append(nonzero[0])
    return loops


def register_tile(op: LinalgOp) -> tuple[int, ...]:
    """Tile sizes (per loop) of the innermost level, the one that gets vectorized."""
    sizes = [1] * op.n_loops
    out_loops = _output_loops(op)
    windows = window_loops(op)
    window_rows = {o for o, _ in windows[:1]}
    candidates = [i for i in out_loops if i not in window_rows]
    if candidates:
        lanes = candidates[-1]
        sizes[lanes] = largest_divisor(op.loops[lanes].extent, VECTOR_LANES)
        if len(candidates) > 1:
            rows = candidates[-2]
            sizes[rows] = largest_divisor(op.loops[rows].extent, ROWS)
    return tuple(sizes)


def cache_tile(op: LinalgOp, reg: tuple[int, ...]) -> tuple[int, ...] | None:
    """A cache-level tile of the register-tiled loops, or None if it would change nothing."""
    sizes = [0] * op.n_loops
    for i, r in enumerate(reg):
        extent = op.loops[i].extent
        if r > 1 and extent > CACHE_TILE:
            multiple = largest_divisor(extent // r, CACHE_TILE // r) * r
            sizes[i] = multiple if multiple < extent else 0
    return tuple(sizes) if any(sizes) else None


def parallel_tile(op: LinalgOp, threads: int, reg: tuple[int, ...]) -> tuple[int, ...] | None:
    """Split the outermost parallel loop that divides into `threads` chunks of whole tiles."""
    for i, loop in enumerate(op.loops):
        if loop.iterator != "parallel":
            continue
        chunk, rest = divmod(loop.extent, threads)
        if rest == 0 and chunk % reg[i] == 0 and chunk >= reg[i]:
            sizes = [0] * op.n_loops
            sizes[i] = chunk
            return tuple(sizes)
    return None


def op_schedule(op: LinalgOp, threads: int = 1) -> list[Transform]:
    """The heuristic transformations of one op."""
    reg = register_tile(op)
    steps = []
    if threads > 1:
        split = parallel_tile(op, threads, reg)
        if split:
            steps.append(Transform(TILE_PARALLEL, split))
    outer = cache_tile(op, reg)
    if outer:
        steps.append(Transform(TILE, outer))
    steps.append(Transform(TILE, reg))
    if window_loops(op):
        steps.append(Transform(DECOMPOSE))
    steps.append(Transform(VECTORIZE))
    return steps


def heuristic_schedule(program: Program, threads: int = 1) -> Schedule:
    """A schedule for every op but fills, consumers first.

    Fills stay as they are: LLVM already turns the plain fill loop into vector stores, and a
    tiled, vectorized fill costs LLVM ten times the compile time of the matmul it feeds.
    """
    return Schedule.of(
        [(op.id, op_schedule(op, threads)) for op in reversed(program.ops) if op.kind != "fill"]
    )
