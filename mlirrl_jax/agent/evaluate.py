"""The agent judged by the reward model on programs: its greedy schedules against the
heuristic schedule and the best of k random masked schedules, all scored by the same model.

`Evaluator` holds one table of programs (the test split, say) and jitted episode runners;
every figure is a predicted log-speedup over the unscheduled program, one per program.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp
import numpy as np

from mlirrl_jax.actions import ACTION_WIDTH
from mlirrl_jax.agent.networks import act
from mlirrl_jax.agent.rollout import Episodes, Forced, batched, run_episodes
from mlirrl_jax.env.jax_env import MAX_EPISODE_STEPS, JaxEnv
from mlirrl_jax.env.replay import state_of_schedule
from mlirrl_jax.env.reward import RewardParams
from mlirrl_jax.env.state import ProgramTable
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.sampler import random_policy

PREDICT_CHUNK = 256
RANDOM_ROWS_PER_CALL = 4096  # random episodes run together when scoring random search


def geomean_speedup(log_speedups) -> float:
    """The geometric-mean speedup of per-program log-speedups."""
    return float(np.exp(np.mean(np.asarray(log_speedups, np.float64))))


def greedy_policy(graphdef, params):
    """The network's most likely action per observation (a `BatchPolicy`)."""
    return lambda key, observations: act(graphdef, params, observations, key, greedy=True)[0]


def sampling_policy(graphdef, params, temperature: float = 1.0):
    """An action sampled from the network per observation (a `BatchPolicy`), at `temperature`."""
    return lambda key, observations: act(
        graphdef, params, observations, key, temperature=temperature
    )[0]


@dataclass
class Evaluator:
    """Episodes and scores on a fixed list of programs, under one environment's reward."""

    env: JaxEnv  # its reward scores the schedules; auto-reset is turned off here
    programs: list[Program]
    graphdef: object
    table: ProgramTable | None = None
    _jitted: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.env = replace(self.env, auto_reset=False)
        if self.table is None:
            self.table = encode_programs(self.programs)

    @property
    def rows(self) -> jnp.ndarray:
        return jnp.arange(len(self.programs), dtype=jnp.int32)

    def prepare(self, model_params) -> RewardParams:
        """The reward's parameters on this table (jitted)."""
        if "prepare" not in self._jitted:
            self._jitted["prepare"] = jax.jit(self.env.reward.prepare)
        return self._jitted["prepare"](model_params, self.table)

    def episodes(
        self, params, reward_params, programs, key, greedy: bool, temperature: float = 1.0
    ) -> Episodes:
        """The agent's episodes on table rows `programs` (greedy, or sampled at
        `temperature`). Sampled episodes run through `guided_episodes` with nothing forced:
        one compiled runner serves both (the temperature is an argument too)."""
        if not greedy:
            free = Forced(
                actions=np.zeros((len(programs), MAX_EPISODE_STEPS, ACTION_WIDTH), np.int32),
                length=np.zeros(len(programs), np.int32),
                free_at=np.full(len(programs), -1, np.int32),
            )
            return self.guided_episodes(params, reward_params, programs, free, key, temperature)
        if "greedy" not in self._jitted:

            def run(params, reward_params, programs, key):
                policy = greedy_policy(self.graphdef, params)
                return run_episodes(self.env, policy, reward_params, self.table, programs, key)

            self._jitted["greedy"] = jax.jit(run)
        return self._jitted["greedy"](params, reward_params, jnp.asarray(programs, jnp.int32), key)

    def guided_episodes(
        self, params, reward_params, programs, forced: Forced, key, temperature: float = 1.0
    ) -> Episodes:
        """The agent's sampled episodes on table rows `programs`, taking the `forced` actions
        where they cover a step (refinements of a known schedule: `agent.refine`)."""
        if "guided" not in self._jitted:

            def run(params, reward_params, programs, forced, key, temperature):
                policy = sampling_policy(self.graphdef, params, temperature)
                return run_episodes(
                    self.env, policy, reward_params, self.table, programs, key, forced
                )

            self._jitted["guided"] = jax.jit(run)
        return self._jitted["guided"](
            params,
            reward_params,
            jnp.asarray(programs, jnp.int32),
            forced,
            key,
            jnp.float32(temperature),
        )

    def greedy(self, params, reward_params) -> np.ndarray:
        """(P,) the greedy agent's predicted log-speedup on every program."""
        episodes = self.episodes(params, reward_params, self.rows, jax.random.PRNGKey(0), True)
        return np.asarray(episodes.log_speedup)

    def random_best(self, reward_params, schedules: int, key: jax.Array) -> np.ndarray:
        """(P,) the best predicted log-speedup of `schedules` random masked episodes of every
        program (uniform over the legal choices), several draws per jitted call."""
        if "random" not in self._jitted:

            def run(reward_params, programs, key):
                return run_episodes(
                    self.env, batched(random_policy()), reward_params, self.table, programs, key
                ).log_speedup

            self._jitted["random"] = jax.jit(run)
        count = len(self.programs)
        per_call = max(1, min(schedules, RANDOM_ROWS_PER_CALL // count))
        rows = jnp.tile(self.rows, per_call)
        best = np.full(count, -np.inf)
        for call in range(-(-schedules // per_call)):
            found = self._jitted["random"](reward_params, rows, jax.random.fold_in(key, call))
            draws = np.asarray(found).reshape(per_call, count)
            draws = draws[: schedules - call * per_call]  # the last call: only the draws asked
            best = np.maximum(best, draws.max(axis=0))
        return best

    def random_episodes(
        self, reward_params, programs, key: jax.Array, next_weight: float = 1.0
    ) -> Episodes:
        """Random masked episodes on table rows `programs`, whole (actions and scores), with
        `next_weight` < 1 favouring deeper schedules (as collection draws them)."""
        name = f"random_episodes_{next_weight}"
        if name not in self._jitted:

            def run(reward_params, programs, key):
                policy = batched(random_policy(next_weight))
                return run_episodes(self.env, policy, reward_params, self.table, programs, key)

            self._jitted[name] = jax.jit(run)
        return self._jitted[name](reward_params, jnp.asarray(programs, jnp.int32), key)

    def heuristic(self, reward_params, threads: int | None = None) -> np.ndarray:
        """(P,) the predicted log-speedup of the heuristic schedule of every program at
        `threads` (None: at each row's own thread count in the table); its tile sizes need not
        be among the action space's candidates."""
        counts = np.asarray(self.table.threads) if threads is None else None
        states = [
            state_of_schedule(
                p, heuristic_schedule(p, int(counts[i]) if threads is None else threads)
            ).to_env_state(i)
            for i, p in enumerate(self.programs)
        ]
        return self.score_states(reward_params, states)

    def score_states(self, reward_params, states: list) -> np.ndarray:
        """(N,) predicted log-speedups of finished states (`HostState.to_env_state` rows)."""
        if "score" not in self._jitted:
            model = self.env.reward.model

            def score(reward_params, batch):
                log_time = model.log_time(reward_params.context, self.table, batch)
                return reward_params.base_log_time[batch.program] - log_time

            self._jitted["score"] = jax.jit(score)
        return self._chunked("score", reward_params, states)

    def spread_states(self, reward_params, states: list) -> np.ndarray:
        """(N,) the surrogate ensemble's spread (std of its members' log times) on finished
        states; zeros for a model without one (a single network)."""
        model = self.env.reward.model
        if not hasattr(model, "log_time_with_spread"):
            return np.zeros(len(states))
        if "spread" not in self._jitted:

            def spread(reward_params, batch):
                return model.log_time_with_spread(reward_params.context, self.table, batch)[1]

            self._jitted["spread"] = jax.jit(spread)
        return self._chunked("spread", reward_params, states)

    def _chunked(self, name: str, reward_params, states: list) -> np.ndarray:
        """A jitted per-state function over `states` in chunks of one compiled shape."""
        out = []
        for start in range(0, len(states), PREDICT_CHUNK):
            part = states[start : start + PREDICT_CHUNK]
            padded = part + [part[-1]] * (PREDICT_CHUNK - len(part))  # one compiled shape
            batch = jax.tree.map(lambda *rows: np.stack(rows), *padded)
            out.append(np.asarray(self._jitted[name](reward_params, batch))[: len(part)])
        return np.concatenate(out)
