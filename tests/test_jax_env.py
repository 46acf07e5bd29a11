"""The jitted environment: traced once, vmap/scan, masks, rewards, and replay equality."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlirrl_jax.actions import (
    INTERCHANGE,
    NEXT,
    TILE,
    VECTORIZE,
    encode_action,
    tile_candidates,
)
from mlirrl_jax.env.jax_env import JaxEnv, action_mask, sample_action
from mlirrl_jax.env.replay import CONTENT_FIELDS, HostState, replay, schedule_to_actions
from mlirrl_jax.env.state import EncodingError, encode_programs
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import parse_program

SPECS = [
    g.MatmulSpec(64, 96, 128),
    g.MatmulBiasReluSpec(32, 64, 48),
    g.ConvBiasReluSpec(1, 10, 10, 8, 16, 3),
    g.Conv2dSpec("nchw", 1, 11, 11, 8, 16, 3, stride=2),
    g.DepthwiseSpec(1, 14, 14, 32, 3),
    g.PoolSpec("avg", 1, 9, 9, 16, 3, stride=2),
    g.SoftmaxSpec("full", 16, 64),
    g.ContractionSpec("su3_mul", (4, 8)),
    g.ContractionSpec("spin_color_trace", (4, 4, 4, 4)),
    g.BatchMatmulSpec(2, 16, 32, 24),
]


@pytest.fixture(scope="module")
def programs():
    return [parse_program(g.render(s), s.name) for s in SPECS]


@pytest.fixture(scope="module")
def table(programs):
    return encode_programs(programs)


def run_episode(env, table, program_index, key, steps_fn):
    state, timestep = env.reset_to(table, jnp.int32(program_index), key)
    states, actions = [state], []
    while not bool(state.done):
        key, sub = jax.random.split(key)
        state, timestep = steps_fn(state, sample_action(sub, timestep.observation.mask))
        assert not bool(timestep.invalid_action)
        states.append(state)
        actions.append(np.asarray(timestep.applied_action))
    return states, actions, timestep


def test_step_is_traced_once(table):
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(table.n_programs)
    traced = jax.jit(chex.assert_max_traces(env.step, n=1))
    state, timestep = env.reset_to(table, jnp.int32(0), jax.random.PRNGKey(0))
    for i in range(12):
        action = sample_action(jax.random.PRNGKey(i), timestep.observation.mask)
        state, timestep = traced(table, pool, state, action)
    other, _ = env.reset_to(table, jnp.int32(3), jax.random.PRNGKey(1))
    traced(table, pool, other, encode_action(NEXT))  # another program: no retrace


def random_episodes(programs, table, n, seed):
    """(program index, states, applied actions) of `n` random masked episodes, round-robin."""
    env = JaxEnv(auto_reset=False)
    step = jax.jit(env.step)
    pool = jnp.arange(len(programs))
    key = jax.random.PRNGKey(seed)
    for episode in range(n):
        key, sub = jax.random.split(key)
        index = episode % len(programs)
        states, actions, _ = run_episode(
            env, table, index, sub, lambda s, a: step(table, pool, s, a)
        )
        yield index, states, actions


def test_replay_reaches_the_jax_state_at_every_step(programs, table):
    for index, states, actions in random_episodes(programs, table, 30, seed=7):
        for t in range(1, len(states)):
            _, host = replay(programs[index], actions[:t])
            assert host.differences(HostState.from_env_state(states[t])) == [], (index, t)


def test_schedule_round_trips_through_actions(programs, table):
    for index, _, actions in random_episodes(programs, table, 20, seed=3):
        schedule, host = replay(programs[index], actions)
        again, host_again = replay(programs[index], schedule_to_actions(programs[index], schedule))
        assert again == schedule
        assert host_again.differences(host, CONTENT_FIELDS) == []


def test_vmap_and_scan_rollout_each_env_its_own_program(table):
    env = JaxEnv()
    pool = jnp.arange(table.n_programs)
    n_envs, n_steps = 16, 40

    @jax.jit
    def rollout(key):
        states, timesteps = jax.vmap(env.reset, in_axes=(0, None, None))(
            jax.random.split(key, n_envs), table, pool
        )

        def body(carry, step_key):
            states, timesteps = carry
            actions = jax.vmap(sample_action)(
                jax.random.split(step_key, n_envs), timesteps.observation.mask
            )
            states, timesteps = jax.vmap(env.step, in_axes=(None, None, 0, 0))(
                table, pool, states, actions
            )
            return (states, timesteps), (
                timesteps.reward,
                timesteps.done,
                states.program,
                timesteps.invalid_action,
            )

        _, out = jax.lax.scan(body, (states, timesteps), jax.random.split(key, n_steps))
        return out

    rewards, dones, program_ids, invalid = rollout(jax.random.PRNGKey(0))
    assert rewards.shape == (n_steps, n_envs) and bool(jnp.all(jnp.isfinite(rewards)))
    assert int(dones.sum()) > n_envs  # episodes end and restart
    assert len(np.unique(np.asarray(program_ids))) > 3
    assert not bool(invalid.any())
    # rewards are paid only when an episode ends (no shaping)
    assert bool(jnp.all(jnp.where(dones, True, rewards == 0)))


def test_shaped_rewards_sum_to_the_terminal_log_speedup(table):
    env = JaxEnv(shaping=True, auto_reset=False)
    pool = jnp.arange(table.n_programs)
    step = jax.jit(env.step)
    total, key = 0.0, jax.random.PRNGKey(11)
    state, timestep = env.reset_to(table, jnp.int32(0), key)
    while not bool(state.done):
        key, sub = jax.random.split(key)
        state, timestep = step(table, pool, state, sample_action(sub, timestep.observation.mask))
        total += float(timestep.reward)
    assert total == pytest.approx(float(timestep.log_speedup), abs=1e-4)


def test_masks_follow_the_grammar(programs, table):
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(table.n_programs)
    # matmul: op 1 (the matmul) comes first; its tile choices are divisors of the extents
    state, timestep = env.reset_to(table, jnp.int32(0), jax.random.PRNGKey(0))
    mask = timestep.observation.mask
    assert int(state.cursor) == 1
    assert not bool(mask.kind[VECTORIZE])  # 64x96x128 is too big to vectorize whole
    assert not bool(mask.parallel_tile[2, 1:].any())  # the reduction loop is not parallel
    offered = tile_candidates(96)
    assert [bool(m) for m in mask.tile[1]] == [True] + [s > 0 for s in offered[1:]]
    choices = [tile_candidates(64).index(8), offered.index(32), tile_candidates(128).index(1)]
    state, timestep = env.step(table, pool, state, encode_action(TILE, tiles=choices))
    assert bool(timestep.observation.mask.kind[VECTORIZE])
    assert not bool(timestep.observation.mask.kind[INTERCHANGE])  # after tiling: too late
    state, timestep = env.step(table, pool, state, encode_action(VECTORIZE))
    assert int(state.cursor) == 0  # vectorizing ends the op
    # convolutions: decompose only once the window row and output row are tiled to 1
    conv = 3
    state, timestep = env.reset_to(table, jnp.int32(conv), jax.random.PRNGKey(0))
    assert not bool(timestep.observation.mask.kind[VECTORIZE])


def test_invalid_actions_are_replaced_and_flagged(table):
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(table.n_programs)
    state, _ = env.reset_to(table, jnp.int32(0), jax.random.PRNGKey(0))
    new, timestep = env.step(table, pool, state, encode_action(VECTORIZE))
    assert bool(timestep.invalid_action)
    assert int(timestep.applied_action[0]) == NEXT and int(new.cursor) == 0


def test_masks_agree_with_observation(table):
    env = JaxEnv(auto_reset=False)
    state, timestep = env.reset_to(table, jnp.int32(2), jax.random.PRNGKey(0))
    direct = action_mask(table, state)
    assert bool(jnp.all(direct.kind == timestep.observation.mask.kind))


def test_programs_too_large_for_the_table_are_refused():
    big = parse_program(g.render(g.SoftmaxSpec("full", 16, 64)), "s")
    big.ops = big.ops * 3
    with pytest.raises(EncodingError, match="ops"):
        encode_programs([big])


def test_specs_declare_every_shape(table):
    env = JaxEnv()
    spec = env.observation_spec(table)
    _, timestep = env.reset_to(table, jnp.int32(0), jax.random.PRNGKey(0))
    actual = jax.tree.map(lambda a: (a.shape, a.dtype), timestep.observation)
    declared = jax.tree.map(lambda a: (a.shape, a.dtype), spec)
    assert actual == declared
    assert env.action_spec()["action"].shape == timestep.applied_action.shape
