"""Whole episodes in the jitted environment, one per program, under any policy: the agent's
greedy or sampled schedules, and random masked schedules to compare them with."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.actions import ACTION_WIDTH
from mlirrl_jax.env.jax_env import JaxEnv
from mlirrl_jax.env.observation import Observation
from mlirrl_jax.env.reward import RewardParams, evaluate_where
from mlirrl_jax.env.state import EnvState, ProgramTable
from mlirrl_jax.sampler import Policy

# policy(key, observations (B,)) -> actions (B, ACTION_WIDTH): `sampler.Policy`, batched
BatchPolicy = Callable[[jax.Array, Observation], jax.Array]


def batched(policy: Policy) -> BatchPolicy:
    """A one-observation policy over a batch of observations, a key each."""

    def run(key: jax.Array, observations: Observation) -> jax.Array:
        keys = jax.random.split(key, observations.cursor.shape[0])
        return jax.vmap(policy)(keys, observations)

    return run


@struct.dataclass
class Episodes:
    """Finished episodes, one per row (B,)."""

    states: EnvState  # (B,) final states
    actions: jax.Array  # (B, max_steps, ACTION_WIDTH) int32 applied actions, `next`-padded
    steps: jax.Array  # (B,) int32 actions each episode took
    log_speedup: jax.Array  # (B,) float32 predicted log-speedup of each final schedule


@struct.dataclass
class Forced:
    """Actions imposed on episodes, one row each: step t takes `actions[:, t]` while t <
    `length`, except at step `free_at` (-1: none), where the policy chooses."""

    actions: jax.Array  # (B, T, ACTION_WIDTH) int32
    length: jax.Array  # (B,) int32
    free_at: jax.Array  # (B,) int32


def run_episodes(
    env: JaxEnv,
    policy: BatchPolicy,
    params: RewardParams,
    table: ProgramTable,
    programs: jax.Array,
    key: jax.Array,
    forced: Forced | None = None,
) -> Episodes:
    """One episode per entry of `programs` (B,), until every one has ended (jittable). The
    environment must not auto-reset. An episode cut at the step limit is scored too: the
    reward's model predicts its final schedule. `forced`: actions that replace the policy's
    at the steps it covers (the environment's masks repair any that became illegal)."""
    if env.auto_reset:
        raise ValueError("run_episodes needs an environment that does not auto-reset")
    rows = programs.shape[0]
    key, reset_key = jax.random.split(key)
    states, timestep = env.reset_to(params, table, programs, jax.random.split(reset_key, rows))
    actions = jnp.zeros((env.max_steps, rows, ACTION_WIDTH), jnp.int32)
    log_speedup = jnp.zeros(rows, jnp.float32)
    truncated = jnp.zeros(rows, bool)

    def running(carry):
        states, _, _, _, _, t, _ = carry
        return (t < env.max_steps) & ~jnp.all(states.done)

    def body(carry):
        states, observation, actions, log_speedup, truncated, t, key = carry
        key, act_key = jax.random.split(key)
        action = policy(act_key, observation)
        if forced is not None:
            at = jnp.minimum(t, forced.actions.shape[1] - 1)
            use = (t < forced.length) & (t != forced.free_at)
            action = jnp.where(use[:, None], forced.actions[:, at], action)
        new, step = env.step(params, table, programs, states, action)
        applied = jnp.where(states.done[:, None], 0, step.applied_action)
        log_speedup = jnp.where(step.done, step.log_speedup, log_speedup)
        truncated = truncated | step.truncated
        carry = new, step.observation, actions.at[t].set(applied), log_speedup, truncated
        return *carry, t + 1, key

    carry = (states, timestep.observation, actions, log_speedup, truncated, 0, key)
    states, _, actions, log_speedup, truncated, _, _ = jax.lax.while_loop(running, body, carry)

    def score(final: EnvState) -> jax.Array:
        return params.base_log_time[final.program] - env.reward.model.log_time(
            params.context, table, final
        )

    cut = evaluate_where(score, truncated, states, env.reward.chunk)
    log_speedup = jnp.where(truncated, cut, log_speedup)
    return Episodes(states, jnp.moveaxis(actions, 0, 1), states.steps, log_speedup)
