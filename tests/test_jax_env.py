"""The jitted environment: traced once, batched steps under scan, masks, rewards, truncation,
and replay equality."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlirrl_jax.actions import (
    DECOMPOSE,
    INTERCHANGE,
    N_DIVISOR_CHOICES,
    NEXT,
    TILE,
    VECTORIZE,
    encode_action,
    tile_candidates,
)
from mlirrl_jax.env.jax_env import JaxEnv, action_mask, sample_action
from mlirrl_jax.env.replay import (
    CONTENT_FIELDS,
    HostState,
    replay,
    schedule_of,
    schedule_to_actions,
    state_of_schedule,
)
from mlirrl_jax.env.reward import ShapedReward, evaluate_where
from mlirrl_jax.env.state import EncodingError
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import parse_program


@pytest.fixture(scope="module")
def programs(kernel_programs):
    return kernel_programs


@pytest.fixture(scope="module")
def table(kernel_table):
    return kernel_table


def one(tree):
    """Row 0 of a batch of one."""
    return jax.tree.map(lambda a: a[0], tree)


@functools.cache
def compiled_reset(env):
    """`env.reset_to`, compiled once per environment (dispatching it op by op is slow)."""
    return jax.jit(env.reset_to)


# a random legal action of one environment's mask, compiled once
random_action = jax.jit(sample_action)


def start(env, table, program_index, key, params=None):
    """A batch of one episode on `program_index` (the reward's parameters prepared)."""
    params = params if params is not None else env.reward.prepare(None, table)
    programs = jnp.array([program_index], jnp.int32)
    state, timestep = compiled_reset(env)(params, table, programs, key[None])
    return params, state, timestep


def run_episode(env, table, program_index, key, steps_fn):
    params, state, timestep = start(env, table, program_index, key)
    states, actions = [one(state)], []
    while not bool(state.done[0]):
        key, sub = jax.random.split(key)
        action = random_action(sub, one(timestep.observation.mask))
        state, timestep = steps_fn(params, state, action[None])
        assert not bool(timestep.invalid_action[0])
        states.append(one(state))
        actions.append(np.asarray(timestep.applied_action[0]))
    return states, actions, timestep


def test_step_is_traced_once(table):
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(table.n_programs)
    traced = jax.jit(chex.assert_max_traces(env.step, n=1))
    params, state, timestep = start(env, table, 0, jax.random.PRNGKey(0))
    for i in range(12):
        action = sample_action(jax.random.PRNGKey(i), one(timestep.observation.mask))
        state, timestep = traced(params, table, pool, state, action[None])
    _, other, _ = start(env, table, 3, jax.random.PRNGKey(1), params)
    traced(params, table, pool, other, encode_action(NEXT)[None])  # another program
    doubled = params.replace(base_log_time=params.base_log_time * 2)
    traced(doubled, table, pool, other, encode_action(NEXT)[None])  # new reward parameters


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
            env, table, index, sub, lambda p, s, a: step(p, table, pool, s, a)
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


def test_a_whole_schedule_and_its_actions_reach_the_same_state(programs, table):
    for index, _, actions in random_episodes(programs, table, 20, seed=5):
        schedule, host = replay(programs[index], actions)
        direct = state_of_schedule(programs[index], schedule)
        assert direct.differences(host, CONTENT_FIELDS) == [], index
        assert direct.cursor == -1


def test_batched_steps_under_scan_each_env_its_own_program(table):
    env = JaxEnv()
    pool = jnp.arange(table.n_programs)
    n_envs, n_steps = 16, 40

    @jax.jit
    def rollout(key):
        params = env.reward.prepare(None, table)
        states, timesteps = env.reset(params, table, pool, jax.random.split(key, n_envs))

        def body(carry, step_key):
            states, timesteps = carry
            actions = jax.vmap(sample_action)(
                jax.random.split(step_key, n_envs), timesteps.observation.mask
            )
            states, timesteps = env.step(params, table, pool, states, actions)
            return (states, timesteps), (
                timesteps.reward,
                timesteps.done,
                timesteps.discount,
                states.program,
                timesteps.invalid_action,
            )

        _, out = jax.lax.scan(body, (states, timesteps), jax.random.split(key, n_steps))
        return out

    rewards, dones, discounts, program_ids, invalid = rollout(jax.random.PRNGKey(0))
    assert rewards.shape == (n_steps, n_envs) and bool(jnp.all(jnp.isfinite(rewards)))
    assert int(dones.sum()) > n_envs  # episodes end and restart
    assert len(np.unique(np.asarray(program_ids))) > 3
    assert not bool(invalid.any())
    # rewards are paid only when an episode ends (terminal reward), which is not discounted on
    assert bool(jnp.all(jnp.where(dones, True, rewards == 0)))
    assert bool(jnp.all(discounts == jnp.where(dones, 0.0, 1.0)))


def test_shaped_rewards_sum_to_the_terminal_log_speedup(table):
    shaped = JaxEnv(reward=ShapedReward(), auto_reset=False)
    terminal = JaxEnv(auto_reset=False)
    pool = jnp.arange(table.n_programs)
    steps = [jax.jit(env.step) for env in (shaped, terminal)]
    totals, key = [0.0, 0.0], jax.random.PRNGKey(11)
    runs = [start(env, table, 0, key) for env in (shaped, terminal)]
    while not bool(runs[0][1].done[0]):
        key, sub = jax.random.split(key)
        action = sample_action(sub, one(runs[0][2].observation.mask))[None]
        for i, (params, state, _) in enumerate(runs):
            state, timestep = steps[i](params, table, pool, state, action)
            runs[i] = (params, state, timestep)
            totals[i] += float(timestep.reward[0])
    assert totals[0] == pytest.approx(float(runs[0][2].log_speedup[0]), abs=1e-4)
    assert totals[0] == pytest.approx(totals[1], abs=1e-4)  # the same return either way


def test_an_episode_cut_at_the_step_limit_is_truncated_not_terminated(table):
    env = JaxEnv(max_steps=2, auto_reset=False)
    pool = jnp.arange(table.n_programs)
    params, state, timestep = start(env, table, 0, jax.random.PRNGKey(0))
    tile = encode_action(TILE, tiles=[1, 1, 1])[None]  # the matmul: no step ends its op
    state, first = env.step(params, table, pool, state, tile)
    state, second = env.step(params, table, pool, state, encode_action(INTERCHANGE)[None])
    assert not bool(first.done[0]) and bool(second.done[0]) and bool(second.truncated[0])
    # no terminal reward, and the discount says the episode did not terminate
    assert float(second.reward[0]) == 0.0 and float(second.discount[0]) == 1.0
    assert bool(state.done[0])  # nothing more happens in it
    _, after = env.step(params, table, pool, state, encode_action(NEXT)[None])
    assert not bool(after.done[0]) and float(after.reward[0]) == 0.0


def test_the_model_runs_only_where_needed_with_the_same_values():
    rows = jnp.arange(300, dtype=jnp.float32)
    needed = (jnp.arange(300) % 7 == 0) | (jnp.arange(300) > 290)  # 52 rows: 4 chunks of 16
    chunks = []

    def fn(x):
        jax.debug.callback(lambda: chunks.append(1))  # once per chunk the loop runs
        return x * 2.0 + 1.0

    run = jax.jit(lambda n: evaluate_where(fn, n, rows, chunk=16))
    got = run(needed)
    jax.effects_barrier()
    assert np.array_equal(np.asarray(got), np.where(needed, rows * 2.0 + 1.0, 0.0))
    assert len(chunks) == 4
    chunks.clear()
    assert float(run(jnp.zeros(300, bool)).sum()) == 0.0
    jax.effects_barrier()
    assert chunks == []  # nothing needed, nothing run


def test_masks_follow_the_grammar(programs, table):
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(table.n_programs)
    # matmul: op 1 (the matmul) comes first; its tile choices are divisors of the extents
    params, state, timestep = start(env, table, 0, jax.random.PRNGKey(0))
    mask = one(timestep.observation.mask)
    assert int(state.cursor[0]) == 1
    assert not bool(mask.kind[VECTORIZE])  # 64x96x128 is too big to vectorize whole
    assert not bool(mask.parallel_tile[2, 1:].any())  # the reduction loop is not parallel
    offered = tile_candidates(96)
    assert [bool(m) for m in mask.tile[1]] == [True] + [s > 0 for s in offered[1:]]
    choices = [tile_candidates(64).index(8), offered.index(32), tile_candidates(128).index(1)]
    state, timestep = env.step(params, table, pool, state, encode_action(TILE, tiles=choices)[None])
    assert bool(timestep.observation.mask.kind[0, VECTORIZE])
    assert not bool(timestep.observation.mask.kind[0, INTERCHANGE])  # after tiling: too late
    state, timestep = env.step(params, table, pool, state, encode_action(VECTORIZE)[None])
    assert int(state.cursor[0]) == 0  # vectorizing ends the op
    # convolutions: decompose only once the window row and output row are tiled to 1
    _, _, timestep = start(env, table, 3, jax.random.PRNGKey(0), params)
    assert not bool(timestep.observation.mask.kind[0, VECTORIZE])


def test_invalid_actions_are_replaced_and_flagged(table):
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(table.n_programs)
    params, state, _ = start(env, table, 0, jax.random.PRNGKey(0))
    new, timestep = env.step(params, table, pool, state, encode_action(VECTORIZE)[None])
    assert bool(timestep.invalid_action[0])
    assert int(timestep.applied_action[0, 0]) == NEXT and int(new.cursor[0]) == 0


def test_masks_agree_with_observation(table):
    env = JaxEnv(auto_reset=False)
    _, state, timestep = start(env, table, 2, jax.random.PRNGKey(0))
    direct = action_mask(table, one(state))
    assert bool(jnp.all(direct.kind == timestep.observation.mask.kind[0]))


def test_programs_too_large_for_the_table_are_refused():
    big = parse_program(g.render(g.SoftmaxSpec("full", 16, 64)), "s")
    big.ops = big.ops * 3
    with pytest.raises(EncodingError, match="ops"):
        encode_programs([big])


def test_specs_declare_every_shape(table):
    env = JaxEnv()
    spec = env.observation_spec(table)
    _, _, timestep = start(env, table, 0, jax.random.PRNGKey(0))
    actual = jax.tree.map(lambda a: (a.shape, a.dtype), one(timestep.observation))
    declared = jax.tree.map(lambda a: (a.shape, a.dtype), spec)
    assert actual == declared
    assert env.action_spec()["action"].shape == timestep.applied_action.shape[1:]


def test_tile_candidates_add_whole_vectors_that_leave_a_remainder():
    # the divisor slots of version 1 stay as they were, so stored schedules still replay
    assert tile_candidates(28, 16)[:N_DIVISOR_CHOICES] == (0, 1, 2, 4, 7, 14, 0, 0)
    assert tile_candidates(28, 16)[N_DIVISOR_CHOICES:] == (8, 16, 0, 0)  # 1/2 and 1 vector
    assert tile_candidates(28, 8)[N_DIVISOR_CHOICES:] == (8, 16, 0, 0)  # 4 divides 28
    assert tile_candidates(147, 8)[N_DIVISOR_CHOICES:] == (4, 8, 16, 32)
    assert tile_candidates(147, 16)[N_DIVISOR_CHOICES:] == (8, 16, 32, 64)
    assert tile_candidates(256, 16)[N_DIVISOR_CHOICES:] == (0, 0, 0, 0)  # all divide
    for extent in range(1, 300):
        for lanes in (4, 8, 16):
            offered = [s for s in tile_candidates(extent, lanes) if s]
            assert len(set(offered)) == len(offered) and all(s < extent for s in offered)


def test_a_remainder_tile_is_offered_to_tiling_never_to_a_forall(runner):
    program = parse_program(g.render(g.MatmulSpec(28, 40, 24)), "mm28")
    table = encode_programs([program], lanes=16)
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(1)
    params, state, timestep = start(env, table, 0, jax.random.PRNGKey(0))
    mask = one(timestep.observation.mask)
    loops = program.ops[1].loops
    for j, loop in enumerate(loops):
        offered = tile_candidates(loop.extent, 16)
        for c, size in enumerate(offered):
            if size and loop.extent % size:
                assert bool(mask.tile[j, c]) and not bool(mask.parallel_tile[j, c])
    # tile i by 16 (28 = 16 + 12) and j by 16 (40 = 2 x 16 + 8), then vectorize
    choices = [tile_candidates(loops[0].extent, 16).index(16)]
    choices += [tile_candidates(loops[1].extent, 16).index(16), tile_candidates(24, 16).index(8)]
    actions = [encode_action(TILE, tiles=choices)]
    state, timestep = env.step(params, table, pool, state, actions[0][None])
    assert not bool(timestep.invalid_action[0])
    state, timestep = env.step(params, table, pool, state, encode_action(VECTORIZE)[None])
    assert not bool(timestep.invalid_action[0])
    actions.append(encode_action(VECTORIZE))
    schedule, host = replay(program, actions, lanes=16)
    assert [t.sizes for t in schedule.transforms_of(1) if t.kind == "tile"] == [(16, 16, 8)]
    assert schedule_to_actions(program, schedule, lanes=16)[0].tolist() == actions[0].tolist()
    for name in CONTENT_FIELDS:
        assert np.array_equal(np.asarray(getattr(one(state), name)), getattr(host, name)), name
    measured = runner.measure(program, schedule)
    assert measured.ok and measured.verified, measured.error


def test_a_packed_convolution_replays_in_grammar_order_and_jax_agrees():
    from mlirrl_jax.env.jax_env import run_actions
    from mlirrl_jax.schedule import Schedule, Transform
    from mlirrl_jax.surrogate.dataset import padded_actions

    program = parse_program(g.render(g.Conv2dSpec("nhwc", 1, 10, 10, 8, 32, 3)), "conv_pack")
    op = next(o for o in program.ops if o.kind != "fill").id  # loops n, oh, ow, f, kh, kw, c
    schedule = Schedule.of(
        {
            op: [
                Transform("tile", (0, 0, 0, 16, 0, 0, 0)),
                Transform("tile", (0, 1, 4, 8, 1, 1, 1)),
                Transform("pack"),
                Transform("decompose"),
                Transform("vectorize"),
            ]
        }
    )
    host = state_of_schedule(program, schedule)
    assert host.packed[op] and host.decomposed[op] and not host.ragged[op]
    assert schedule_of(program, host) == schedule  # pack before decompose, as the grammar
    table = encode_programs([program], lanes=8)
    actions = padded_actions(program, schedule, lanes=8)
    state = run_actions(table, jnp.int32(0), jnp.asarray(actions))
    # the masks offered `pack` (a refused kind would have been replaced: not packed)
    assert HostState.from_env_state(state).differences(host, CONTENT_FIELDS) == []
    # a partial tile (32 channels in tiles of 12) closes `pack`
    ragged = Schedule.of({op: [Transform("tile", (0, 0, 0, 12, 0, 0, 0))]})
    assert state_of_schedule(program, ragged).ragged[op]


DEPTHWISE_NCHW = """
func.func @dw(%i: tensor<1x8x18x18xf32>, %w: tensor<8x3x3xf32>, %o: tensor<1x8x16x16xf32>)
    -> tensor<1x8x16x16xf32> {
  %r = linalg.depthwise_conv_2d_nchw_chw {dilations = dense<1> : tensor<2xi64>,
      strides = dense<1> : tensor<2xi64>}
    ins(%i, %w : tensor<1x8x18x18xf32>, tensor<8x3x3xf32>) outs(%o : tensor<1x8x16x16xf32>)
    -> tensor<1x8x16x16xf32>
  return %r : tensor<1x8x16x16xf32>
}
"""

GATHER = """
#in = affine_map<(n, c, kh, kw, oh, ow) -> (n, c, oh * 2 + kh, ow * 2 + kw)>
#out = affine_map<(n, c, kh, kw, oh, ow) -> (n, c, kh, kw, oh, ow)>
func.func @gather(%i: tensor<1x4x17x17xf32>, %o: tensor<1x4x3x3x8x8xf32>)
    -> tensor<1x4x3x3x8x8xf32> {
  %r = linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "parallel",
      "parallel", "parallel", "parallel", "parallel"]}
    ins(%i : tensor<1x4x17x17xf32>) outs(%o : tensor<1x4x3x3x8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    linalg.yield %x : f32
  } -> tensor<1x4x3x3x8x8xf32>
  return %r : tensor<1x4x3x3x8x8xf32>
}
"""


def test_ops_mlir_cannot_vectorize_are_never_offered_decompose_or_vectorize():
    """A depthwise NCHW window has no 1-D form in MLIR and a gather through `oh * 2 + kh` no
    vector form: neither is offered `decompose` or `vectorize`, tiled to 1 or not (the
    compile would fail: `programs.analysis.vectorizable`)."""
    programs = [parse_program(DEPTHWISE_NCHW, "dw"), parse_program(GATHER, "gather")]
    table = encode_programs(programs)
    assert not bool(table.decomposable[0, 0]) and not bool(table.vectorizable[0, 0])
    assert not bool(table.decomposable[1, 0]) and not bool(table.vectorizable[1, 0])
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(2)
    for index, program in enumerate(programs):
        params, state, timestep = start(env, table, index, jax.random.PRNGKey(0))
        lanes = int(table.vector_lanes[index])
        candidates = [tile_candidates(e, lanes) for e in program.ops[0].extents]
        choices = [c.index(1) if 1 in c else 0 for c in candidates]  # every loop to 1
        state, timestep = env.step(
            params, table, pool, state, encode_action(TILE, tiles=choices)[None]
        )
        assert not bool(timestep.invalid_action[0])
        mask = timestep.observation.mask.kind[0]
        assert not bool(mask[DECOMPOSE]) and not bool(mask[VECTORIZE])
        assert bool(mask[NEXT])
