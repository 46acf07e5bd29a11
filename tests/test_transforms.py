"""Each transformation kind on each op kind it applies to: it compiles and the output is right."""

import pytest

from mlirrl_jax.heuristics import (
    MEMORY_BOUND,
    heuristic_schedule,
    largest_divisor,
    memory_bound_work,
    register_tile,
    row_vectorized,
    split_over_threads,
)
from mlirrl_jax.measure.fingerprint import vector_lanes
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.analysis import packable_inputs, window_loops
from mlirrl_jax.programs.ir import Program, parse_program
from mlirrl_jax.schedule import (
    DECOMPOSE,
    INTERCHANGE,
    PACK,
    TILE,
    TILE_FUSE,
    TILE_PARALLEL,
    VECTORIZE,
    Schedule,
    ScheduleError,
    Transform,
)
from mlirrl_jax.transform import transform_script

QUICK = TimingMethod(min_repeats=1, min_time_s=0.0)

SPECS = {
    "matmul": g.MatmulSpec(32, 64, 48),
    "batch_matmul": g.BatchMatmulSpec(2, 16, 32, 24),
    "conv_nhwc": g.Conv2dSpec("nhwc", 1, 10, 10, 8, 16, 3),
    "conv_nchw_strided": g.Conv2dSpec("nchw", 1, 11, 11, 8, 16, 3, stride=2),
    "conv_dilated": g.Conv2dSpec("nhwc", 1, 12, 12, 8, 16, 3, dilation=2),
    "depthwise": g.DepthwiseSpec(1, 10, 10, 32, 3),
    "pool_max": g.PoolSpec("max", 1, 10, 10, 16, 3),
    "pool_avg": g.PoolSpec("avg", 1, 9, 9, 16, 3, stride=2),
    "add": g.ElementwiseSpec("add", (4, 16, 32)),
    "gelu": g.ElementwiseSpec("gelu", (16, 64)),
    "softmax": g.SoftmaxSpec("full", 16, 64),
    "matmul_bias_relu": g.MatmulBiasReluSpec(32, 64, 48),
    "conv_bias_relu": g.ConvBiasReluSpec(1, 10, 10, 8, 16, 3),
    "contraction": g.ContractionSpec("su3_mul", (4, 8)),
}


def _half(extent: int) -> int:
    return largest_divisor(extent, max(1, extent // 2))


def tiled(program: Program) -> Schedule:
    return Schedule.of(
        [
            (op.id, [Transform(TILE, tuple(_half(e) for e in op.extents))])
            for op in program.ops[::-1]
        ]
    )


def parallel(program: Program) -> Schedule:
    per_op = []
    for op in program.ops[::-1]:
        sizes = [0] * op.n_loops
        first = next(
            i for i, lp in enumerate(op.loops) if lp.iterator == "parallel" and lp.extent > 1
        )
        sizes[first] = _half(op.loops[first].extent)
        per_op.append((op.id, [Transform(TILE_PARALLEL, tuple(sizes))]))
    return Schedule.of(per_op)


def interchanged(program: Program) -> Schedule:
    return Schedule.of(
        [
            (op.id, [Transform(INTERCHANGE, permutation=tuple(reversed(range(op.n_loops))))])
            for op in program.ops[::-1]
            if op.n_loops > 1
        ]
    )


def interchanged_vectorized(program: Program) -> Schedule:
    """Swap the two outermost loops, then tile and vectorize (ops without a sliding window)."""
    per_op = []
    for op in program.ops[::-1]:
        steps = []
        if op.n_loops > 1 and not window_loops(op):
            steps.append(Transform(INTERCHANGE, permutation=(1, 0, *range(2, op.n_loops))))
        steps.append(Transform(TILE, register_tile(op)))
        per_op.append((op.id, _vectorized(op, steps)))
    return Schedule.of(per_op)


def _vectorized(op, steps: list) -> list:
    """`steps`, then decomposition (sliding windows) and vectorization."""
    return [*steps, *([Transform(DECOMPOSE)] if window_loops(op) else []), Transform(VECTORIZE)]


def fused(program: Program) -> Schedule:
    """Tile the last consumer with scf.forall and fuse all its producers into it."""
    last = program.ops[-1]
    sizes = [0] * last.n_loops
    first = next(
        i for i, lp in enumerate(last.loops) if lp.iterator == "parallel" and lp.extent > 1
    )
    sizes[first] = _half(last.loops[first].extent)
    return Schedule.of([(last.id, [Transform(TILE_FUSE, tuple(sizes))])])


def _lanes(op, reg) -> int:
    """The register tile's widest loop (its vector lanes)."""
    return max(range(op.n_loops), key=lambda i: (reg[i], i))


def partial_tiles(program: Program) -> Schedule:
    """Tiles that do not divide their loops, at two levels (the lanes loop at extent - 1,
    then about half of that), so both levels leave partial tiles to peel; then decomposition
    and vectorization at static shapes."""
    per_op = []
    for op in program.ops[::-1]:
        reg = list(register_tile(op, version=1))
        lanes, steps = _lanes(op, reg), []
        extent = op.loops[lanes].extent
        if extent >= 4:
            outer = [0] * op.n_loops
            outer[lanes] = extent - 1
            steps.append(Transform(TILE, tuple(outer)))
            reg[lanes] = (extent - 1) // 2 + 1
        steps.append(Transform(TILE, tuple(reg)))
        per_op.append((op.id, _vectorized(op, steps)))
    return Schedule.of(per_op)


def interchanged_partial(program: Program) -> Schedule:
    """Swap the two outermost loops (the op is generalized), then a partial register tile."""
    per_op = []
    for op in program.ops[::-1]:
        if window_loops(op) or op.n_loops < 2:
            continue
        reg = list(register_tile(op, version=1))
        lanes = _lanes(op, reg)
        if op.loops[lanes].extent >= 3:
            reg[lanes] = op.loops[lanes].extent // 2 + 1
        swap = Transform(INTERCHANGE, permutation=(1, 0, *range(2, op.n_loops)))
        per_op.append((op.id, [swap, Transform(TILE, tuple(reg)), Transform(VECTORIZE)]))
    return Schedule.of(per_op)


def parallel_partial(program: Program) -> Schedule:
    """A forall whose last chunk is partial (not peelable: the op vectorizes masked), for ops
    without a sliding window (their 1-D convolutions do not vectorize masked)."""
    per_op = []
    for op in program.ops[::-1]:
        if window_loops(op):
            continue
        first = next(
            (i for i, lp in enumerate(op.loops) if lp.iterator == "parallel" and lp.extent >= 3),
            None,
        )
        if first is None:
            continue
        split = [0] * op.n_loops
        split[first] = op.loops[first].extent // 2 + 1
        reg = register_tile(op, version=1)
        steps = [Transform(TILE_PARALLEL, tuple(split)), Transform(TILE, reg), Transform(VECTORIZE)]
        per_op.append((op.id, steps))
    return Schedule.of(per_op)


def memory_bound_rows(program: Program) -> Schedule:
    """Version 3's moves for memory-bound ops, unconditionally: split over two threads, then
    one output row a vector operation."""
    return Schedule.of(
        [
            (op.id, [*split_over_threads(op, 2), *row_vectorized(op)])
            for op in reversed(program.ops)
            if op.kind in MEMORY_BOUND
        ]
    )


def _packed_steps(op, extents) -> list:
    """Every loop halved, then a register tile of up to 4 per parallel loop and 1 per
    reduction (a sliding window's output row 1, so that it decomposes), the packable input
    packed, vectorized (divisors only: `pack` needs whole tiles)."""
    outer = tuple(_half(e) for e in extents)
    windows = window_loops(op)
    rows = {o for o, _ in windows[:1]}
    inner = tuple(
        largest_divisor(o, 4) if loop.iterator == "parallel" and i not in rows else 1
        for i, (loop, o) in enumerate(zip(op.loops, outer, strict=True))
    )
    steps = [Transform(TILE, outer), Transform(TILE, inner), Transform(PACK)]
    if windows:
        steps.append(Transform(DECOMPOSE))
    return [*steps, Transform(VECTORIZE)]


def packed(program: Program) -> Schedule:
    return Schedule.of(
        [(op.id, _packed_steps(op, op.extents)) for op in program.ops[::-1] if packable_inputs(op)]
    )


def packed_parallel(program: Program) -> Schedule:
    """The rows split over two threads, then `packed`'s steps inside each chunk."""
    per_op = []
    for op in program.ops[::-1]:
        if not packable_inputs(op):
            continue
        rows = next(
            i for i, e in enumerate(op.extents) if op.loops[i].iterator == "parallel" and e > 1
        )
        split = [0] * op.n_loops
        split[rows] = _half(op.extents[rows])
        extents = [split[i] or e for i, e in enumerate(op.extents)]
        per_op.append(
            (op.id, [Transform(TILE_PARALLEL, tuple(split)), *_packed_steps(op, extents)])
        )
    return Schedule.of(per_op)


VARIANTS = {
    "tile": tiled,
    "tile_parallel": parallel,
    "interchange": interchanged,
    "interchange_vectorize": interchanged_vectorized,
    "tile_fuse": fused,
    "heuristic": heuristic_schedule,
    "heuristic_v1": lambda program: heuristic_schedule(program, version=1),
    "partial_tiles": partial_tiles,
    "interchanged_partial": interchanged_partial,
    "parallel_partial": parallel_partial,
    "memory_bound_rows": memory_bound_rows,
    "pack": packed,
    "pack_parallel": packed_parallel,
}


@pytest.fixture(scope="module")
def programs():
    return {name: parse_program(g.render(spec), name) for name, spec in SPECS.items()}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", SPECS)
def test_transformation_compiles_and_verifies(runner, programs, name, variant):
    program = programs[name]
    schedule = VARIANTS[variant](program)
    threads = (
        2
        if variant in ("tile_parallel", "parallel_partial", "memory_bound_rows", "pack_parallel")
        else 1
    )
    if not schedule.ops:
        pytest.skip(f"{variant} has nothing to do on {name}")
    m = runner.measure(program, schedule, threads=threads, method=QUICK)
    assert m.status == "ok", f"{schedule.describe()}: {m.error}"
    assert m.verified and m.max_error <= m.tolerance


def test_fusion_moves_the_producers_into_the_loop(programs):
    from mlirrl_jax.transform import transform_script

    script = transform_script(programs["matmul_bias_relu"], fused(programs["matmul_bias_relu"]))
    assert script.count("fuse_into_containing_op") == 2  # the matmul, then its fill


def test_long_vectorized_loop_nest_does_not_grow_the_stack(runner):
    # 110 x 55 x 3 x 3 iterations of n-D vector transfers: before transfers were unrolled in
    # the lowering, each iteration took stack space and the kernel crashed
    program = parse_program(g.render(g.DepthwiseSpec(1, 112, 112, 16, 3)), "depthwise_large")
    schedule = Schedule.of(
        {1: [Transform(TILE, (1, 1, 2, 16, 1, 1)), Transform(DECOMPOSE), Transform(VECTORIZE)]}
    )
    m = runner.measure(program, schedule, method=QUICK)
    assert m.status == "ok" and m.verified, m.error


def test_fused_producer_tiles_follow_the_consumer_tile(runner):
    # the consumer's tile makes the fused conv's output row 1 long: it can decompose at once,
    # as the environment's masks allow (the script builder must agree)
    program = parse_program(g.render(g.ConvBiasReluSpec(1, 14, 14, 64, 128, 1)), "conv1x1_chain")
    schedule = Schedule.of(
        [
            (2, [Transform(TILE_FUSE, (0, 1, 0, 0))]),
            (
                1,
                [
                    Transform(TILE, (0, 0, 7, 32, 0, 0, 8)),
                    Transform(DECOMPOSE),
                    Transform(VECTORIZE),
                ],
            ),
        ]
    )
    m = runner.measure(program, schedule, method=QUICK)
    assert m.status == "ok" and m.verified, m.error


def test_a_unit_tile_inside_a_partial_tile_is_not_peeled(runner):
    # the fill of a 1x1 conv: a forall of 7 rows, tiles of 2 (a partial last tile of 1), then
    # tiles of 1 inside them, which have no partial iteration to peel (peeling refuses them)
    program = parse_program(g.render(g.Conv2dSpec("nhwc", 1, 28, 28, 8, 96, 1, stride=2)), "c")
    schedule = Schedule.of(
        [
            (
                0,
                [
                    Transform(TILE_PARALLEL, (0, 7, 7, 0)),
                    Transform(INTERCHANGE, permutation=(2, 0, 3, 1)),
                    Transform(TILE, (0, 2, 0, 64)),
                    Transform(TILE, (0, 1, 0, 0)),
                    Transform(VECTORIZE),
                ],
            )
        ]
    )
    m = runner.measure(program, schedule, method=QUICK)
    assert m.status == "ok" and m.verified, m.error


def test_a_partial_tile_is_peeled_and_vectorizes_at_static_shapes(programs):
    from mlirrl_jax.measure.compile import transformed_mlir
    from mlirrl_jax.transform import transform_script

    matmul = programs["matmul"]  # 32 x 64 x 48
    peeled = Schedule.of([(1, [Transform(TILE, (8, 24, 1)), Transform(VECTORIZE)])])
    script = transform_script(matmul, peeled)
    assert "transform.loop.peel" in script and "vector_sizes" not in script
    code = transformed_mlir(matmul.mlir, script)
    assert "vector.fma" in code and "vector.mask" not in code and "create_mask" not in code
    assert "linalg.matmul" not in code  # both copies (whole tiles and the rest) vectorized
    # a forall's partial chunk cannot be peeled: that op vectorizes masked
    masked = Schedule.of(
        [
            (
                1,
                [
                    Transform(TILE_PARALLEL, (0, 40, 0)),
                    Transform(TILE, (8, 8, 1)),
                    Transform(VECTORIZE),
                ],
            )
        ]
    )
    script = transform_script(matmul, masked)
    assert "vector_sizes [8, 8, 1]" in script
    assert "linalg.matmul" not in transformed_mlir(matmul.mlir, script)


def test_an_interchanged_op_keeps_its_tag_for_its_peeled_copies(programs):
    from mlirrl_jax.measure.compile import transformed_mlir
    from mlirrl_jax.transform import transform_script

    matmul = programs["matmul"]
    schedule = Schedule.of(
        [
            (
                1,
                [
                    Transform(INTERCHANGE, permutation=(0, 2, 1)),
                    Transform(TILE, (8, 24, 1)),
                    Transform(VECTORIZE),
                ],
            )
        ]
    )
    code = transformed_mlir(matmul.mlir, transform_script(matmul, schedule))
    assert "linalg.generic" not in code and "vector.fma" in code


def test_the_heuristic_sizes_its_register_tile_from_the_machine():
    from mlirrl_jax.heuristics import lanes_tile, machine_tile_shape, rows_tile

    avx2 = {"isa_flags": ["avx", "avx2", "fma"]}
    avx512 = {"isa_flags": ["avx", "avx2", "avx512f", "fma"]}
    assert machine_tile_shape(avx2) == (16, 4) and machine_tile_shape(avx512) == (32, 8)
    assert lanes_tile(112, 16) == 16  # a multiple of the vector width that divides
    assert lanes_tile(26, 16) == 16 and lanes_tile(147, 16) == 32  # partial, least waste
    assert lanes_tile(56, 8) == 8 and lanes_tile(7, 16) == 7
    assert rows_tile(28, 8) == 7 and rows_tile(13, 8) == 8 and rows_tile(5, 8) == 5
    conv = parse_program(g.render(g.Conv2dSpec("nchw", 1, 28, 28, 8, 64, 3)), "nchw26")
    op = conv.ops[1]  # loops n, f, oh, ow, c, kh, kw
    assert register_tile(op, machine=avx512) == (1, 8, 1, 16, 1, 1, 1)
    assert register_tile(op, machine=avx2) == (1, 4, 1, 16, 1, 1, 1)  # two AVX2 vectors
    assert register_tile(op, version=1) == (1, 8, 1, 26, 1, 1, 1)
    # version 6 picks the same rows here: the filters' loop does not index the input
    assert register_tile(op, version=6, machine=avx512) == (1, 8, 1, 16, 1, 1, 1)
    with pytest.raises(ValueError, match="version"):
        heuristic_schedule(conv, version=7)


def test_memory_bound_ops_are_split_by_their_work_and_vectorized_by_their_rows():
    avx512 = {"isa_flags": ["avx", "avx2", "avx512f", "fma"]}
    avx2 = {"isa_flags": ["avx", "avx2", "fma"]}

    def kinds(spec, threads, machine):
        program = parse_program(g.render(spec), spec.name)
        schedule = heuristic_schedule(program, threads, machine=machine)
        return [t.kind for o in schedule.ops for t in o.transforms]

    whole_rows = g.ElementwiseSpec("relu", (1, 112, 112, 64))  # 64 lanes: whole vectors
    assert kinds(whole_rows, 1, avx512) == []  # LLVM vectorizes the plain loop
    assert kinds(whole_rows, 2, avx512) == ["tile_parallel"]  # 0.8 M points: worth 2 threads
    ragged = g.ElementwiseSpec("relu", (1, 112, 112, 24))  # 24: 1.5 AVX-512 vectors, 3 AVX2
    assert kinds(ragged, 1, avx512) == ["tile", "vectorize"]
    assert kinds(ragged, 1, avx2) == []
    tiny = g.PoolSpec("max", 1, 14, 14, 40, 2, stride=2)  # little work: one thread
    assert kinds(tiny, 2, avx512) == ["tile", "decompose", "vectorize"]
    pool = g.PoolSpec("max", 1, 56, 56, 64, 2, stride=2)  # a window: rows vectorized anyway
    assert kinds(pool, 1, avx512) == ["tile", "decompose", "vectorize"]
    matmul = parse_program(g.render(g.MatmulSpec(64, 64, 64)), "mm")
    assert heuristic_schedule(matmul, version=3) == heuristic_schedule(matmul, version=2)
    gelu = parse_program(g.render(g.ElementwiseSpec("gelu", (64, 64))), "gelu").ops[-1]
    relu = parse_program(g.render(g.ElementwiseSpec("relu", (64, 64))), "relu").ops[-1]
    assert memory_bound_work(gelu) > 5 * memory_bound_work(relu)  # tanh/exp cost more


def test_a_strided_nchw_pooling_row_is_cut_to_one_vector_and_verifies(runner):
    # a whole row of a strided window is a strided read as long as the row: v4 ran 0.6x
    # unscheduled code on nchw 3x3/2 max pools, v5's one vector 1.8x (bench/memory_bound.py)
    from mlirrl_jax.env.replay import schedule_to_actions

    avx512 = {"isa_flags": ["avx", "avx2", "avx512f", "fma"]}
    spec = g.PoolSpec("max", 2, 57, 57, 8, 3, stride=2, layout="nchw")  # rows of 28
    program = parse_program(g.render(spec), spec.name)
    assert "pooling_nchw_max" in program.mlir and spec.name.endswith("_nchw")
    tile = heuristic_schedule(program, machine=avx512).transforms_of(1)[0]
    assert tile.kind == TILE and tile.sizes == (1, 1, 1, 16, 1, 1)  # n, c, oh, ow, kh, kw
    assert heuristic_schedule(program, version=4, machine=avx512).transforms_of(1)[0].sizes[3] == 0
    unstrided = g.PoolSpec("max", 2, 30, 30, 8, 3, stride=1, layout="nchw")
    whole = parse_program(g.render(unstrided), unstrided.name)
    assert heuristic_schedule(whole, machine=avx512).transforms_of(1)[0].sizes[3] == 0
    nhwc = parse_program(g.render(g.PoolSpec("max", 2, 57, 57, 64, 3, stride=2)), "nhwc")
    assert heuristic_schedule(nhwc, machine=avx512).transforms_of(1)[0].sizes[3] == 0  # c
    schedule = heuristic_schedule(program)  # this machine's lanes: in the action space
    assert schedule_to_actions(program, schedule, lanes=vector_lanes())
    m = runner.measure(program, schedule, method=QUICK)
    assert m.status == "ok" and m.verified, m.error


def test_a_contraction_of_three_tensors_vectorizes_without_aborting(runner):
    # MLIR's reduction_to_contract aborts (an assertion) on a product of three tensors; the
    # cleanup goes without it when the program has one
    from pathlib import Path

    from mlirrl_jax.programs.ir import load_program

    program = load_program(Path(__file__).parents[1] / "examples" / "contraction7.mlir")
    m = runner.measure(program, heuristic_schedule(program), method=QUICK)
    assert m.status == "ok" and m.verified, m.error


def test_a_large_multi_dimensional_forall_is_right_on_two_threads(runner):
    # without libomp, foralls run on MLIR's async runtime, whose parallel-for ran some blocks
    # of a 65 x 65 forall twice (the conv accumulates: outputs doubled); the lowering now
    # collapses each parallel loop to one dimension first
    program = parse_program(g.render(g.Conv2dSpec("nhwc", 1, 67, 67, 4, 8, 3)), "conv65")
    schedule = Schedule.of([(1, [Transform(TILE_PARALLEL, (0, 1, 1, 0, 0, 0, 0))])])
    m = runner.measure(program, schedule, threads=2, method=QUICK)
    assert m.status == "ok" and m.verified, m.error
    if m.runtime == "async":  # parallel loops of different ranks cannot be collapsed together
        chain = parse_program(g.render(g.MatmulBiasReluSpec(16, 32, 8)), "chain")
        mixed = Schedule.of(
            [
                (2, [Transform(TILE_PARALLEL, (8, 0))]),
                (1, [Transform(TILE_PARALLEL, (8, 16, 0))]),
            ]
        )
        m = runner.measure(chain, mixed, threads=2, method=QUICK)
        assert m.status == "compile_error" and "same number" in m.error


def test_pack_copies_b_only_and_refuses_what_it_cannot_pack(programs):
    matmul = programs["matmul"]
    op = matmul.ops[1]
    assert packable_inputs(op) == [1]  # B: the lanes walk it, the rows reuse it; not A
    script = transform_script(matmul, packed(matmul))
    assert "nofold_flags = [0, 1, 0]" in script and "hoist_pad" in script
    conv = next(o for o in programs["conv_nhwc"].ops if o.kind != "fill")
    assert packable_inputs(conv) == [1]  # the filter (hwcf: its rows are the lanes)
    # nchw: the lanes walk the output row, which the filter does not; a pool's window
    # operand has no lanes; an add reads each input once
    for name in ("conv_nchw_strided", "pool_max", "add"):
        assert not any(packable_inputs(o) for o in programs[name].ops), name
    whole = Schedule.of({1: [Transform(PACK)]})
    with pytest.raises(ScheduleError, match="right after a tiling"):
        transform_script(matmul, whole)
    ragged = Schedule.of({1: [Transform(TILE, (0, 24, 0)), Transform(PACK)]})  # 64 = 2 x 24 + 16
    with pytest.raises(ScheduleError, match="whole tiles"):
        transform_script(matmul, ragged)


def test_heuristic_v4_packs_a_large_matmul_and_the_state_records_it():
    from mlirrl_jax.actions import NEXT as NEXT_KIND
    from mlirrl_jax.actions import PACK as PACK_KIND
    from mlirrl_jax.actions import TILE as TILE_KIND
    from mlirrl_jax.env.replay import schedule_of, schedule_to_actions, state_of_schedule

    program = parse_program(g.render(g.MatmulSpec(256, 512, 1024)), "matmul_large")
    v4 = heuristic_schedule(program, version=4)
    steps = v4.transforms_of(1)
    assert [t.kind for t in steps] == [TILE, TILE, PACK, VECTORIZE]
    assert steps[0].sizes[2] and steps[0].sizes[2] <= 256  # the reduction is blocked
    state = state_of_schedule(program, v4)
    assert state.packed[1] and not state.ragged[1]
    assert schedule_of(program, state) == v4
    chosen = Schedule.of(  # tile sizes among the action space's candidates
        {1: [Transform(TILE, (0, 64, 64)), Transform(TILE, (8, 32, 1)), Transform(PACK)]}
    )
    actions = schedule_to_actions(program, chosen, lanes=16)
    assert [int(a[0]) for a in actions] == [TILE_KIND, TILE_KIND, PACK_KIND, NEXT_KIND, NEXT_KIND]
    small = parse_program(g.render(g.MatmulSpec(8, 512, 64)), "matmul_one_row_tile")
    assert all(t.kind != PACK for t in heuristic_schedule(small, version=4).transforms_of(1))
