"""The features the agent observes and the surrogate reads: values checked by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlirrl_jax.env.features import (
    LOCALITY_FEATURES,
    MAX_OPERANDS,
    N_LEVELS,
    N_NEST,
    NEST_LOOP_FEATURES,
    features,
    level_extents,
    locality_features,
    stride_features,
)
from mlirrl_jax.env.jax_env import run_actions
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import parse_program
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.surrogate.dataset import padded_actions
from tests.test_jax_env import random_episodes

M, N, K = 64, 96, 128


@pytest.fixture(scope="module")
def matmul():
    spec = g.MatmulSpec(M, N, K)
    return parse_program(g.render(spec), spec.name)


def _state(program, schedule: dict, lanes: int = 8):
    table = encode_programs([program], lanes)  # vectors of `lanes` f32, whatever this machine
    actions = padded_actions(program, Schedule.from_json({"format": 1, "ops": schedule}), lanes)
    return table, run_actions(table, jnp.int32(0), jnp.asarray(actions))


def test_strides_are_the_bytes_one_loop_step_moves(matmul):
    op = next(o for o in matmul.ops if o.kind == "matmul")
    stride = np.asarray(encode_programs([matmul]).stride[0, op.id])
    # operands A (m, k), B (k, n), C (m, n); loops m, n, k; f32
    assert stride[0, :3].tolist() == [K * 4, 0, 4]
    assert stride[1, :3].tolist() == [0, 4, N * 4]
    assert stride[2, :3].tolist() == [N * 4, 4, 0]
    log2, aligned = np.asarray(stride_features(jnp.array([0.0, 4.0, 384.0, 4096.0]))).T
    assert log2.tolist() == pytest.approx([0, 2 / 32, np.log2(384) / 32, 12 / 32])
    assert aligned.tolist() == pytest.approx([0, 2 / 16, 7 / 16, 12 / 16])


def test_levels_and_footprints_of_a_tiled_matmul(matmul):
    op = next(o for o in matmul.ops if o.kind == "matmul").id
    table, state = _state(
        matmul,
        [
            {
                "op": op,
                "transforms": [
                    {"kind": "tile_parallel", "sizes": [32, 32, 0]},
                    {"kind": "interchange", "permutation": [0, 2, 1]},
                    {"kind": "tile", "sizes": [8, 16, 1]},
                    {"kind": "vectorize"},
                ],
            }
        ],
    )
    levels = np.asarray(level_extents(table, state))[:, op, :3]
    assert levels.tolist() == [[M, N, K], [32, 32, K], [8, 16, 1], [8, 16, 1]]
    assert np.array_equal(levels[-1], np.asarray(state.extents)[op, :3])
    f = np.asarray(locality_features(table, state))[op] * 32
    footprint = f[: N_LEVELS * MAX_OPERANDS].reshape(N_LEVELS, MAX_OPERANDS)
    # bytes of A, B, C one tile touches at each level, log2
    expected = np.log2(
        [
            [M * K * 4, K * N * 4, M * N * 4],
            [32 * K * 4, K * 32 * 4, 32 * 32 * 4],
            [8 * 1 * 4, 1 * 16 * 4, 8 * 16 * 4],
            [8 * 1 * 4, 1 * 16 * 4, 8 * 16 * 4],
        ]
    )
    assert footprint[:, :3] == pytest.approx(expected, abs=1e-4)
    assert np.all(footprint[:, 3] == 0)  # no fourth operand
    trips = f[N_LEVELS * (MAX_OPERANDS + 1) : N_LEVELS * (MAX_OPERANDS + 2) + 1]
    tiles_per_level = [np.log2(M * N * K), np.log2(2 * 3), np.log2(4 * 2 * K), 0.0]
    assert trips.tolist() == pytest.approx([*tiles_per_level, np.log2(8 * 6 * K)], abs=1e-4)
    lanes = f[N_LEVELS * (MAX_OPERANDS + 2) + 1 :][:MAX_OPERANDS] / 2
    assert lanes[:3] == pytest.approx([0.0, 4.0, 4.0])  # k is 1 for A: no contiguous lanes


def _nest(table, state, op):
    """The nest part of an op's locality features, unscaled: (loops, working sets) with a row
    per nest loop, innermost first."""
    f = np.asarray(locality_features(table, state))[op]
    start = N_LEVELS * (MAX_OPERANDS + 2) + 1 + 3 * MAX_OPERANDS
    loops = f[start : start + N_NEST * NEST_LOOP_FEATURES].reshape(N_NEST, NEST_LOOP_FEATURES)
    sets = f[start + N_NEST * NEST_LOOP_FEATURES :][: N_NEST * (MAX_OPERANDS + 1)]
    return loops, sets.reshape(N_NEST, MAX_OPERANDS + 1) * 32


def _nest_loop(row):
    """(level, log2 trips, reduction, access code per operand, log2 bytes a step moves)."""
    level = int(row[:N_LEVELS].argmax()) if row[:N_LEVELS].any() else -1
    rest = row[N_LEVELS:]
    strided, contiguous = rest[2 : 2 + MAX_OPERANDS], rest[2 + MAX_OPERANDS : 2 + 2 * MAX_OPERANDS]
    code = (strided + 2 * contiguous).astype(int)[:3].tolist()
    return level, rest[0] * 16, bool(rest[1]), code, (rest[-MAX_OPERANDS:] * 32)[:3].tolist()


TILED = [
    {"kind": "tile_parallel", "sizes": [32, 32, 0]},
    {"kind": "interchange", "permutation": [0, 2, 1]},
    {"kind": "tile", "sizes": [8, 16, 1]},
]


def test_nest_loops_and_working_sets_of_a_tiled_interchanged_matmul(matmul):
    op = next(o for o in matmul.ops if o.kind == "matmul").id
    table, state = _state(matmul, [{"op": op, "transforms": TILED}])
    loops, sets = _nest(table, state, op)
    # the nest: forall (m, n) / tile loops (m, k, n) / point loops (m, n); k's tile is 1 wide.
    # Innermost first: point n, point m, tile n (32 in steps of 16), tile k (128 in steps of 1)
    point, tile = N_LEVELS - 1, 1
    expected = [
        (point, 4.0, False, [0, 2, 2], [0.0, 2.0, 2.0]),
        (point, 3.0, False, [1, 0, 1], [np.log2(K * 4), 0.0, np.log2(N * 4)]),
        (tile, 1.0, False, [0, 2, 2], [0.0, 6.0, 6.0]),
        (tile, 7.0, True, [2, 1, 0], [2.0, np.log2(N * 4), 0.0]),
    ]
    for row, (level, trips, reduction, code, moved) in zip(loops, expected, strict=True):
        got = _nest_loop(row)
        assert got[:4] == (level, pytest.approx(trips), reduction, code)
        assert got[4] == pytest.approx(moved, abs=1e-5)
    # bytes of A, B, C the innermost 1..4 loops touch (strided walks in whole 64-byte lines)
    touched = np.log2(
        [
            [4, 16 * 4, 16 * 4],  # one element of A; 16 of B and C
            [8 * 64, 16 * 4, 8 * 64],  # 8 rows of A and C: a line each
            [8 * 64, 32 * 4, 8 * 32 * 4],
            [8 * 128 * 4, 128 * 32 * 4, 8 * 32 * 4],
        ]
    )
    assert sets[:, :3] == pytest.approx(touched, abs=1e-4)
    assert np.all(sets[:, 3] == 0)  # no fourth operand
    assert sets[:, 4] == pytest.approx(np.log2(np.exp2(touched).sum(1) + 1), abs=1e-4)


def test_a_vectorized_tile_is_one_operation_of_the_nest(matmul):
    op = next(o for o in matmul.ops if o.kind == "matmul").id
    table, state = _state(matmul, [{"op": op, "transforms": [*TILED, {"kind": "vectorize"}]}])
    loops, sets = _nest(table, state, op)
    # no point loops: the innermost are the tile loops n, k, m, then the forall loop n
    levels = [_nest_loop(row)[:2] for row in loops]
    assert levels == [
        (1, pytest.approx(1.0)),
        (1, pytest.approx(7.0)),
        (1, pytest.approx(2.0)),
        (0, pytest.approx(np.log2(3))),
    ]
    # the working sets start from the 8 x 1 x 16 vector tile
    assert sets[0, :3] == pytest.approx(np.log2([8 * 64, 32 * 4, 8 * 32 * 4]), abs=1e-4)
    code = np.asarray(locality_features(table, state))[op, -(3 * MAX_OPERANDS + 1) :] * 16
    elements, transfers, run = code[:-1].reshape(3, MAX_OPERANDS)[:, :3]
    assert elements == pytest.approx(np.log2([8, 16, 8 * 16]))  # A 8x1, B 1x16, C 8x16
    assert transfers == pytest.approx(np.log2([8, 1, 8]))  # A's rows are one element long
    assert run == pytest.approx(np.log2([1, 16, 16]))
    assert code[-1] == pytest.approx(np.log2(1 + 2 + 16 + 1))  # 8-lane registers, log2(n + 1)
    table16, state16 = _state(
        matmul, [{"op": op, "transforms": [*TILED, {"kind": "vectorize"}]}], lanes=16
    )
    code16 = np.asarray(locality_features(table16, state16))[op, -(3 * MAX_OPERANDS + 1) :] * 16
    assert code16[-1] == pytest.approx(np.log2(1 + 1 + 8 + 1))  # on a machine of 16 lanes
    unvectorized = _state(matmul, [{"op": op, "transforms": TILED}])[1]
    assert not np.asarray(locality_features(table, unvectorized))[op, -13:].any()


def test_features_are_finite_and_bounded_on_random_episodes(kernel_programs, kernel_table):
    programs, table = kernel_programs, kernel_table
    feats = jax.jit(features)
    levels = jax.jit(level_extents)
    for _, states, _ in random_episodes(programs, table, len(programs), seed=11):
        for state in states[:: max(1, len(states) // 4)] + [states[-1]]:
            f = feats(table, state)
            for array in (f.op_features, f.loop_features):
                assert np.all(np.isfinite(array)) and np.abs(np.asarray(array)).max() <= 2.0
            ext = np.asarray(levels(table, state))
            valid = np.asarray(table.loop_valid[state.program])
            assert np.all(np.diff(ext, axis=0)[:, valid] <= 0)  # tiles only shrink
            assert np.array_equal(ext[-1][valid], np.asarray(state.extents)[valid])
            # every loop the nest features name exists: more than one trip (decomposed ops
            # included, whose loop order lost two loops)
            for op in np.flatnonzero(np.asarray(table.op_valid[state.program])):
                for row in _nest(table, state, op)[0]:
                    assert not row[:N_LEVELS].any() or row[N_LEVELS] > 0
    assert LOCALITY_FEATURES == np.asarray(locality_features(table, states[-1])).shape[1]


def test_partial_vectors_partial_tiles_and_packing_are_features():
    from mlirrl_jax.env.features import STATIC_OP_FEATURES
    from mlirrl_jax.env.replay import state_of_schedule

    program = parse_program(g.render(g.MatmulSpec(M, N, K)), "matmul_v4")
    table = encode_programs([program], lanes=8)
    op = next(o for o in program.ops if o.kind == "matmul").id

    def of(steps):
        schedule = Schedule.from_json({"format": 1, "ops": [{"op": op, "transforms": steps}]})
        state = state_of_schedule(program, schedule).to_env_state(0)
        f = features(table, state).op_features[op]
        flags = np.asarray(f[STATIC_OP_FEATURES + 9 : STATIC_OP_FEATURES + 11])  # ragged, packed
        local = np.asarray(locality_features(table, state)[op])
        at = N_LEVELS * (MAX_OPERANDS + 2) + 1
        whole = local[at + MAX_OPERANDS :][:3]  # A, B, C
        idle = local[at + 2 * MAX_OPERANDS :][:3]
        return flags.tolist(), whole.tolist(), idle.tolist()

    vectorize = {"kind": "vectorize"}
    # 12 of 96 lanes: one and a half 8-lane vectors, a quarter of the last one idle
    assert of([{"kind": "tile", "sizes": [8, 12, 1]}, vectorize]) == (
        [0.0, 0.0],
        [0.0, 0.0, 0.0],
        pytest.approx([0.875, 0.25, 0.25]),  # A's rows: 1 of 8 lanes
    )
    # 40 does not divide 96: a partial last tile, peeled; 5 whole 8-lane vectors
    flags, whole, idle = of([{"kind": "tile", "sizes": [8, 40, 1]}, vectorize])
    assert flags == [1.0, 0.0] and whole == [0.0, 1.0, 1.0] and idle == [0.875, 0.0, 0.0]
    packed = [{"kind": "tile", "sizes": [0, 32, 64]}, {"kind": "tile", "sizes": [8, 16, 1]}]
    assert of([*packed, {"kind": "pack"}, vectorize])[0] == [0.0, 1.0]
    # on a 16-lane machine the same 8 x 16 tile fills whole vectors; 8 x 24 does not
    wide = encode_programs([program], lanes=16)
    state = state_of_schedule(
        program,
        Schedule.from_json(
            {
                "format": 1,
                "ops": [
                    {"op": op, "transforms": [{"kind": "tile", "sizes": [8, 24, 1]}, vectorize]}
                ],
            }
        ),
    ).to_env_state(0)
    local = np.asarray(locality_features(wide, state)[op])
    at = N_LEVELS * (MAX_OPERANDS + 2) + 1
    assert local[at + 2 * MAX_OPERANDS :][:3].tolist() == pytest.approx([0.9375, 0.25, 0.25])
