"""Whole episodes in the jitted environment, one per program, under any policy: the agent's
greedy or sampled schedules, and random masked schedules to compare them with."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.actions import ACTION_WIDTH
from mlirrl_jax.env.jax_env import JaxEnv, sample_action
from mlirrl_jax.env.observation import Observation
from mlirrl_jax.env.reward import RewardParams
from mlirrl_jax.env.state import EnvState, ProgramTable

# policy(observations (B,), key) -> actions (B, ACTION_WIDTH)
BatchPolicy = Callable[[Observation, jax.Array], jax.Array]


@struct.dataclass
class Episodes:
    """Finished episodes, one per row (B,)."""

    states: EnvState  # (B,) final states
    actions: jax.Array  # (B, max_steps, ACTION_WIDTH) int32 applied actions, `next`-padded
    steps: jax.Array  # (B,) int32 actions each episode took
    log_speedup: jax.Array  # (B,) float32 the reward's predicted log-speedup at the end


def run_episodes(
    env: JaxEnv,
    policy: BatchPolicy,
    params: RewardParams,
    table: ProgramTable,
    programs: jax.Array,
    key: jax.Array,
) -> Episodes:
    """One episode per entry of `programs` (B,), until every one has ended (jittable). The
    environment must not auto-reset."""
    if env.auto_reset:
        raise ValueError("run_episodes needs an environment that does not auto-reset")
    rows = programs.shape[0]
    key, reset_key = jax.random.split(key)
    states, timestep = env.reset_to(params, table, programs, jax.random.split(reset_key, rows))
    actions = jnp.zeros((env.max_steps, rows, ACTION_WIDTH), jnp.int32)
    log_speedup = jnp.zeros(rows, jnp.float32)

    def running(carry):
        states, _, _, _, t, _ = carry
        return (t < env.max_steps) & ~jnp.all(states.done)

    def body(carry):
        states, observation, actions, log_speedup, t, key = carry
        key, act_key = jax.random.split(key)
        action = policy(observation, act_key)
        new, step = env.step(params, table, programs, states, action)
        applied = jnp.where(states.done[:, None], 0, step.applied_action)
        log_speedup = jnp.where(step.done, step.log_speedup, log_speedup)
        return new, step.observation, actions.at[t].set(applied), log_speedup, t + 1, key

    carry = (states, timestep.observation, actions, log_speedup, 0, key)
    states, _, actions, log_speedup, _, _ = jax.lax.while_loop(running, body, carry)
    return Episodes(states, jnp.moveaxis(actions, 0, 1), states.steps, log_speedup)


def random_policy(next_weight: float = 1.0) -> BatchPolicy:
    """Uniform over the masked choices (`jax_env.sample_action`), batched."""

    def policy(observation: Observation, key: jax.Array) -> jax.Array:
        keys = jax.random.split(key, observation.cursor.shape[0])
        return jax.vmap(lambda k, m: sample_action(k, m, next_weight))(keys, observation.mask)

    return policy
