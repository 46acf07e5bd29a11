"""PPO on the jitted environment: the whole iteration is one jitted function.

`make_train(config, model, table, pool)` gives a `Trainer`: `prepare(model_params)` turns the
cost model's parameters into the reward's (`RewardParams`: once per weights, jitted);
`init(key, model_params)` makes the network, optimizer and environments; and
`iteration(state, reward_params, progress)` is a rollout of `config.steps` steps of
`config.envs` environments (`vmap` inside the batched environment, `lax.scan` over steps),
GAE, then `config.epochs` passes of minibatch updates, all under one `jit`. The reward's
parameters are an argument of the iteration, so a fine-tuned surrogate does not recompile it,
and metrics come back as returned arrays (never a callback per step). With several host devices
the environments are split across them and the gradients averaged (`shard_map`).
`Trainer.train(key, model_params)` runs `config.iterations` iterations from a fresh start in
one `lax.scan`: PureJaxRL's `make_train(config) -> train(key)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlirrl_jax.agent.config import AgentConfig
from mlirrl_jax.agent.losses import Batch, compute_gae, ppo_loss
from mlirrl_jax.agent.networks import abstract, act, build, value
from mlirrl_jax.env.jax_env import JaxEnv
from mlirrl_jax.env.observation import Observation
from mlirrl_jax.env.reward import (
    PessimisticLogTime,
    RewardParams,
    ShapedReward,
    TerminalReward,
)
from mlirrl_jax.env.state import EnvState, ProgramTable
from mlirrl_jax.errors import ConfigError

REWARD_KINDS = {"terminal": TerminalReward, "shaped": ShapedReward}  # by `REWARDS` name
AXIS = "envs"


@struct.dataclass
class TrainingState:
    """Everything an iteration reads and writes; a checkpoint holds all of it."""

    params: Any  # the policy network's parameters (nnx.State)
    opt_state: Any  # optax state
    env_states: EnvState  # (envs,) the environments, mid-episode
    observation: Observation  # (envs,) their current observations
    key: jax.Array  # PRNG key (uint32[2])
    iteration: jax.Array  # () int32, iterations done


@struct.dataclass
class Transition:
    """One step of every environment (leading axes [T, B] once stacked by the rollout)."""

    observation: Observation
    action: jax.Array  # (B, ACTION_WIDTH) int32, as sampled
    log_prob: jax.Array  # (B,)
    value: jax.Array  # (B,)
    reward: jax.Array  # (B,)
    discount: jax.Array  # (B,) 0 where the episode terminated
    truncated: jax.Array  # (B,) bool
    finished: jax.Array  # (B,) bool, the episode terminated with this step
    log_speedup: jax.Array  # (B,) predicted log-speedup of a finished episode's schedule
    invalid: jax.Array  # (B,) bool, the action broke a mask (never, for a masked policy)


def make_env(config: AgentConfig, model) -> JaxEnv:
    """The training environment: `config.reward` over the `LogTimeModel` `model` (pessimistic
    by `config.uncertainty_penalty`)."""
    if config.uncertainty_penalty > 0:
        if not hasattr(model, "log_time_with_spread"):
            raise ConfigError(
                f"uncertainty_penalty {config.uncertainty_penalty}: the reward's model "
                f"({type(model).__name__}) gives no spread; use a surrogate"
            )
        model = PessimisticLogTime(model, config.uncertainty_penalty)
    reward = REWARD_KINDS[config.reward](model=model, chunk=config.reward_chunk)
    return JaxEnv(reward=reward, max_steps=config.max_episode_steps, auto_reset=True)


def optimizer(config: AgentConfig) -> optax.GradientTransformation:
    # the step size is applied by hand, from the budget's progress (`Trainer._update`)
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm), optax.scale_by_adam(eps=1e-5)
    )


def budget_share(done, total) -> jax.Array:
    """The share of an iteration budget done, in float32 (the same bits on the host and in
    a scan, so that a run and its resumed continuation anneal identically)."""
    return jnp.asarray(done, jnp.float32) / jnp.float32(total)


def _anneal(start: float, end: float, progress: jax.Array) -> jax.Array:
    return start + (end - start) * jnp.clip(progress, 0.0, 1.0)


def _splits_over(config: AgentConfig, count: int) -> bool:
    """Whether the environments, and each device's transitions, split over `count` devices."""
    return (
        config.envs % count == 0 and (config.envs // count * config.steps) % config.minibatches == 0
    )


def device_count(config: AgentConfig) -> int:
    """Host devices the run splits its environments across: `config.devices`, or (0) the most
    of this process's devices that the environments and minibatches split over evenly."""
    available = jax.device_count()
    if not config.devices:
        return max(c for c in range(1, available + 1) if _splits_over(config, c))
    if config.devices > available:
        raise ConfigError(f"config asks for {config.devices} devices; this process has {available}")
    if not _splits_over(config, config.devices):
        raise ConfigError(
            f"envs ({config.envs}) x steps ({config.steps}) do not split over {config.devices} "
            f"devices into {config.minibatches} minibatches each: change envs or devices"
        )
    return config.devices


@dataclass(frozen=True)
class Trainer:
    """The jitted pieces of a run (see the module docstring)."""

    config: AgentConfig
    env: JaxEnv
    table: ProgramTable
    pool: jax.Array  # (programs,) int32 rows of `table` the environments draw from
    graphdef: Any
    devices: int
    _jitted: dict = field(default_factory=dict, repr=False, compare=False)

    def init(self, key: jax.Array, model_params) -> TrainingState:
        """A fresh start: the network (its weights seeded by `config.seed`), optimizer and
        environments (drawn with `key`; the first episodes' baselines come from the model's
        `model_params`); jitted, and laid out over the devices as `iteration` takes it."""
        return self.place(jax.jit(self._init)(key, model_params))

    def prepare(self, model_params) -> RewardParams:
        """The reward's parameters for the cost model's `model_params` (its per-program work
        and every program's predicted baseline), on the run's devices: once per weights."""
        if "prepare" not in self._jitted:
            self._jitted["prepare"] = jax.jit(lambda p: self.env.reward.prepare(p, self.table))
        return self.replicate(self._jitted["prepare"](model_params))

    def mesh(self) -> Mesh:
        return Mesh(jax.devices()[: self.devices], (AXIS,))

    def _specs(self) -> TrainingState:
        """Per field: replicated, or split along the environments."""
        split = PartitionSpec(AXIS)
        return TrainingState(
            params=PartitionSpec(),
            opt_state=PartitionSpec(),
            env_states=split,
            observation=split,
            key=PartitionSpec(),
            iteration=PartitionSpec(),
        )

    def replicate(self, tree):
        """A pytree (the cost model's parameters) copied to each of the run's devices."""
        if self.devices == 1:
            return jax.device_put(tree, jax.devices()[0])
        return jax.device_put(tree, NamedSharding(self.mesh(), PartitionSpec()))

    def place(self, state: TrainingState) -> TrainingState:
        """`state` on the run's devices: the environments split, the rest replicated."""
        if self.devices == 1:
            return jax.device_put(state, jax.devices()[0])
        mesh = self.mesh()
        shardings = jax.tree.map(
            lambda spec, part: jax.tree.map(lambda _: NamedSharding(mesh, spec), part),
            self._specs(),
            state,
            is_leaf=lambda x: isinstance(x, PartitionSpec),
        )
        return jax.device_put(state, shardings)

    def _init(self, key: jax.Array, model_params) -> TrainingState:
        _, params = build(self.config.network, self.config.seed)
        key, env_key = jax.random.split(key)
        reward_params = self.env.reward.prepare(model_params, self.table)
        states, timestep = self.env.reset(
            reward_params, self.table, self.pool, jax.random.split(env_key, self.config.envs)
        )
        return TrainingState(
            params=params,
            opt_state=optimizer(self.config).init(params),
            env_states=states,
            observation=timestep.observation,
            key=key,
            iteration=jnp.int32(0),
        )

    # -- one device's part of an iteration
    def _rollout(self, params, reward_params, states, observation, key):
        config, env = self.config, self.env

        def step(carry, step_key):
            states, observation = carry
            action, log_prob, value_estimate = act(self.graphdef, params, observation, step_key)
            states, timestep = env.step(reward_params, self.table, self.pool, states, action)
            finished = timestep.done & ~timestep.truncated
            return (states, timestep.observation), Transition(
                observation=observation,
                action=action,
                log_prob=log_prob,
                value=value_estimate,
                reward=timestep.reward,
                discount=timestep.discount,
                truncated=timestep.truncated,
                finished=finished,
                log_speedup=timestep.log_speedup,
                invalid=timestep.invalid_action,
            )

        (states, observation), transitions = jax.lax.scan(
            step, (states, observation), jax.random.split(key, config.steps)
        )
        return states, observation, transitions

    def _update(self, params, opt_state, batch: Batch, key, progress, axis: str | None):
        config = self.config
        rows = batch.action.shape[0]
        size = rows // config.minibatches
        learning_rate = _anneal(config.learning_rate, config.final_learning_rate, progress)
        entropy_coef = _anneal(config.entropy_coef, config.final_entropy_coef, progress)
        tx = optimizer(config)
        grad_fn = jax.value_and_grad(ppo_loss, has_aux=True)

        def minibatch(carry, part: Batch):
            params, opt_state = carry
            (_, info), grads = grad_fn(
                params, self.graphdef, part, config.clip, config.value_coef, entropy_coef
            )
            if axis:
                grads = jax.lax.pmean(grads, axis)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(
                params, jax.tree.map(lambda u: -learning_rate * u, updates)
            )
            return (params, opt_state), info

        def epoch(carry, epoch_key):
            order = jax.random.permutation(epoch_key, rows)
            parts = jax.tree.map(
                lambda a: a[order].reshape(config.minibatches, size, *a.shape[1:]), batch
            )
            return jax.lax.scan(minibatch, carry, parts)

        (params, opt_state), info = jax.lax.scan(
            epoch, (params, opt_state), jax.random.split(key, config.epochs)
        )
        info = jax.tree.map(jnp.mean, info)
        return (
            params,
            opt_state,
            {**info, "learning_rate": learning_rate, "entropy_coef": entropy_coef},
        )

    def _local_iteration(self, state: TrainingState, reward_params, progress, axis: str | None):
        config = self.config
        key, rollout_key, update_key = jax.random.split(state.key, 3)
        if axis:  # each device its own samples; the shared key stays replicated
            index = jax.lax.axis_index(axis)
            rollout_key = jax.random.fold_in(rollout_key, index)
            update_key = jax.random.fold_in(update_key, index)
        states, observation, t = self._rollout(
            state.params, reward_params, state.env_states, state.observation, rollout_key
        )
        bootstrap = value(self.graphdef, state.params, observation)
        advantage, target = compute_gae(
            t.reward, t.value, t.discount, t.truncated, bootstrap, config.gamma, config.gae_lambda
        )

        def flat(a):
            return a.reshape(-1, *a.shape[2:])

        batch = Batch(
            observation=jax.tree.map(flat, t.observation),
            action=flat(t.action),
            log_prob=flat(t.log_prob),
            value=flat(t.value),
            advantage=flat(advantage),
            target=flat(target),
            weight=flat(1.0 - t.truncated.astype(jnp.float32)),
        )
        params, opt_state, info = self._update(
            state.params, state.opt_state, batch, update_key, progress, axis
        )
        finished = t.finished.astype(jnp.float32)
        sums = {
            "episodes": finished.sum(),
            "log_speedup_sum": (t.log_speedup * finished).sum(),
            "reward_sum": t.reward.sum(),
            "truncated": t.truncated.astype(jnp.float32).sum(),
            "invalid_actions": t.invalid.astype(jnp.float32).sum(),
        }
        if axis:
            sums = jax.lax.psum(sums, axis)
            info = jax.lax.pmean(info, axis)
        metrics = {
            **info,
            **sums,
            "mean_log_speedup": sums["log_speedup_sum"] / jnp.maximum(sums["episodes"], 1.0),
        }
        new = TrainingState(params, opt_state, states, observation, key, state.iteration + 1)
        return new, metrics

    def iteration(
        self, state: TrainingState, reward_params: RewardParams, progress
    ) -> tuple[TrainingState, dict]:
        """One PPO iteration (jit it: `jax.jit(trainer.iteration)`); `progress` in [0, 1] is
        the share of the budget done, which anneals the step size and the entropy bonus. The
        state comes from `init` or `place`, the reward's parameters from `prepare`."""
        progress = jnp.asarray(progress, jnp.float32)
        if self.devices == 1:
            return self._local_iteration(state, reward_params, progress, None)
        specs = self._specs()
        run = jax.shard_map(
            lambda s, m, p: self._local_iteration(s, m, p, AXIS),
            mesh=self.mesh(),
            in_specs=(specs, PartitionSpec(), PartitionSpec()),
            out_specs=(specs, PartitionSpec()),
            check_vma=False,
        )
        return run(state, reward_params, progress)

    def train(self, key: jax.Array, model_params) -> tuple[TrainingState, dict]:
        """`config.iterations` iterations from a fresh start in one `lax.scan` (jittable; on
        one device); metrics stacked per iteration. The same iterations as `run_training`'s
        (the same progress values: `budget_share(i, total)`)."""
        total = self.config.iterations
        if not total:
            raise ConfigError("train() runs config.iterations iterations: set iterations > 0")
        reward_params = self.env.reward.prepare(model_params, self.table)

        def body(state, i):
            return self.iteration(state, reward_params, budget_share(i, total))

        return jax.lax.scan(body, self._init(key, model_params), jnp.arange(total))


def make_train(config: AgentConfig, model, table: ProgramTable, pool: jax.Array) -> Trainer:
    """The run's jitted pieces: PPO over `config.reward` of the `LogTimeModel` `model`, on
    the programs `pool` (rows of `table`)."""
    graphdef, _ = abstract(config.network)
    return Trainer(
        config=config,
        env=make_env(config, model),
        table=table,
        pool=jnp.asarray(pool, jnp.int32),
        graphdef=graphdef,
        devices=device_count(config),
    )
