"""The pure-JAX environment: `reset` and `step` over `EnvState`, under jit, vmap and scan.

The reward comes from a function passed in, `log_time_fn(table, state) -> predicted log run
time`: the analytic stand-in, or the surrogate cost model. The episode's return is the
predicted log-speedup over the unscheduled program; with `shaping` it is paid as the per-step
decrease of predicted log time (potential-based, so the optimal policy does not change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.actions import (
    ACTION_WIDTH,
    DECOMPOSE,
    INTERCHANGE,
    KIND_INDEX,
    MAX_LOOPS,
    MAX_OPS,
    MAX_STEPS_PER_OP,
    MAX_TILE_LEVELS,
    N_KINDS,
    N_TILE_CHOICES,
    NEXT,
    POINTER_INDEX,
    TILE,
    TILE_FUSE,
    TILE_PARALLEL,
    TILES_INDEX,
    VECTOR_BUDGET,
    VECTORIZE,
)
from mlirrl_jax.env.analytic import analytic_log_time
from mlirrl_jax.env.features import Features, features
from mlirrl_jax.env.state import EnvState, ProgramTable, initial_state

LogTimeFn = Callable[[ProgramTable, EnvState], jax.Array]
MAX_EPISODE_STEPS = MAX_OPS * MAX_STEPS_PER_OP


@struct.dataclass
class ActionMask:
    """Legal choices of each head for the current op (the masks encode legality)."""

    kind: jax.Array  # (N_KINDS,) bool
    tile: jax.Array  # (MAX_LOOPS, N_TILE_CHOICES) bool, for `tile`
    parallel_tile: jax.Array  # (MAX_LOOPS, N_TILE_CHOICES) bool, for tile_parallel/tile_fuse
    pointer: jax.Array  # (MAX_LOOPS,) bool, for interchange


@struct.dataclass
class Observation:
    features: Features
    mask: ActionMask
    candidates: jax.Array  # (MAX_LOOPS, N_TILE_CHOICES) float32, log2 of each choice's size
    cursor: jax.Array  # () int32, the op being scheduled (-1 at the end)


@struct.dataclass
class TimeStep:
    observation: Observation
    reward: jax.Array  # () float32
    done: jax.Array  # () bool: the episode ended with this step
    invalid_action: jax.Array  # () bool: the action broke a mask and was replaced
    applied_action: jax.Array  # (ACTION_WIDTH,) int32: the action as applied (after masks)
    log_speedup: jax.Array  # () float32: predicted log-speedup of the schedule so far


def _current(state: EnvState) -> jax.Array:
    return jnp.maximum(state.cursor, 0)


def action_mask(table: ProgramTable, state: EnvState) -> ActionMask:
    """Which choices of each head are legal for the current op."""
    p, c = state.program, _current(state)
    extents = state.extents[c]
    alive = state.alive[c]
    candidates = table.candidates[p, c]
    reduction = table.is_reduction[p, c]
    fits = (candidates > 0) & (candidates < extents[:, None]) & alive[:, None]
    fits &= extents[:, None] % jnp.maximum(candidates, 1) == 0
    none_column = jnp.arange(N_TILE_CHOICES)[None, :] == 0
    tile = fits | none_column
    parallel_tile = (fits & ~reduction[:, None]) | none_column
    phase = state.phase[c]
    in_interchange = state.ix_count > 0
    free = ~in_interchange & ~state.done
    fused = state.fused_into[c] >= 0
    has_producers = jnp.any(table.fusion_consumer[p] == c)
    n_alive = alive.sum()
    window_out, window_in = table.window_out[p, c], table.window_in[p, c]
    is_window = window_out[0] >= 0
    unit = (window_out >= 0) & (extents[jnp.maximum(window_out, 0)] == 1)
    unit &= extents[jnp.maximum(window_in, 0)] == 1
    unit &= alive[jnp.maximum(window_out, 0)] & alive[jnp.maximum(window_in, 0)]
    vector_points = jnp.prod(jnp.where(alive, extents, 1))
    parallel_ok = free & (phase < 1) & ~fused & jnp.any(fits & ~reduction[:, None])
    kind = jnp.zeros(N_KINDS, bool)
    kind = kind.at[NEXT].set(~in_interchange)
    kind = kind.at[TILE_PARALLEL].set(parallel_ok)
    kind = kind.at[TILE_FUSE].set(parallel_ok & has_producers)
    kind = kind.at[INTERCHANGE].set(in_interchange | (free & (phase < 2) & (n_alive >= 2)))
    kind = kind.at[TILE].set(
        free & (phase <= 3) & (state.n_tiles[c] < MAX_TILE_LEVELS) & jnp.any(fits)
    )
    kind = kind.at[DECOMPOSE].set(
        free & (phase < 4) & is_window & ~state.interchanged[c] & jnp.any(unit)
    )
    kind = kind.at[VECTORIZE].set(
        free & (phase < 5) & (vector_points <= VECTOR_BUDGET) & (~is_window | state.decomposed[c])
    )
    placed = jnp.isin(
        jnp.arange(MAX_LOOPS), jnp.where(jnp.arange(MAX_LOOPS) < state.ix_count, state.ix_order, -1)
    )
    pointer = alive & ~placed
    return ActionMask(kind, tile, parallel_tile, pointer)


def sanitize(mask: ActionMask, action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Replace choices a mask forbids (kind -> next op or the interchange in progress,
    tile choice -> no tiling, pointer -> first legal loop); also says whether it had to."""
    kind = action[KIND_INDEX]
    kind_ok = mask.kind[kind]
    fallback = jnp.where(mask.kind[NEXT], NEXT, INTERCHANGE)
    kind = jnp.where(kind_ok, kind, fallback)
    tiles = action[TILES_INDEX:]
    tile_mask = jnp.where(
        (kind == TILE_PARALLEL) | (kind == TILE_FUSE), mask.parallel_tile, mask.tile
    )
    tiles_ok = jnp.take_along_axis(tile_mask, tiles[:, None], axis=1)[:, 0]
    uses_tiles = (kind == TILE) | (kind == TILE_PARALLEL) | (kind == TILE_FUSE)
    tiles = jnp.where(tiles_ok, tiles, 0)
    pointer = action[POINTER_INDEX]
    pointer_ok = mask.pointer[pointer]
    pointer = jnp.where(pointer_ok, pointer, jnp.argmax(mask.pointer))
    invalid = ~kind_ok | (uses_tiles & ~jnp.all(tiles_ok)) | ((kind == INTERCHANGE) & ~pointer_ok)
    clean = jnp.concatenate([jnp.stack([kind, pointer]), tiles]).astype(jnp.int32)
    return clean, invalid


def _sizes(table: ProgramTable, state: EnvState, tiles: jax.Array) -> jax.Array:
    candidates = table.candidates[state.program, _current(state)]
    return jnp.take_along_axis(candidates, tiles[:, None], axis=1)[:, 0]


def _tile(state: EnvState, c, sizes) -> EnvState:
    # levels are packed: a tiling that tiles nothing uses up a level but leaves no gap
    level = jnp.sum(jnp.any(state.tile_sizes[c] > 0, axis=1))
    extents = jnp.where(sizes > 0, sizes, state.extents[c])
    return state.replace(
        tile_sizes=state.tile_sizes.at[c, level].set(sizes),
        extents=state.extents.at[c].set(extents),
        n_tiles=state.n_tiles.at[c].add(1),
        phase=state.phase.at[c].set(3),
    )


def _parallel(table: ProgramTable, state: EnvState, c, sizes, fuse) -> EnvState:
    extents = state.extents.at[c].set(jnp.where(sizes > 0, sizes, state.extents[c]))
    fused_into = state.fused_into
    fuse = fuse & jnp.any(sizes > 0)
    consumer = table.fusion_consumer[state.program]
    loop_map = table.fusion_loop_map[state.program]
    safe_consumer = jnp.maximum(consumer, 0)

    def pull_in_producers(_, carry):
        extents, fused_into = carry
        reachable = (consumer == c) | (fused_into[safe_consumer] == c)
        eligible = fuse & (consumer >= 0) & reachable & (fused_into < 0)
        from_consumer = jnp.take_along_axis(
            extents[safe_consumer], jnp.maximum(loop_map, 0), axis=1
        )
        new = jnp.where(loop_map >= 0, from_consumer, extents)
        return jnp.where(eligible[:, None], new, extents), jnp.where(eligible, c, fused_into)

    extents, fused_into = jax.lax.fori_loop(0, MAX_OPS, pull_in_producers, (extents, fused_into))
    return state.replace(
        parallel_sizes=state.parallel_sizes.at[c].set(sizes),
        extents=extents,
        fused_into=fused_into,
        did_fuse=state.did_fuse.at[c].set(fuse),
        phase=state.phase.at[c].set(1),
    )


def _interchange(state: EnvState, c, pointer) -> EnvState:
    ix_order = state.ix_order.at[state.ix_count].set(pointer)
    count = state.ix_count + 1
    alive = state.alive[c]
    complete = count >= alive.sum() - 1
    placed = jnp.isin(jnp.arange(MAX_LOOPS), jnp.where(jnp.arange(MAX_LOOPS) < count, ix_order, -1))
    last = jnp.argmax(alive & ~placed)
    ix_order = jnp.where(complete, ix_order.at[count].set(last), ix_order)
    return state.replace(
        order=jnp.where(complete, state.order.at[c].set(ix_order), state.order),
        interchanged=state.interchanged.at[c].set(state.interchanged[c] | complete),
        phase=jnp.where(complete, state.phase.at[c].set(2), state.phase),
        ix_count=jnp.where(complete, 0, count),
        ix_order=jnp.where(complete, jnp.full(MAX_LOOPS, -1, jnp.int32), ix_order),
    )


def _decompose(table: ProgramTable, state: EnvState, c) -> EnvState:
    p = state.program
    window_out, window_in = table.window_out[p, c], table.window_in[p, c]
    extents, alive = state.extents[c], state.alive[c]
    unit = (window_out >= 0) & (extents[jnp.maximum(window_out, 0)] == 1)
    unit &= (extents[jnp.maximum(window_in, 0)] == 1) & alive[jnp.maximum(window_out, 0)]
    w = jnp.argmax(unit)  # the H window first, as MLIR's decomposition does
    gone = (jnp.arange(MAX_LOOPS) == window_out[w]) | (jnp.arange(MAX_LOOPS) == window_in[w])
    order = state.order[c]
    dead = (order < 0) | jnp.isin(order, jnp.where(gone, jnp.arange(MAX_LOOPS), -2))
    compact = order[jnp.argsort(dead, stable=True)]
    compact = jnp.where(jnp.sort(dead), -1, compact)
    return state.replace(
        alive=state.alive.at[c].set(alive & ~gone),
        order=state.order.at[c].set(compact),
        decomposed=state.decomposed.at[c].set(True),
        phase=state.phase.at[c].set(4),
    )


def _advance(state: EnvState, move) -> EnvState:
    return state.replace(
        cursor=jnp.where(move, state.cursor - 1, state.cursor),
        steps_in_op=jnp.where(move, 0, state.steps_in_op),
    )


def transition(
    table: ProgramTable, state: EnvState, action: jax.Array
) -> tuple[EnvState, jax.Array, jax.Array]:
    """Apply one action (sanitized against the masks) to the current op.

    Returns the new state, whether the action had to be sanitized, and the applied action.
    """
    clean, invalid = sanitize(action_mask(table, state), action)
    kind, pointer, tiles = clean[KIND_INDEX], clean[POINTER_INDEX], clean[TILES_INDEX:]
    c = _current(state)
    sizes = _sizes(table, state, tiles)
    branches = [
        lambda s: s,
        lambda s: _parallel(table, s, c, sizes, False),
        lambda s: _parallel(table, s, c, sizes, True),
        lambda s: _interchange(s, c, pointer),
        lambda s: _tile(s, c, sizes),
        lambda s: _decompose(table, s, c),
        lambda s: s.replace(vectorized=s.vectorized.at[c].set(True), phase=s.phase.at[c].set(5)),
    ]
    active = ~state.done
    new = jax.lax.switch(kind, branches, state)
    new = new.replace(steps=state.steps + 1, steps_in_op=state.steps_in_op + 1)
    # vectorization ends an op's grammar: move on without spending a `next` step
    new = _advance(new, (kind == NEXT) | (kind == VECTORIZE))
    new = jax.tree.map(lambda a, b: jnp.where(active, a, b), new, state)
    return new, invalid & active, clean


@dataclass(frozen=True)
class JaxEnv:
    """Schedules programs of a table; pure `reset`/`step` functions of (table, state, ...)."""

    log_time_fn: LogTimeFn = field(default=analytic_log_time)
    shaping: bool = False  # pay per-step decreases of predicted log time
    auto_reset: bool = True  # a finished episode restarts on a random program of the pool

    def observe(self, table: ProgramTable, state: EnvState) -> Observation:
        candidates = table.candidates[state.program, _current(state)]
        log_candidates = jnp.where(candidates > 0, jnp.log2(jnp.maximum(candidates, 1)) + 1.0, 0.0)
        return Observation(
            features(table, state),
            action_mask(table, state),
            log_candidates.astype(jnp.float32),
            state.cursor,
        )

    def observation_spec(self, table: ProgramTable) -> Observation:
        """Shapes and dtypes of every observation array (jax.ShapeDtypeStruct leaves)."""
        state = jax.eval_shape(lambda: initial_state(table, jnp.int32(0), jax.random.PRNGKey(0)))
        return jax.eval_shape(self.observe, table, state)

    @staticmethod
    def action_spec() -> dict:
        """The action vector and the number of choices of each head."""
        return {
            "action": jax.ShapeDtypeStruct((ACTION_WIDTH,), jnp.int32),
            "kind": N_KINDS,
            "pointer": MAX_LOOPS,
            "tiles": (MAX_LOOPS, N_TILE_CHOICES),
        }

    def reset_to(
        self, table: ProgramTable, program: jax.Array, key: jax.Array
    ) -> tuple[EnvState, TimeStep]:
        """Start an episode on a given program row."""
        state = initial_state(table, program, key)
        log_time = self.log_time_fn(table, state).astype(jnp.float32)
        state = state.replace(base_log_time=log_time, log_time=log_time)
        return state, TimeStep(
            self.observe(table, state),
            jnp.float32(0.0),
            jnp.bool_(False),
            jnp.bool_(False),
            jnp.zeros(ACTION_WIDTH, jnp.int32),
            jnp.float32(0.0),
        )

    def reset(
        self, key: jax.Array, table: ProgramTable, pool: jax.Array
    ) -> tuple[EnvState, TimeStep]:
        """Start an episode on a program drawn from `pool` (program rows)."""
        key, pick = jax.random.split(key)
        program = pool[jax.random.randint(pick, (), 0, pool.shape[0])]
        return self.reset_to(table, program, key)

    def step(
        self, table: ProgramTable, pool: jax.Array, state: EnvState, action: jax.Array
    ) -> tuple[EnvState, TimeStep]:
        """One action; the reward is the (shaped or terminal) predicted log-speedup."""
        new, invalid, applied = transition(table, state, action)
        log_time = self.log_time_fn(table, new).astype(jnp.float32)
        new = new.replace(log_time=log_time)
        done = new.done & ~state.done
        if self.shaping:
            reward = state.log_time - log_time
        else:
            reward = jnp.where(done, new.base_log_time - log_time, 0.0)
        timestep = TimeStep(
            self.observe(table, new),
            reward.astype(jnp.float32),
            done,
            invalid,
            applied,
            (new.base_log_time - log_time).astype(jnp.float32),
        )
        if self.auto_reset:
            fresh, fresh_step = self.reset(new.key, table, pool)
            new = jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, new)
            observation = jax.tree.map(
                lambda a, b: jnp.where(done, a, b), fresh_step.observation, timestep.observation
            )
            timestep = timestep.replace(observation=observation)
        return new, timestep


def sample_action(key: jax.Array, mask: ActionMask, next_weight: float = 1.0) -> jax.Array:
    """A random legal action: kind, then its tile choices and pointer, uniform over what the
    masks allow; `next_weight` < 1 makes moving on rarer, for deeper schedules."""
    kind_key, tile_key, pointer_key = jax.random.split(key, 3)
    kind_logits = jnp.zeros(N_KINDS).at[NEXT].set(jnp.log(next_weight))
    kind = jax.random.categorical(kind_key, jnp.where(mask.kind, kind_logits, -1e9))
    parallel = (kind == TILE_PARALLEL) | (kind == TILE_FUSE)
    tile_mask = jnp.where(parallel, mask.parallel_tile, mask.tile)
    tiles = jax.random.categorical(tile_key, jnp.where(tile_mask, 0.0, -1e9), axis=-1)
    pointer = jax.random.categorical(pointer_key, jnp.where(mask.pointer, 0.0, -1e9))
    return jnp.concatenate([jnp.stack([kind, pointer]), tiles]).astype(jnp.int32)


def run_actions(table: ProgramTable, program: jax.Array, actions: jax.Array) -> EnvState:
    """The state `actions` (T, ACTION_WIDTH) reach on `program` (pad with `next`: a finished
    episode ignores further actions). Jittable and vmappable: it replays stored schedules
    through the same `transition` the environment steps with."""
    state = initial_state(table, program, jax.random.PRNGKey(0))

    def body(state, action):
        return transition(table, state, action)[0], None

    return jax.lax.scan(body, state, actions)[0]
