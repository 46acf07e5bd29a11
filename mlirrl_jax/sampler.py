"""Episodes drawn from the action space: uniformly over the masked actions, biased toward
deeper schedules, or (later) from a trained policy, through one interface."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mlirrl_jax.env.jax_env import JaxEnv, sample_action
from mlirrl_jax.env.observation import Observation
from mlirrl_jax.env.replay import replay
from mlirrl_jax.env.state import ProgramTable, encode_programs
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule

# policy(key, observation) -> action vector, for one (unbatched) observation; jittable
Policy = Callable[[jax.Array, Observation], jax.Array]


def random_policy(next_weight: float = 1.0) -> Policy:
    """Uniform over the legal actions; `next_weight` < 1 favours deeper schedules."""
    return lambda key, observation: sample_action(key, observation.mask, next_weight)


class EpisodeSampler:
    """Runs a policy in the JAX environment on chosen programs and returns their schedules."""

    def __init__(
        self,
        programs: list[Program],
        policy: Policy | None = None,
        table: ProgramTable | None = None,
    ):
        self.programs = programs
        self.table = table if table is not None else encode_programs(programs)
        env = JaxEnv(auto_reset=False)  # its (analytic) reward goes unused
        self._pool = jnp.arange(len(programs))
        self._params = jax.jit(env.reward.prepare)(None, self.table)
        self._reset = jax.jit(env.reset_to)
        self._step = jax.jit(env.step)
        self._act = jax.jit(jax.vmap(policy or random_policy()))

    def actions(self, program_index: int, key: jax.Array) -> list[np.ndarray]:
        """The applied actions of one episode on program `program_index`."""
        key, reset_key = jax.random.split(key)
        programs = jnp.array([program_index], jnp.int32)
        state, timestep = self._reset(self._params, self.table, programs, reset_key[None])
        actions = []
        while not bool(state.done[0]):
            key, sub = jax.random.split(key)
            action = self._act(sub[None], timestep.observation)
            state, timestep = self._step(self._params, self.table, self._pool, state, action)
            actions.append(np.asarray(timestep.applied_action[0]))
        return actions

    def schedule(self, program_index: int, key: jax.Array) -> tuple[Schedule, list[np.ndarray]]:
        actions = self.actions(program_index, key)
        schedule, _ = replay(self.programs[program_index], actions)
        return schedule, actions
