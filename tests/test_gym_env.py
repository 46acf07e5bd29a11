"""The real (Gymnasium) environment: API conformance, real rewards, replayable records."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from mlirrl_jax.actions import NEXT, TILE, VECTORIZE, encode_action, tile_candidates
from mlirrl_jax.env.gym_env import EpisodeRecord, MlirRlEnv
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import parse_program

QUICK = TimingMethod(min_repeats=3, min_time_s=0.01)


@pytest.fixture(scope="module")
def env():
    programs = [
        parse_program(g.render(g.MatmulSpec(32, 64, 48)), "mm"),
        parse_program(g.render(g.ElementwiseSpec("relu", (16, 64))), "relu"),
    ]
    environment = MlirRlEnv(programs, method=QUICK)
    yield environment
    environment.close()


def test_gymnasium_env_checker_passes(env):
    check_env(env, skip_render_check=True)


def test_vectorized_matmul_earns_a_real_positive_reward(env):
    env.reset(options={"program": "mm"})
    tiles = [
        tile_candidates(32).index(8),
        tile_candidates(64).index(32),
        tile_candidates(48).index(1),
    ]
    _, reward, terminated, _, info = env.step(encode_action(TILE, tiles=tiles))
    assert not terminated and reward == 0.0
    _, reward, terminated, _, info = env.step(encode_action(VECTORIZE))
    assert not terminated  # the fill comes next
    _, reward, terminated, _, info = env.step(encode_action(NEXT))
    assert terminated
    assert info["measurement"]["status"] == "ok" and info["measurement"]["verified"]
    assert reward > np.log(2)  # vectorized: much faster than the naive loops
    assert "tile" in str(info["schedule"])


def test_records_replay_to_the_same_schedule(env):
    env.reset(seed=5)
    terminated = False
    while not terminated:  # unmasked random actions: the env replaces what the masks forbid
        _, reward, terminated, _, info = env.step(env.action_space.sample())
    record = EpisodeRecord.loads(info["record"].dumps())
    again = env.replay_record(record)
    assert again.schedule_hash == record.schedule_hash and again.reward == record.reward


def test_unknown_program_is_a_clear_error(env):
    with pytest.raises(ValueError, match="unknown program"):
        env.reset(options={"program": "nope"})
