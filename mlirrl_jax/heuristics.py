"""A rule-based schedule for any program: the hand-written baseline the agent must beat.

Per op: an optional cache-level tiling, then a register tile whose innermost loop is the one
that walks the output's contiguous dimension (the vector lanes), a few rows of the next output
dimension, every other loop at 1 (and a sliding window's output row and window row at 1, so the
op decomposes to a 1-D convolution), then vectorization.

Version 2 sizes the register tile from this machine's vector width (two vector registers of
lanes, as many rows as half its registers hold) and lets a tile leave a partial last one
(peeled, so every copy vectorizes at static shapes) where no multiple of the vector width
divides the extent. Version 3 is version 2 for every op but the memory-bound
ones (pooling, element-wise), which a register tile only slows down (`bench/memory_bound.py`):
their outermost parallel loop is split over the threads when the op has the work to pay for
starting them, and their rows are vectorized one at a time, except an element-wise op's whose
rows are whole vectors, which LLVM's loop vectorizer handles as well. Version 4
is version 3 but for ops with an input to pack (`packs`: a matmul's B, a convolution's
filter, read by at least `PANEL_REUSE` register tiles of rows): a matmul-like op's cache tile
blocks the lanes loop and the reduction (a panel of at most `PANEL_WIDTH` x `PANEL_DEPTH`),
and B's tile is packed into a contiguous panel per cache tile before the register tile is
vectorized; a convolution keeps version 3's tiles and packs its filter per cache tile before
it decomposes. Version 5 is version 4 but for strided pooling: where the
window walks the vectorized row with a stride, the row is cut to one vector of this machine's
lanes (the last one partial) rather than kept whole. A whole row of a strided window is a
strided vector read as long as the row, and two or more vectors of it ran at 0.60-0.67x
unscheduled code on nchw 3x3/2 max pools where one vector ran at 1.8x (`bench/memory_bound.py
--programs nchw`); on a 3x3/1 pool the whole row was as fast or faster. Version 6 (the
default) is version 5 but for the register tile's rows: the innermost output loop that the
input read along the lanes does not index (`reusing_rows`), so one vector read serves every
row; it differs from version 5 only where the next output loop indexes that input, as in a
contraction over a gathered input (`models.rewrite`). Versions 1 (32 lanes, 8 rows, divisors
only) to 5 stay for comparison.
"""

from __future__ import annotations

import math

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.measure.fingerprint import vector_lanes
from mlirrl_jax.programs.analysis import decomposable, packable_inputs, vectorizable, window_loops
from mlirrl_jax.programs.ir import LinalgOp, Program
from mlirrl_jax.schedule import (
    DECOMPOSE,
    PACK,
    TILE,
    TILE_PARALLEL,
    VECTORIZE,
    Schedule,
    Transform,
)

VERSIONS = (1, 2, 3, 4, 5, 6)
DEFAULT_VERSION = 6
VECTOR_LANES = 32  # version 1: two AVX-512 registers of f32, four of AVX2
ROWS = 8  # version 1: rows of the register tile
CACHE_TILE = 64
MEMORY_BOUND = ("pooling", "elementwise")  # op kinds version 3 schedules as memory-bound
# version 3: a memory-bound op is split over threads from this much work (iteration points x
# body cost, `memory_bound_work`): below it, starting the threads costs more than they save
# (a 7x7x512 max pool ran 1.5x slower on two threads, a 14x14x1024 add 1.6x faster)
SPLIT_WORK = 2**18
TRANSCENDENTAL_COST = 10  # body cost of an exp or another math function, in simple ops
# version 4: a packed B panel is at most this wide (lanes) and deep (reduction), 256 KiB of f32
PANEL_WIDTH = 256
PANEL_DEPTH = 256
PANEL_REUSE = 4  # pack only if this many register tiles of rows read each panel


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


def lanes_tile(extent: int, lanes: int) -> int:
    """The register tile of the vector-lanes loop: whole vectors of `lanes`, two at most; a
    multiple of `lanes` that divides the extent if there is one, else the one (2 or 1 vectors)
    whose partial last tile wastes the least; an extent under one vector stays whole."""
    if extent <= lanes:
        return extent
    widths = [w for w in (2 * lanes, lanes) if w <= extent]
    dividing = [w for w in widths if extent % w == 0]
    if dividing:
        return dividing[0]
    return min(widths, key=lambda w: (math.ceil(extent / w) * w - extent) / w)


def rows_tile(extent: int, rows: int) -> int:
    """The register tile of the rows loop: `rows`, or a divisor of at least half of it, else
    `rows` with a partial last tile; an extent under `rows` stays whole."""
    if extent <= rows:
        return extent
    divisor = largest_divisor(extent, rows)
    return divisor if 2 * divisor >= rows else rows


def machine_tile_shape(machine: dict | None = None) -> tuple[int, int]:
    """(lanes, rows) of version 2's register tile on `machine` (a `machine_fingerprint()`;
    default this one): two vector registers of f32 lanes, and rows so that the accumulators
    fill half the vector registers (32 with AVX-512, 16 before it)."""
    lanes = vector_lanes(machine=machine)
    registers = 32 if lanes >= 16 else 16
    return 2 * lanes, max(1, registers // 2 // 2)


def register_tile(op: LinalgOp, version: int = 3, machine: dict | None = None) -> tuple[int, ...]:
    """Tile sizes (per loop) of the innermost level, the one that gets vectorized."""
    sizes = [1] * op.n_loops
    out_loops = _output_loops(op)
    windows = window_loops(op)
    window_rows = {o for o, _ in windows[:1]}
    candidates = [i for i in out_loops if i not in window_rows]
    if candidates:
        lanes, rows = candidates[-1], candidates[-2] if len(candidates) > 1 else None
        if version >= 6:
            rows = reusing_rows(op, candidates) or rows
        if version == 1:
            sizes[lanes] = largest_divisor(op.loops[lanes].extent, VECTOR_LANES)
            if rows is not None:
                sizes[rows] = largest_divisor(op.loops[rows].extent, ROWS)
        else:
            width, height = machine_tile_shape(machine)
            sizes[lanes] = lanes_tile(op.loops[lanes].extent, width // 2)
            if rows is not None:
                sizes[rows] = rows_tile(op.loops[rows].extent, height)
    return tuple(sizes)


def reusing_rows(op: LinalgOp, candidates: list[int]) -> int | None:
    """Version 6's rows loop: the innermost output loop (but the lanes loop, the last
    candidate) that the input the lanes loop walks contiguously does not index, so that each
    vector read of it serves every row; None if there is no such input or loop (extent 1
    loops do not count). A contraction over a gathered input (`models.rewrite`), `out[n, f,
    oh, ow] += w[f, c, kh, kw] * col[n, c, kh, kw, oh, ow]`, takes rows of `f`, not `oh`: 1.82
    ms against 4.91 ms on ResNet-18's 3x3/2 convolution at 28x28 (bench/results/history.md); for a
    matmul, a batch matmul or a named convolution it picks the loop version 5 picks."""
    lanes = candidates[-1]
    walked = [operand for operand in op.inputs if operand.access and operand.access[-1][lanes] == 1]
    if not walked:
        return None
    indexed = {i for operand in walked for row in operand.access for i, c in enumerate(row) if c}
    for loop in reversed(candidates[:-1]):
        if loop not in indexed and op.loops[loop].extent > 1:
            return loop
    return None


def cache_tile(op: LinalgOp, reg: tuple[int, ...]) -> tuple[int, ...] | None:
    """A cache-level tile of the register-tiled loops, or None if it would change nothing."""
    sizes = [0] * op.n_loops
    for i, r in enumerate(reg):
        extent = op.loops[i].extent
        if r > 1 and extent > CACHE_TILE:
            multiple = largest_divisor(extent // r, CACHE_TILE // r) * r
            sizes[i] = multiple if multiple < extent else 0
    return tuple(sizes) if any(sizes) else None


def packs(op: LinalgOp, reg: tuple[int, ...]) -> bool:
    """Whether version 4 packs the op under register tile `reg`: it has an input to pack
    (`packable_inputs`), the register tile leaves no partial tile, and at least `PANEL_REUSE`
    register tiles of the output loops the packed input does not index read each panel."""
    packed = packable_inputs(op)
    if not packed or any(op.loops[i].extent % r for i, r in enumerate(reg)):
        return False
    indexed = {i for row in op.operands[packed[0]].access for i, c in enumerate(row) if c}
    out_loops = _output_loops(op)
    reuse = math.prod(op.loops[i].extent // reg[i] for i in out_loops if i not in indexed)
    return reuse >= PANEL_REUSE


def panel_tile(op: LinalgOp, reg: tuple[int, ...]) -> tuple[int, ...] | None:
    """Version 4's cache tile of a packable op: the lanes loop blocked to whole register tiles
    (at most `PANEL_WIDTH`), each reduction loop to a divisor of at most `PANEL_DEPTH`, the
    rest whole; None if the op does not pack (`packable_inputs`), the register tile leaves a
    partial tile, or too few rows reuse the panel."""
    if window_loops(op) or not packs(op, reg):
        return None
    lanes = _output_loops(op)[-1]
    sizes = [0] * op.n_loops
    tiles = op.loops[lanes].extent // reg[lanes]
    sizes[lanes] = largest_divisor(tiles, max(1, PANEL_WIDTH // reg[lanes])) * reg[lanes]
    for i, loop in enumerate(op.loops):
        if loop.iterator == "reduction":
            sizes[i] = largest_divisor(loop.extent, PANEL_DEPTH)
    sizes = [s if s < op.loops[i].extent else 0 for i, s in enumerate(sizes)]
    return tuple(sizes)


def within_chunks(tile: tuple[int, ...], split: tuple[int, ...] | None) -> tuple[int, ...]:
    """`tile` with each size that does not divide its loop's per-thread chunk (`split`)
    dropped: packing needs whole tiles in every chunk."""
    if not split:
        return tile
    return tuple(0 if t and s and s % t else t for t, s in zip(tile, split, strict=True))


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


def memory_bound_work(op: LinalgOp) -> float:
    """Iteration points times the body's cost (simple ops 1, exp and math functions
    `TRANSCENDENTAL_COST`, plus the load and store)."""
    counts = op.arith_counts
    cost = (
        1
        + sum(counts.values())
        + (TRANSCENDENTAL_COST - 1) * (counts.get("exp", 0) + counts.get("math", 0))
    )
    return math.prod(loop.extent for loop in op.loops) * cost


def split_over_threads(op: LinalgOp, threads: int) -> list[Transform]:
    """The outermost parallel loop that splits evenly, cut into one chunk per thread (nothing
    at one thread, or if no loop splits)."""
    sizes = parallel_tile(op, threads, (1,) * op.n_loops) if threads > 1 else None
    return [Transform(TILE_PARALLEL, sizes)] if sizes else []


def row_vectorized(op: LinalgOp, width: int | None = None) -> list[Transform]:
    """Every loop tiled to 1 but the output's contiguous one, kept whole or cut to `width`
    (the last tile partial; whole if the row is no longer), a sliding window decomposed to
    1-D first, then vectorized: one output row (or `width` of it) a vector operation."""
    sizes = [1] * op.n_loops
    row = _output_loops(op)[-1]
    sizes[row] = width if width and op.loops[row].extent > width else 0
    return [Transform(TILE, tuple(sizes)), *vectorized(op)]


def vectorized(op: LinalgOp) -> list[Transform]:
    """The op's tiles vectorized: a 2-D window decomposed first; nothing for an op MLIR cannot
    vectorize (a depthwise NCHW window, a gather: `programs.analysis.vectorizable`), left tiled."""
    if decomposable(op):
        return [Transform(DECOMPOSE), Transform(VECTORIZE)]
    return [Transform(VECTORIZE)] if vectorizable(op) else []


def strided_row(op: LinalgOp) -> bool:
    """Whether an input reads the output's contiguous loop with a stride above 1 (a strided
    window sliding along the row)."""
    row = _output_loops(op)[-1]
    return any(abs(r[row]) > 1 for operand in op.inputs for r in operand.access)


def memory_bound_schedule(
    op: LinalgOp, threads: int = 1, machine: dict | None = None, version: int = DEFAULT_VERSION
) -> list[Transform]:
    """Version 3's transformations of a pooling or element-wise op: split over the threads if
        its work reaches `SPLIT_WORK`; its rows vectorized, except an element-wise op's whose rows
        are whole vectors of this machine (LLVM vectorizes that plain loop as well; a pooling
        window it does not: vectorized rows beat LLVM's loops on pooling on every machine
        measured, `bench/memory_bound.py`). From version 5 a strided pooling row is one vector
    long."""
    steps = split_over_threads(op, threads) if memory_bound_work(op) >= SPLIT_WORK else []
    out_loops = _output_loops(op)
    lanes = vector_lanes(machine=machine)
    whole = out_loops and op.loops[out_loops[-1]].extent % lanes == 0
    if op.kind == "pooling":
        steps += row_vectorized(op, lanes if version >= 5 and strided_row(op) else None)
    elif not whole:
        steps += row_vectorized(op)
    return steps


def op_schedule(
    op: LinalgOp, threads: int = 1, version: int = DEFAULT_VERSION, machine: dict | None = None
) -> list[Transform]:
    """The heuristic transformations of one op."""
    if version >= 3 and op.kind in MEMORY_BOUND:
        return memory_bound_schedule(op, threads, machine, version)
    reg = register_tile(op, version, machine)
    steps = []
    split = parallel_tile(op, threads, reg) if threads > 1 else None
    if split:
        steps.append(Transform(TILE_PARALLEL, split))
    panel = panel_tile(op, reg) if version >= 4 else None
    panel = within_chunks(panel, split) if panel else None
    if panel and any(panel):
        return [
            *steps,
            Transform(TILE, panel),
            Transform(TILE, reg),
            Transform(PACK),
            Transform(VECTORIZE),
        ]
    outer = cache_tile(op, reg)
    pack = version >= 4 and bool(window_loops(op)) and packs(op, reg)
    if pack and outer:
        outer = within_chunks(outer, split)
    if outer and any(outer):
        steps.append(Transform(TILE, outer))
    steps.append(Transform(TILE, reg))
    if pack:  # the filter's tile, packed per cache tile, before the window decomposes
        steps.append(Transform(PACK))
    return [*steps, *vectorized(op)]


def heuristic_schedule(
    program: Program, threads: int = 1, version: int = DEFAULT_VERSION, machine: dict | None = None
) -> Schedule:
    """A schedule for every op but fills, consumers first (`version`: see the module), for
    `machine` (a `machine_fingerprint()`; default this one).

    Fills stay as they are: LLVM already turns the plain fill loop into vector stores, and a
    tiled, vectorized fill costs LLVM ten times the compile time of the matmul it feeds.
    """
    if version not in VERSIONS:
        raise ConfigError(f"heuristic version must be one of {VERSIONS}, got {version!r}")
    per_op = [
        (op.id, op_schedule(op, threads, version, machine))
        for op in reversed(program.ops)
        if op.kind != "fill"
    ]
    return Schedule.of([(op, steps) for op, steps in per_op if steps])
