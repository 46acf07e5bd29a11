"""The real environment: Gymnasium API over the same actions, rewarded by real measurement.

The state evolves with the JAX environment's `transition` (one environment, jitted), so masks
and schedules are exactly those of the simulated environment. When an episode ends, its
schedule is compiled, verified and timed with the measurement runner; the reward is the
log-speedup over the unscheduled program (cached per schedule hash), or `failure_reward` if the
schedule does not verify. Each episode leaves a replayable `EpisodeRecord`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from mlirrl_jax.actions import MAX_LOOPS, MAX_OPS, N_KINDS, N_TILE_CHOICES
from mlirrl_jax.env.jax_env import JaxEnv
from mlirrl_jax.env.observation import CANDIDATE_OBS, LOOP_OBS, OP_OBS
from mlirrl_jax.env.replay import replay
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.programs.ir import Program, load_program
from mlirrl_jax.schedule import Schedule

FEATURE_BOUND = 16.0  # observations are scaled logs, flags and counts: well inside this


@dataclass
class EpisodeRecord:
    """What reproduces an episode: the program, the applied actions, and what they gave."""

    program: str
    program_hash: str
    actions: list[list[int]]
    schedule: dict
    schedule_hash: str
    reward: float | None = None
    measurement: dict = field(default_factory=dict)

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str) -> EpisodeRecord:
        return cls(**json.loads(text))


def observation_space() -> spaces.Dict:
    return spaces.Dict(
        {
            "ops": spaces.Box(-FEATURE_BOUND, FEATURE_BOUND, (MAX_OPS, OP_OBS), np.float32),
            "loops": spaces.Box(-FEATURE_BOUND, FEATURE_BOUND, (MAX_LOOPS, LOOP_OBS), np.float32),
            "op_valid": spaces.MultiBinary(MAX_OPS),
            "loop_valid": spaces.MultiBinary(MAX_LOOPS),
            "candidates": spaces.Box(
                -FEATURE_BOUND,
                FEATURE_BOUND,
                (MAX_LOOPS, N_TILE_CHOICES, CANDIDATE_OBS),
                np.float32,
            ),
            "kind_mask": spaces.MultiBinary(N_KINDS),
            "tile_mask": spaces.MultiBinary((MAX_LOOPS, N_TILE_CHOICES)),
            "parallel_tile_mask": spaces.MultiBinary((MAX_LOOPS, N_TILE_CHOICES)),
            "pointer_mask": spaces.MultiBinary(MAX_LOOPS),
            "cursor": spaces.Discrete(MAX_OPS),
        }
    )


class MlirRlEnv(gym.Env):
    """Schedule one program per episode; the reward is measured on this machine."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        programs: list[Program | str],
        runner: Runner | None = None,
        threads: int = 1,
        method: TimingMethod | None = None,
        failure_reward: float = -1.0,
        render_mode: str | None = None,
    ):
        self.programs = [p if isinstance(p, Program) else load_program(p) for p in programs]
        self.table = encode_programs(self.programs, threads=threads)  # the count is observed
        self.runner = runner or Runner()
        self.threads = threads
        self.method = method or TimingMethod()
        self.failure_reward = failure_reward
        self.render_mode = render_mode
        self.action_space = spaces.MultiDiscrete(
            [N_KINDS, MAX_LOOPS] + [N_TILE_CHOICES] * MAX_LOOPS
        )
        self.observation_space = observation_space()
        # the simulated environment steps the state; its (analytic) reward goes unused
        self._jax_env = JaxEnv(auto_reset=False)
        self._pool = jnp.arange(len(self.programs))
        self._params = jax.jit(self._jax_env.reward.prepare)(None, self.table)
        self._step = jax.jit(self._jax_env.step)
        self._reset = jax.jit(self._jax_env.reset_to)
        self._measured: dict[tuple[str, str, int], Measurement] = {}
        self._state = None
        self._actions: list[np.ndarray] = []
        self._program_index = 0
        self.last_record: EpisodeRecord | None = None

    def _observation(self, timestep) -> dict:
        obs = jax.tree.map(lambda a: np.asarray(a[0]), timestep.observation)  # batch of one
        pad = MAX_OPS - obs.ops.shape[0]  # op tokens cover the table's op slots: pad to all
        return {
            "ops": np.pad(obs.ops, ((0, pad), (0, 0))),
            "loops": obs.loops,
            "op_valid": np.pad(obs.op_valid, (0, pad)).astype(np.int8),
            "loop_valid": obs.loop_valid.astype(np.int8),
            "candidates": obs.candidates,
            "kind_mask": obs.mask.kind.astype(np.int8),
            "tile_mask": obs.mask.tile.astype(np.int8),
            "parallel_tile_mask": obs.mask.parallel_tile.astype(np.int8),
            "pointer_mask": obs.mask.pointer.astype(np.int8),
            "cursor": int(max(int(obs.cursor), 0)),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start on `options["program"]` (index or name), else on a random program."""
        super().reset(seed=seed)
        choice = (options or {}).get("program")
        if choice is None:
            self._program_index = int(self.np_random.integers(len(self.programs)))
        elif isinstance(choice, str):
            names = [p.name for p in self.programs]
            if choice not in names:
                raise ConfigError(f"unknown program {choice!r}; this env has {names[:5]}...")
            self._program_index = names.index(choice)
        else:
            self._program_index = int(choice)
        key = jax.random.PRNGKey(int(self.np_random.integers(2**31)))
        self._state, timestep = self._reset(
            self._params, self.table, jnp.array([self._program_index], jnp.int32), key[None]
        )
        self._actions = []
        self.last_record = None
        return self._observation(timestep), {"program": self.program.name}

    @property
    def program(self) -> Program:
        return self.programs[self._program_index]

    def measure(self, program: Program, schedule: Schedule) -> Measurement:
        """A real measurement, cached by (program, schedule, threads)."""
        key = (program.hash, schedule.hash, self.threads)
        if key not in self._measured:
            threads = self.threads if not schedule.is_empty else 1
            self._measured[key] = self.runner.measure(
                program, schedule, threads=threads, method=self.method
            )
        return self._measured[key]

    def step(self, action):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        action = np.asarray(action, np.int32)
        if action.shape != self.action_space.shape:
            raise ConfigError(
                f"action has shape {action.shape}; expected {self.action_space.shape}"
            )
        self._state, timestep = self._step(
            self._params, self.table, self._pool, self._state, jnp.asarray(action)[None]
        )
        applied = np.asarray(timestep.applied_action[0])
        self._actions.append(applied)
        terminated = bool(timestep.done[0])
        info = {"invalid_action": bool(timestep.invalid_action[0]), "applied_action": applied}
        reward = 0.0
        if terminated:
            reward, record = self._finish()
            info.update(schedule=record.schedule, measurement=record.measurement, record=record)
        return self._observation(timestep), reward, terminated, False, info

    def _finish(self) -> tuple[float, EpisodeRecord]:
        schedule, _ = replay(self.program, self._actions)
        base = self.measure(self.program, Schedule())
        result = self.measure(self.program, schedule)
        if base.ok and result.ok:
            reward = math.log(base.median_s / result.median_s)
        else:
            reward = self.failure_reward
        self.last_record = EpisodeRecord(
            program=self.program.name,
            program_hash=self.program.hash,
            actions=[a.tolist() for a in self._actions],
            schedule=schedule.to_json(),
            schedule_hash=schedule.hash,
            reward=reward,
            measurement=result.to_json(),
        )
        return reward, self.last_record

    def replay_record(self, record: EpisodeRecord) -> EpisodeRecord:
        """Re-run a recorded episode's actions (its program must be in this env)."""
        matches = [i for i, p in enumerate(self.programs) if p.hash == record.program_hash]
        if not matches:
            raise ConfigError(
                f"program {record.program} ({record.program_hash[:12]}) is not in this env"
            )
        self.reset(options={"program": matches[0]})
        for action in record.actions:
            _, _, terminated, _, info = self.step(action)
            if terminated:
                break
        if self.last_record is None or self.last_record.schedule_hash != record.schedule_hash:
            raise ConfigError("replaying the actions did not reproduce the recorded schedule")
        return self.last_record

    def render(self):
        if self.render_mode == "ansi":
            schedule, _ = replay(self.program, self._actions)
            return f"{self.program.name}: {schedule.describe()}"
        return None

    def close(self):
        self.runner.close()
