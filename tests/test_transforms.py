"""Each transformation kind on each op kind it applies to: it compiles and the output is right."""

import pytest

from mlirrl_jax.heuristics import heuristic_schedule, largest_divisor, register_tile
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import Program, parse_program
from mlirrl_jax.schedule import (
    DECOMPOSE,
    INTERCHANGE,
    TILE,
    TILE_FUSE,
    TILE_PARALLEL,
    VECTORIZE,
    Schedule,
    Transform,
)
from mlirrl_jax.transform import window_loops

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
        if window_loops(op):
            steps.append(Transform(DECOMPOSE))
        steps.append(Transform(VECTORIZE))
        per_op.append((op.id, steps))
    return Schedule.of(per_op)


def fused(program: Program) -> Schedule:
    """Tile the last consumer with scf.forall and fuse all its producers into it."""
    last = program.ops[-1]
    sizes = [0] * last.n_loops
    first = next(
        i for i, lp in enumerate(last.loops) if lp.iterator == "parallel" and lp.extent > 1
    )
    sizes[first] = _half(last.loops[first].extent)
    return Schedule.of([(last.id, [Transform(TILE_FUSE, tuple(sizes))])])


VARIANTS = {
    "tile": tiled,
    "tile_parallel": parallel,
    "interchange": interchanged,
    "interchange_vectorize": interchanged_vectorized,
    "tile_fuse": fused,
    "heuristic": heuristic_schedule,
}


@pytest.fixture(scope="module")
def programs():
    return {name: parse_program(g.render(spec), name) for name, spec in SPECS.items()}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", SPECS)
def test_transformation_compiles_and_verifies(runner, programs, name, variant):
    program = programs[name]
    schedule = VARIANTS[variant](program)
    threads = 2 if variant == "tile_parallel" else 1
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
