"""The agent starting from what is known: refinements of the heuristic's schedule.

A refinement replays the heuristic's action sequence (`schedule_to_actions`, sizes moved to
the nearest offered candidate) with one change, and the agent's policy makes the choices the
change leaves open:

- `truncate`: the heuristic's first c actions, then the policy to the end of the episode;
- `replace`: the policy's action at one step, the heuristic's everywhere else;
- `shift`: one tile choice of one tiling action moved to a neighbouring candidate;
- `drop`: one action left out.

Actions a change made illegal are repaired by the environment's masks, so every refinement is
a legal schedule of the action space. The surrogate scores them all in the same jitted
episodes that run them (`Evaluator.guided_episodes`); the agent's proposals then hold the
heuristic's own schedule, the best refinements and the agent's own schedules
(`Agent.proposals`).
"""

from __future__ import annotations

import numpy as np

from mlirrl_jax.actions import ACTION_WIDTH, N_TILE_CHOICES, NEXT, TILES_INDEX, encode_action
from mlirrl_jax.agent.rollout import Forced
from mlirrl_jax.env.jax_env import MAX_EPISODE_STEPS

CHANGES = ("truncate", "replace", "shift", "drop")


def _shifted(action: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """The action with one tiled loop's choice moved one candidate up or down (None: the
    action tiles nothing)."""
    loops = np.flatnonzero(action[TILES_INDEX:] > 0)
    if not len(loops):
        return None
    out = action.copy()
    loop = TILES_INDEX + int(rng.choice(loops))
    moves = [c for c in (out[loop] - 1, out[loop] + 1) if 1 <= c < N_TILE_CHOICES]
    out[loop] = int(rng.choice(moves))
    return out


def refinement(reference: list[np.ndarray], rng: np.random.Generator) -> tuple[list, int]:
    """One change to `reference`: the actions to force and the step left to the policy
    (-1: none). An empty reference forces nothing: the policy's own episode."""
    if not reference:
        return [], -1
    change = CHANGES[int(rng.integers(len(CHANGES)))]
    at = int(rng.integers(len(reference)))
    if change == "truncate":
        return reference[:at], -1
    if change == "replace":
        return reference, at
    if change == "shift":
        tiling = [i for i, a in enumerate(reference) if np.any(a[TILES_INDEX:] > 0)]
        if tiling:
            at = int(rng.choice(tiling))
            return [*reference[:at], _shifted(reference[at], rng), *reference[at + 1 :]], -1
        return reference, at  # nothing to shift: a replacement instead
    return [*reference[:at], *reference[at + 1 :]], -1  # drop


def forced_refinements(
    references: list[list[np.ndarray]], per_reference: int, rows: int, seed: int = 0
) -> Forced:
    """`per_reference` changes of each reference, one episode row each, in reference order
    (row r * per_reference + j), padded with rows that force nothing up to `rows`."""
    if rows < len(references) * per_reference:
        raise ValueError(f"{rows} rows cannot hold {len(references) * per_reference} episodes")
    rng = np.random.default_rng(seed)
    actions = np.tile(encode_action(NEXT), (rows, MAX_EPISODE_STEPS, 1)).astype(np.int32)
    length = np.zeros(rows, np.int32)
    free_at = np.full(rows, -1, np.int32)
    row = 0
    for reference in references:
        reference = [np.asarray(a, np.int32).reshape(ACTION_WIDTH) for a in reference]
        for _ in range(per_reference):
            forced, free = refinement(reference, rng)
            forced = forced[:MAX_EPISODE_STEPS]
            if forced:
                actions[row, : len(forced)] = np.stack(forced)
            length[row], free_at[row] = len(forced), free
            row += 1
    return Forced(actions=actions, length=length, free_at=free_at)
