"""The features the agent observes and the surrogate reads: values checked by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cost_model.dataset import padded_actions
from mlirrl_jax.env.features import (
    LOCALITY_FEATURES,
    MAX_OPERANDS,
    N_LEVELS,
    features,
    level_extents,
    locality_features,
    stride_features,
)
from mlirrl_jax.env.jax_env import run_actions
from mlirrl_jax.env.state import encode_programs
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import parse_program
from mlirrl_jax.schedule import Schedule
from tests.test_jax_env import SPECS, random_episodes

M, N, K = 64, 96, 128


@pytest.fixture(scope="module")
def matmul():
    spec = g.MatmulSpec(M, N, K)
    return parse_program(g.render(spec), spec.name)


def _state(program, schedule: dict):
    table = encode_programs([program])
    actions = padded_actions(program, Schedule.from_json({"format": 1, "ops": schedule}))
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
    # innermost live loop: n (16 wide, contiguous in B and C), then m (k has extent 1)
    inner = f[N_LEVELS * (MAX_OPERANDS + 2) + 1 :]
    width = 5 * MAX_OPERANDS + 2
    one_hot = inner[: 3 * MAX_OPERANDS].reshape(MAX_OPERANDS, 3) / 32
    assert one_hot[:3].argmax(1).tolist() == [0, 2, 2]  # A unused, B and C contiguous
    assert inner[width - 1] == pytest.approx(np.log2(16) * 2)  # extent, scaled /16
    assert inner[2 * width - 1] == pytest.approx(np.log2(8) * 2)
    lanes = inner[2 * width + 1 : 2 * width + 1 + MAX_OPERANDS] / 2
    assert lanes[:3] == pytest.approx([0.0, 4.0, 4.0])  # k is 1 for A: no contiguous lanes


def test_features_are_finite_and_bounded_on_random_episodes():
    programs = [parse_program(g.render(s), s.name) for s in SPECS]
    table = encode_programs(programs)
    feats = jax.jit(features)
    levels = jax.jit(level_extents)
    for _, states, _ in random_episodes(programs, table, 20, seed=11):
        for state in states[:: max(1, len(states) // 4)] + [states[-1]]:
            f = feats(table, state)
            for array in (f.op_features, f.loop_features):
                assert np.all(np.isfinite(array)) and np.abs(np.asarray(array)).max() <= 2.0
            ext = np.asarray(levels(table, state))
            valid = np.asarray(table.loop_valid[state.program])
            assert np.all(np.diff(ext, axis=0)[:, valid] <= 0)  # tiles only shrink
            assert np.array_equal(ext[-1][valid], np.asarray(state.extents)[valid])
    assert LOCALITY_FEATURES == np.asarray(locality_features(table, states[-1])).shape[1]
