"""Episodes drawn from the action space, through one interface: uniformly over the masked
actions, biased toward deeper schedules, from a trained agent's policy, or around a reference
schedule (the heuristic's) with one of its actions changed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mlirrl_jax.actions import KIND_INDEX, PARALLEL_TILES, TILES_INDEX, TILES_OF
from mlirrl_jax.env.jax_env import JaxEnv, sample_action
from mlirrl_jax.env.observation import Observation
from mlirrl_jax.env.replay import replay
from mlirrl_jax.env.state import ProgramTable
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule

# policy(key, observation) -> action vector, for one (unbatched) observation; jittable
Policy = Callable[[jax.Array, Observation], jax.Array]
# guide(drawn action, observation) -> the action to take instead (host side, unbatched)
Guide = Callable[[np.ndarray, Observation], np.ndarray]
MUTATIONS = ("shift", "replace", "drop", "truncate")


def random_policy(next_weight: float = 1.0) -> Policy:
    """Uniform over the legal actions; `next_weight` < 1 favours deeper schedules."""
    return lambda key, observation: sample_action(key, observation.mask, next_weight)


def agent_policy(run_dir: Path) -> Policy:
    """Actions sampled from the policy network of a trained agent's newest checkpoint (only
    the network: the surrogate it was trained against is not needed to act)."""
    from mlirrl_jax.agent import checkpoint
    from mlirrl_jax.agent.config import AgentConfig
    from mlirrl_jax.agent.networks import abstract, act

    meta = checkpoint.load_meta(Path(run_dir))
    config = AgentConfig.from_json(meta["config"])
    graphdef, like = abstract(config.network)
    params = checkpoint.restore_params(Path(run_dir), like, meta)

    def policy(key: jax.Array, observation: Observation) -> jax.Array:
        batch = jax.tree.map(lambda a: a[None], observation)
        return act(graphdef, params, batch, key)[0][0]

    return policy


class Mutation:
    """A guide that replays a reference action sequence with one change, drawn by `rng`:
    `shift` one tile choice of a tiling action to another legal one, `replace` an action by
    the drawn one, `drop` an action, or `truncate` the reference there and go on with the
    drawn actions. Actions the change made illegal are repaired by the environment's masks;
    past the reference's end, the drawn actions go on."""

    def __init__(self, reference: list[np.ndarray], rng: np.random.Generator):
        self.reference = [np.asarray(a, np.int32) for a in reference]
        self.kind = MUTATIONS[int(rng.integers(len(MUTATIONS)))]
        tiling = [i for i, a in enumerate(self.reference) if np.any(a[TILES_INDEX:] > 0)]
        if self.kind == "shift" and not tiling:
            self.kind = "replace"
        pool = tiling if self.kind == "shift" else range(len(self.reference))
        self.at = int(rng.choice(list(pool))) if len(self.reference) else 0
        self.rng = rng
        self.position = 0

    def __call__(self, drawn: np.ndarray, observation: Observation) -> np.ndarray:
        if self.kind == "drop" and self.position == self.at:
            self.position += 1
        if self.position >= len(self.reference) or (
            self.kind == "truncate" and self.position >= self.at
        ):
            return drawn
        action = self.reference[self.position].copy()
        if self.position == self.at:
            if self.kind == "replace":
                action = drawn
            elif self.kind == "shift":
                action = self._shifted(action, observation)
        self.position += 1
        return action

    def _shifted(self, action: np.ndarray, observation: Observation) -> np.ndarray:
        loops = np.flatnonzero(action[TILES_INDEX:] > 0)
        loop = int(self.rng.choice(loops))
        parallel = TILES_OF[int(action[KIND_INDEX])] == PARALLEL_TILES
        mask = np.asarray(observation.mask.parallel_tile if parallel else observation.mask.tile)
        legal = np.flatnonzero(mask.reshape(-1, mask.shape[-1])[loop])
        others = legal[legal != action[TILES_INDEX + loop]]
        if len(others):
            action[TILES_INDEX + loop] = int(self.rng.choice(others))
        return action


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

    def actions(
        self, program_index: int, key: jax.Array, guide: Guide | None = None
    ) -> list[np.ndarray]:
        """The applied actions of one episode on program `program_index` (`guide`: takes the
        policy's action and the observation, and returns the action to take)."""
        key, reset_key = jax.random.split(key)
        programs = jnp.array([program_index], jnp.int32)
        state, timestep = self._reset(self._params, self.table, programs, reset_key[None])
        actions = []
        while not bool(state.done[0]):
            key, sub = jax.random.split(key)
            action = self._act(sub[None], timestep.observation)
            if guide is not None:
                single = jax.tree.map(lambda a: a[0], timestep.observation)
                action = jnp.asarray(guide(np.asarray(action[0]), single), jnp.int32)[None]
            state, timestep = self._step(self._params, self.table, self._pool, state, action)
            actions.append(np.asarray(timestep.applied_action[0]))
        return actions

    def schedule(
        self, program_index: int, key: jax.Array, guide: Guide | None = None
    ) -> tuple[Schedule, list[np.ndarray]]:
        actions = self.actions(program_index, key, guide)
        schedule, _ = replay(self.programs[program_index], actions)
        return schedule, actions
