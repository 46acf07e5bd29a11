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

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlirrl_jax.agent.losses import Batch, compute_gae, ppo_loss
from mlirrl_jax.agent.networks import NetworkConfig, abstract, act, build, value
from mlirrl_jax.env.jax_env import MAX_EPISODE_STEPS, JaxEnv
from mlirrl_jax.env.observation import Observation
from mlirrl_jax.env.reward import (
    PessimisticLogTime,
    RewardParams,
    ShapedReward,
    TerminalReward,
)
from mlirrl_jax.env.state import EnvState, ProgramTable
from mlirrl_jax.errors import ConfigError

REWARDS = {"terminal": TerminalReward, "shaped": ShapedReward}
AXIS = "envs"


@dataclass(frozen=True)
class AgentConfig:
    """Everything a training run is made of; saved as `config.json` with every run."""

    envs: int = 1024
    """Environments stepped together (split evenly across the host devices)."""
    steps: int = 16
    """Steps of each environment per iteration; episodes run on across iterations."""
    epochs: int = 1
    """Passes over each iteration's transitions."""
    minibatches: int = 8
    """Minibatches per pass (gradient steps per pass)."""
    learning_rate: float = 1e-3
    """Adam's step size at the start."""
    final_learning_rate: float = 1e-4
    """Step size at the end of the budget (linear decay)."""
    max_grad_norm: float = 0.5
    """Gradients are clipped to this global norm."""
    gamma: float = 1.0
    """Discount: 1, since an episode's return is its schedule's log-speedup."""
    gae_lambda: float = 0.95
    """GAE's bias-variance trade-off."""
    clip: float = 0.2
    """PPO's ratio clip, also the value clip."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.01
    """Entropy bonus at the start."""
    final_entropy_coef: float = 0.001
    """Entropy bonus at the end of the budget (linear decay)."""
    reward: str = "terminal"
    """"terminal": the predicted log-speedup when an episode ends; "shaped": each step's
    decrease of predicted log time (the same return, the surrogate run every step)."""
    reward_chunk: int = 64
    """States the surrogate predicts at a time when scoring finished episodes."""
    max_episode_steps: int = MAX_EPISODE_STEPS
    """Episodes are cut (truncated) at this many steps; by default the grammar ends them first."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    """The policy network's shape."""
    devices: int = 0
    """Host devices the environments are split across (0: all of them)."""
    seed: int = 0
    """Seeds the network's weights, the environments and the sampling."""
    iterations: int = 0
    """Iterations to run (0: train by time, `minutes`)."""
    minutes: float = 10.0
    """Training time when `iterations` is 0 (compile time excluded)."""
    eval_every: int = 25
    """Iterations between greedy evaluations on the test programs (0: none, not even at the
    end: a run that only trains)."""
    eval_random_schedules: int = 64
    """Random masked schedules per test program that the agent is compared with."""
    checkpoint_seconds: float = 60.0
    """Seconds between checkpoints (and one at the end)."""
    surrogate: str = ""
    """The cost model whose predictions are the reward ("": the shipped surrogate; "analytic":
    the roofline stand-in)."""
    uncertainty_penalty: float = 0.0
    """beta: the reward reads the surrogate's predicted log time plus beta times its
    ensemble's spread (`env.reward.PessimisticLogTime`), so schedules it is unsure of count as
    slower; 0: the mean alone. Needs a surrogate with an ensemble to have an effect."""
    suites: tuple[str, ...] = ()
    """Suites whose train split the agent trains on (empty: those the surrogate was fitted on)."""
    threads: tuple[int, ...] = ()
    """Threads per kernel the agent trains at: every train program once per count, the count
    in its observation (empty: every count the surrogate was fitted on)."""

    def __post_init__(self):
        if self.reward not in REWARDS:
            raise ConfigError(f"reward must be one of {sorted(REWARDS)}, got {self.reward!r}")
        for name in ("envs", "steps", "epochs", "minibatches", "reward_chunk"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if (self.envs * self.steps) % self.minibatches:
            raise ConfigError(
                f"envs x steps ({self.envs * self.steps}) must split into {self.minibatches} "
                "minibatches"
            )
        if self.uncertainty_penalty < 0:
            raise ConfigError(
                f"uncertainty_penalty must be at least 0, got {self.uncertainty_penalty}"
            )
        if any(int(t) != t or t < 1 for t in self.threads) or len(set(self.threads)) != len(
            self.threads
        ):
            raise ConfigError(f"threads must be distinct whole numbers >= 1, got {self.threads}")
        if self.eval_every < 0 or self.eval_random_schedules < 1:
            raise ConfigError("eval_every must be >= 0 and eval_random_schedules >= 1")
        if not 1 <= self.max_episode_steps <= MAX_EPISODE_STEPS:
            raise ConfigError(f"max_episode_steps must lie in [1, {MAX_EPISODE_STEPS}]")
        if self.iterations < 0 or self.minutes < 0 or not (self.iterations or self.minutes):
            raise ConfigError(
                f"the budget needs iterations > 0 or minutes > 0 (iterations {self.iterations}, "
                f"minutes {self.minutes})"
            )
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.clip <= 0 or self.devices < 0 or self.checkpoint_seconds < 0:
            raise ConfigError("clip must be positive; devices and checkpoint_seconds >= 0")

    def to_json(self) -> dict:
        out = asdict(self)
        out["suites"] = list(self.suites)
        out["threads"] = list(self.threads)
        return out

    @classmethod
    def from_json(cls, data: dict) -> AgentConfig:
        """A config from `to_json`'s dict (or a partial one: the rest keeps the defaults);
        unknown keys are an error that names them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; known: {sorted(known)}")
        values = dict(data)
        if "network" in values and not isinstance(values["network"], NetworkConfig):
            network_keys = {f.name for f in fields(NetworkConfig)}
            unknown = sorted(set(values["network"]) - network_keys)
            if unknown:
                raise ConfigError(
                    f"unknown network config keys {unknown}; known: {sorted(network_keys)}"
                )
            values["network"] = NetworkConfig(**values["network"])
        for name in ("suites", "threads"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)


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
    reward = REWARDS[config.reward](model=model, chunk=config.reward_chunk)
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
