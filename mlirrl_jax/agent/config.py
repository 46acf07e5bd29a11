"""The settings of an agent and its training run (`AgentConfig`, `NetworkConfig`): plain
dataclasses, free of JAX, so that the command line reads their fields and documentation
without loading it (`cli.options`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from mlirrl_jax.actions import MAX_EPISODE_STEPS
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.util.configs import option

REWARDS = ("terminal", "shaped")  # the environment's reward kinds (`env.reward`)
# where the agent's proposals start (`Agent.proposals`): with the heuristic's schedule and its
# refinements beside its own, or from its own alone
STARTS = ("known", "scratch")


@dataclass(frozen=True)
class NetworkConfig:
    """The policy network's shape."""

    width: int = option(32, doc="Size of the op and loop tokens.")
    mixing: str = option(
        "deepsets",
        doc='How tokens see each other: "attention" (self-attention) or "deepsets" (mean and max).',
    )
    heads: int = option(2, doc='Attention heads, where mixing is "attention".')

    def __post_init__(self):
        if self.mixing not in ("attention", "deepsets"):
            raise ConfigError(f"mixing must be 'attention' or 'deepsets', got {self.mixing!r}")
        if self.width < 1:
            raise ConfigError("network widths must be positive")

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AgentConfig:
    """Everything a training run is made of; saved as `config.json` with every run. Its fields
    are documented one by one, as every config's here: the flags and their help come from
    them (`cli.options`)."""

    envs: int = option(
        1024, doc="Environments stepped together (split evenly across the host devices)."
    )
    steps: int = option(
        16, doc="Steps of each environment per iteration; episodes run on across iterations."
    )
    epochs: int = option(1, doc="Passes over each iteration's transitions.")
    minibatches: int = option(8, doc="Minibatches per pass (gradient steps per pass).")
    learning_rate: float = option(1e-3, doc="Adam's step size at the start.")
    final_learning_rate: float = option(
        1e-4, doc="Step size at the end of the budget (linear decay)."
    )
    max_grad_norm: float = option(0.5, doc="Gradients are clipped to this global norm.")
    gamma: float = option(
        1.0, doc="Discount: 1, since an episode's return is its schedule's log-speedup."
    )
    gae_lambda: float = option(0.95, doc="GAE's bias-variance trade-off.")
    clip: float = option(0.2, doc="PPO's ratio clip, also the value clip.")
    value_coef: float = option(0.5, doc="Weight of the value loss.")
    entropy_coef: float = option(0.01, doc="Entropy bonus at the start.")
    final_entropy_coef: float = option(
        0.001, doc="Entropy bonus at the end of the budget (linear decay)."
    )
    reward: str = option(
        "terminal",
        doc=(
            '"terminal": the predicted log-speedup when an episode ends; "shaped": each '
            "step's decrease of predicted log time (the same return, the surrogate run every "
            "step)."
        ),
    )
    reward_chunk: int = option(
        64, doc="States the surrogate predicts at a time when scoring finished episodes."
    )
    max_episode_steps: int = option(
        MAX_EPISODE_STEPS,
        doc=(
            "Episodes are cut (truncated) at this many steps; by default the grammar ends "
            "them first."
        ),
    )
    network: NetworkConfig = option(factory=NetworkConfig, doc="The policy network's shape.")
    devices: int = option(0, doc="Host devices the environments are split across (0: all of them).")
    seed: int = option(0, doc="Seeds the network's weights, the environments and the sampling.")
    iterations: int = option(0, doc="Iterations to run (0: train by time, `minutes`).")
    minutes: float = option(
        10.0, doc="Training time when `iterations` is 0 (compile time excluded)."
    )
    eval_every: int = option(
        25,
        doc=(
            "Iterations between greedy evaluations on the test programs (0: none, not even at"
            " the end: a run that only trains)."
        ),
    )
    eval_random_schedules: int = option(
        64, doc="Random masked schedules per test program that the agent is compared with."
    )
    checkpoint_seconds: float = option(
        60.0, doc="Seconds between checkpoints (and one at the end)."
    )
    surrogate: str = option(
        "",
        doc=(
            'The cost model whose predictions are the reward ("": the shipped surrogate; '
            '"analytic": the roofline stand-in).'
        ),
    )
    uncertainty_penalty: float = option(
        0.0,
        doc=(
            "beta: the reward reads the surrogate's predicted log time plus beta times its "
            "ensemble's spread (`env.reward.PessimisticLogTime`), so schedules it is unsure "
            "of count as slower; 0: the mean alone. Needs a surrogate with an ensemble to "
            "have an effect."
        ),
    )
    suites: tuple[str, ...] = option(
        (),
        doc=(
            "Suites whose train split the agent trains on (empty: those the surrogate was "
            "fitted on)."
        ),
    )
    threads: tuple[int, ...] = option(
        (),
        doc=(
            "Threads per kernel the agent trains at: every train program once per count, the "
            "count in its observation (empty: every count the surrogate was fitted on)."
        ),
    )

    @property
    def random_best_key(self) -> str:
        """The name the evaluation's metrics give the best of `eval_random_schedules` random
        schedules (`random_best_of_64`): every writer and reader takes it from here."""
        return f"random_best_of_{self.eval_random_schedules}"

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
