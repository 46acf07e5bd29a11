"""PPO's pieces as pure functions: GAE and the clipped surrogate loss with value and entropy
terms. Arrays of a rollout are [T, B]: T steps of B environments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.agent.networks import evaluate_actions
from mlirrl_jax.env.observation import Observation


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    discounts: jax.Array,
    truncated: jax.Array,
    bootstrap_value: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimates and value targets, both [T, B].

    rewards, values: [T, B], the reward of step t and the value of the state it acted in.
    discounts: [T, B], 0 where the episode terminated at step t (nothing follows), else 1.
    truncated: [T, B], the episode was cut at step t before it finished: that step teaches
    nothing (advantage 0, its own value as target) and the estimate does not run past it,
    since the next state belongs to a new episode. Earlier steps bootstrap on the values of
    the cut episode's own states.
    bootstrap_value: [B], the value of the state after the last step.
    """
    keep = 1.0 - truncated.astype(values.dtype)
    next_values = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = (rewards + gamma * discounts * next_values - values) * keep

    def backwards(following, step):
        delta, discount, kept = step
        advantage = delta + gamma * gae_lambda * discount * kept * following
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backwards, jnp.zeros_like(bootstrap_value), (deltas, discounts, keep), reverse=True
    )
    return advantages, advantages + values


@struct.dataclass
class Batch:
    """Transitions flattened for the update (leading axis: transitions)."""

    observation: Observation
    action: jax.Array  # (N, ACTION_WIDTH) int32
    log_prob: jax.Array  # (N,) under the policy that acted
    value: jax.Array  # (N,) the value head's estimate when it acted
    advantage: jax.Array  # (N,)
    target: jax.Array  # (N,) value target (advantage + value)
    weight: jax.Array  # (N,) 1, or 0 for cut (truncated) steps, which teach nothing


def ppo_loss(
    params,
    graphdef,
    batch: Batch,
    clip: float,
    value_coef: float,
    entropy_coef: jax.Array,
) -> tuple[jax.Array, dict]:
    """The clipped surrogate objective with a clipped value loss and an entropy bonus, over
    the weighted transitions; advantages normalized within the batch."""
    log_prob, entropy, value = evaluate_actions(graphdef, params, batch.observation, batch.action)
    weight = batch.weight
    total = jnp.maximum(weight.sum(), 1.0)

    def mean(x):
        return jnp.sum(x * weight) / total

    centered = batch.advantage - mean(batch.advantage)
    advantage = centered / (jnp.sqrt(mean(centered**2)) + 1e-8)
    log_ratio = log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    policy_loss = -mean(
        jnp.minimum(ratio * advantage, jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * advantage)
    )
    clipped_value = batch.value + jnp.clip(value - batch.value, -clip, clip)
    value_loss = 0.5 * mean(
        jnp.maximum((value - batch.target) ** 2, (clipped_value - batch.target) ** 2)
    )
    entropy_mean = mean(entropy)
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy_mean
    return loss, {
        "loss": loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy_mean,
        "approx_kl": mean((ratio - 1.0) - log_ratio),
        "clip_fraction": mean((jnp.abs(ratio - 1.0) > clip).astype(jnp.float32)),
    }
