"""The pure-JAX environment: batched `reset` and `step` over `EnvState`, under jit and scan.

The environment steps a batch of episodes at once (`vmap` inside), each on its own program of
a `ProgramTable`. The reward is a function passed in (`env/reward.py`): a cost model's pure
log-time function over a parameter pytree that every call receives, paid as the terminal
log-speedup or shaped per step. The reward runs on the whole batch, so a terminal reward asks
the cost model only about the episodes that just ended. What the agent sees is the versioned
`Observation` (`env/observation.py`), not the surrogate's features.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.actions import (
    ACTION_WIDTH,
    DECOMPOSE,
    ENDS_OP,
    INTERCHANGE,
    KIND_INDEX,
    MAX_EPISODE_STEPS,
    MAX_LOOPS,
    MAX_OPS,
    MAX_TILE_LEVELS,
    MAY_FOLLOW,
    N_KINDS,
    N_TILE_CHOICES,
    NEXT,
    PACK,
    PARALLEL_TILES,
    PHASE_OF,
    POINTER_INDEX,
    TILE,
    TILE_FUSE,
    TILE_PARALLEL,
    TILES_INDEX,
    TILES_OF,
    USES_POINTER,
    USES_TILES,
    VECTOR_BUDGET,
    VECTORIZE,
)
from mlirrl_jax.env.observation import (
    ActionMask,
    Observation,
    current_op,
    observe,
    placed_loops,
)
from mlirrl_jax.env.reward import Reward, RewardParams, TerminalReward
from mlirrl_jax.env.state import EnvState, ProgramTable, initial_state


@struct.dataclass
class TimeStep:
    """What a batched `step` returns per environment (arrays with a leading batch axis)."""

    observation: Observation  # of the next state (a fresh episode's first, after auto-reset)
    reward: jax.Array  # () float32
    discount: jax.Array  # () float32: 0 when the episode terminated with this step, else 1
    done: jax.Array  # () bool: the episode ended with this step (terminated or truncated)
    truncated: jax.Array  # () bool: cut at the step limit before its schedule was finished
    invalid_action: jax.Array  # () bool: the action broke a mask and was replaced
    applied_action: jax.Array  # (ACTION_WIDTH,) int32: the action as applied (after masks)
    log_speedup: jax.Array  # () float32: the finished schedule's predicted log-speedup (0 else)


def _unit_windows(table: ProgramTable, state: EnvState, c) -> jax.Array:
    """(2,) bool: which of op `c`'s sliding windows (H, W) have their output row and window
    row tiled to 1, both loops still there: what decomposition needs."""
    p = state.program
    window_out, window_in = table.window_out[p, c], table.window_in[p, c]
    extents, alive = state.extents[c], state.alive[c]
    out, inner = jnp.maximum(window_out, 0), jnp.maximum(window_in, 0)
    return (
        (window_out >= 0) & (extents[out] == 1) & (extents[inner] == 1) & alive[out] & alive[inner]
    )


def action_mask(table: ProgramTable, state: EnvState) -> ActionMask:
    """Which choices of each head are legal for the current op (one state)."""
    p, c = state.program, current_op(state)
    extents = state.extents[c]
    alive = state.alive[c]
    candidates = table.candidates[p, c]
    reduction = table.is_reduction[p, c]
    fits = (candidates > 0) & (candidates < extents[:, None]) & alive[:, None]
    # a sequential tile may leave a partial last tile (the pipeline peels it, so every copy
    # stays static); a forall's chunks must divide (a partial chunk would vectorize masked,
    # which sliding windows and fused producers do not support)
    divides = fits & (extents[:, None] % jnp.maximum(candidates, 1) == 0)
    none_column = jnp.arange(N_TILE_CHOICES)[None, :] == 0
    tile = fits | none_column
    parallel_tile = (divides & ~reduction[:, None]) | none_column
    phase = state.phase[c]
    grammar = jnp.asarray(MAY_FOLLOW)[phase]  # the step grammar (actions.GRAMMAR)
    in_interchange = state.ix_count > 0
    free = ~in_interchange & ~state.done
    fused = state.fused_into[c] >= 0
    has_producers = jnp.any(table.fusion_consumer[p] == c)
    unit = _unit_windows(table, state, c)
    vector_points = jnp.prod(jnp.where(alive, extents, 1))
    parallel_ok = free & ~fused & jnp.any(divides & ~reduction[:, None])
    legal = jnp.zeros(N_KINDS, bool)
    legal = legal.at[NEXT].set(~in_interchange)
    legal = legal.at[TILE_PARALLEL].set(parallel_ok)
    legal = legal.at[TILE_FUSE].set(parallel_ok & has_producers)
    legal = legal.at[INTERCHANGE].set(in_interchange | (free & (alive.sum() >= 2)))
    legal = legal.at[TILE].set(free & (state.n_tiles[c] < MAX_TILE_LEVELS) & jnp.any(fits))
    # MLIR decomposes only named 2-D windows, and vectorizes a window only once decomposed (or
    # a depthwise NCHW window, a gather, not at all: `programs.analysis.vectorizable`)
    decomposable = table.decomposable[p, c]
    legal = legal.at[DECOMPOSE].set(free & decomposable & ~state.interchanged[c] & jnp.any(unit))
    legal = legal.at[VECTORIZE].set(
        free & (vector_points <= VECTOR_BUDGET) & (table.vectorizable[p, c] | state.decomposed[c])
    )
    # pack hoists B's copy out of the last tiling's loops: an op `pack` applies to, tiled
    # (sequentially, into whole tiles), so that one static panel fits every tile
    tiled = (phase == PHASE_OF[TILE]) & jnp.any(state.tile_sizes[c] > 0)
    legal = legal.at[PACK].set(free & table.packable[p, c] & tiled & ~state.ragged[c])
    pointer = alive & ~placed_loops(state)
    return ActionMask(legal & grammar, tile, parallel_tile, pointer)


def tile_mask_of(mask: ActionMask, kind: jax.Array) -> jax.Array:
    """(..., MAX_LOOPS, N_TILE_CHOICES) the tile mask `kind`'s tile heads read
    (`actions.TILES_OF`), over any leading batch axes shared by `mask` and `kind`."""
    parallel = (jnp.asarray(TILES_OF)[kind] == PARALLEL_TILES)[..., None, None]
    return jnp.where(parallel, mask.parallel_tile, mask.tile)


def sanitize(mask: ActionMask, action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Replace choices a mask forbids (kind -> next op or the interchange in progress,
    tile choice -> no tiling, pointer -> first legal loop); also says whether it had to."""
    kind = action[KIND_INDEX]
    kind_ok = mask.kind[kind]
    fallback = jnp.where(mask.kind[NEXT], NEXT, INTERCHANGE)
    kind = jnp.where(kind_ok, kind, fallback)
    tiles = action[TILES_INDEX:]
    tiles_ok = jnp.take_along_axis(tile_mask_of(mask, kind), tiles[:, None], axis=1)[:, 0]
    tiles = jnp.where(tiles_ok, tiles, 0)
    pointer = action[POINTER_INDEX]
    pointer_ok = mask.pointer[pointer]
    pointer = jnp.where(pointer_ok, pointer, jnp.argmax(mask.pointer))
    invalid = (
        ~kind_ok
        | (jnp.asarray(USES_TILES)[kind] & ~jnp.all(tiles_ok))
        | (jnp.asarray(USES_POINTER)[kind] & ~pointer_ok)
    )
    clean = jnp.concatenate([jnp.stack([kind, pointer]), tiles]).astype(jnp.int32)
    return clean, invalid


def _sizes(table: ProgramTable, state: EnvState, tiles: jax.Array) -> jax.Array:
    candidates = table.candidates[state.program, current_op(state)]
    return jnp.take_along_axis(candidates, tiles[:, None], axis=1)[:, 0]


def _tile(state: EnvState, c, sizes) -> EnvState:
    # levels are packed: a tiling that tiles nothing uses up a level but leaves no gap
    level = jnp.sum(jnp.any(state.tile_sizes[c] > 0, axis=1))
    extents = jnp.where(sizes > 0, sizes, state.extents[c])
    partial = jnp.any((sizes > 0) & (state.extents[c] % jnp.maximum(sizes, 1) != 0))
    return state.replace(
        tile_sizes=state.tile_sizes.at[c, level].set(sizes),
        extents=state.extents.at[c].set(extents),
        n_tiles=state.n_tiles.at[c].add(1),
        ragged=state.ragged.at[c].set(state.ragged[c] | partial),
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
        ix_count=jnp.where(complete, 0, count),
        ix_order=jnp.where(complete, jnp.full(MAX_LOOPS, -1, jnp.int32), ix_order),
    )


def _decompose(table: ProgramTable, state: EnvState, c) -> EnvState:
    p = state.program
    window_out, window_in = table.window_out[p, c], table.window_in[p, c]
    alive = state.alive[c]
    w = jnp.argmax(_unit_windows(table, state, c))  # the H window first, as MLIR decomposes
    gone = (jnp.arange(MAX_LOOPS) == window_out[w]) | (jnp.arange(MAX_LOOPS) == window_in[w])
    order = state.order[c]
    dead = (order < 0) | jnp.isin(order, jnp.where(gone, jnp.arange(MAX_LOOPS), -2))
    compact = order[jnp.argsort(dead, stable=True)]
    compact = jnp.where(jnp.sort(dead), -1, compact)
    return state.replace(
        alive=state.alive.at[c].set(alive & ~gone),
        order=state.order.at[c].set(compact),
        decomposed=state.decomposed.at[c].set(True),
    )


def _advance(state: EnvState, move) -> EnvState:
    return state.replace(cursor=jnp.where(move, state.cursor - 1, state.cursor))


def transition(
    table: ProgramTable, state: EnvState, action: jax.Array
) -> tuple[EnvState, jax.Array, jax.Array]:
    """Apply one action (sanitized against the masks) to the current op of one state.

    Returns the new state, whether the action had to be sanitized, and the applied action.
    """
    clean, invalid = sanitize(action_mask(table, state), action)
    kind, pointer, tiles = clean[KIND_INDEX], clean[POINTER_INDEX], clean[TILES_INDEX:]
    c = current_op(state)
    sizes = _sizes(table, state, tiles)
    branches = [
        lambda s: s,
        lambda s: _parallel(table, s, c, sizes, False),
        lambda s: _parallel(table, s, c, sizes, True),
        lambda s: _interchange(s, c, pointer),
        lambda s: _tile(s, c, sizes),
        lambda s: _decompose(table, s, c),
        lambda s: s.replace(vectorized=s.vectorized.at[c].set(True)),
        lambda s: s.replace(packed=s.packed.at[c].set(True)),
    ]
    active = ~state.done
    new = jax.lax.switch(kind, branches, state)
    # the kind moves the op to its grammar phase (an interchange once all loops are placed)
    moved = (kind != NEXT) & ((kind != INTERCHANGE) | new.interchanged[c])
    new = new.replace(
        phase=jnp.where(moved, new.phase.at[c].set(jnp.asarray(PHASE_OF)[kind]), new.phase),
        steps=state.steps + 1,
    )
    new = _advance(new, jnp.asarray(ENDS_OP)[kind])
    new = jax.tree.map(lambda a, b: jnp.where(active, a, b), new, state)
    return new, invalid & active, clean


def _select(flag: jax.Array, on_true, on_false):
    """Per batch row: `on_true` where `flag`, else `on_false` (matching pytrees)."""
    return jax.tree.map(
        lambda a, b: jnp.where(flag.reshape(flag.shape + (1,) * (a.ndim - 1)), a, b),
        on_true,
        on_false,
    )


@dataclass(frozen=True)
class JaxEnv:
    """Schedules programs of a table; pure batched `reset`/`step` functions.

    Every function takes the reward's parameters (`reward.prepare(model_params, table)`)
    as an argument and a batch of states with a leading axis B.
    """

    reward: Reward = field(default_factory=TerminalReward)
    max_steps: int = MAX_EPISODE_STEPS  # an episode cut here is truncated (never, by default)
    auto_reset: bool = True  # a finished episode restarts on a random program of the pool

    def _observe_one(self, table: ProgramTable, state: EnvState) -> Observation:
        return observe(table, state, action_mask(table, state), self.max_steps)

    def observe(self, table: ProgramTable, states: EnvState) -> Observation:
        """Observations of a batch of states."""
        return jax.vmap(lambda s: self._observe_one(table, s))(states)

    def observation_spec(self, table: ProgramTable) -> Observation:
        """Shapes and dtypes of one environment's observation (jax.ShapeDtypeStruct leaves)."""
        state = jax.eval_shape(lambda: initial_state(table, jnp.int32(0), jax.random.PRNGKey(0)))
        return jax.eval_shape(lambda s: self._observe_one(table, s), state)

    @staticmethod
    def action_spec() -> dict:
        """The action vector and the number of choices of each head."""
        return {
            "action": jax.ShapeDtypeStruct((ACTION_WIDTH,), jnp.int32),
            "kind": N_KINDS,
            "pointer": MAX_LOOPS,
            "tiles": (MAX_LOOPS, N_TILE_CHOICES),
        }

    def initial(
        self, params: RewardParams, table: ProgramTable, programs: jax.Array, keys: jax.Array
    ) -> EnvState:
        """(B,) states before any action on `programs`, with their predicted baselines."""
        states = jax.vmap(lambda p, k: initial_state(table, p, k))(programs, keys)
        base = params.base_log_time[states.program]
        return states.replace(base_log_time=base, log_time=base)

    def _timestep(self, table, states, **fields) -> TimeStep:
        rows = states.program.shape[0]
        zeros = jnp.zeros(rows, jnp.float32)
        defaults = dict(
            reward=zeros,
            discount=jnp.ones(rows, jnp.float32),
            done=jnp.zeros(rows, bool),
            truncated=jnp.zeros(rows, bool),
            invalid_action=jnp.zeros(rows, bool),
            applied_action=jnp.zeros((rows, ACTION_WIDTH), jnp.int32),
            log_speedup=zeros,
        )
        return TimeStep(self.observe(table, states), **{**defaults, **fields})

    def reset_to(
        self, params: RewardParams, table: ProgramTable, programs: jax.Array, keys: jax.Array
    ) -> tuple[EnvState, TimeStep]:
        """Start episodes on given program rows (B,), with (B,) keys."""
        states = self.initial(params, table, jnp.asarray(programs, jnp.int32), keys)
        return states, self._timestep(table, states)

    def _draw(self, keys: jax.Array, pool: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Per key: a key for the episode and a program drawn from `pool` (program rows)."""

        def one(key):
            key, pick = jax.random.split(key)
            return key, pool[jax.random.randint(pick, (), 0, pool.shape[0])]

        return jax.vmap(one)(keys)

    def reset(
        self, params: RewardParams, table: ProgramTable, pool: jax.Array, keys: jax.Array
    ) -> tuple[EnvState, TimeStep]:
        """Start (B,) episodes, one per key, on programs drawn from `pool` (program rows)."""
        keys, programs = self._draw(keys, pool)
        return self.reset_to(params, table, programs, keys)

    def step(
        self,
        params: RewardParams,
        table: ProgramTable,
        pool: jax.Array,
        states: EnvState,
        actions: jax.Array,
    ) -> tuple[EnvState, TimeStep]:
        """One action per environment (B, ACTION_WIDTH); rewards from `self.reward`."""
        new, invalid, applied = jax.vmap(lambda s, a: transition(table, s, a))(states, actions)
        reward, log_time = self.reward(params, table, states, applied, new)
        new = new.replace(log_time=log_time)
        terminated = new.done & ~states.done
        truncated = ~new.done & (new.steps >= self.max_steps)
        done = terminated | truncated
        if self.max_steps < MAX_EPISODE_STEPS:  # a cut episode ends here: nothing more to do
            new = new.replace(cursor=jnp.where(truncated, -1, new.cursor))
        log_speedup = jnp.where(terminated, new.base_log_time - log_time, 0.0)
        if self.auto_reset:
            keys, programs = self._draw(new.key, pool)
            new = _select(done, self.initial(params, table, programs, keys), new)
        return new, self._timestep(
            table,
            new,
            reward=reward.astype(jnp.float32),
            discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
            done=done,
            truncated=truncated,
            invalid_action=invalid,
            applied_action=applied,
            log_speedup=log_speedup.astype(jnp.float32),
        )


def sample_action(key: jax.Array, mask: ActionMask, next_weight: float = 1.0) -> jax.Array:
    """A random legal action: kind, then its tile choices and pointer, uniform over what the
    masks allow; `next_weight` < 1 makes moving on rarer, for deeper schedules."""
    kind_key, tile_key, pointer_key = jax.random.split(key, 3)
    kind_logits = jnp.zeros(N_KINDS).at[NEXT].set(jnp.log(next_weight))
    kind = jax.random.categorical(kind_key, jnp.where(mask.kind, kind_logits, -1e9))
    tile_mask = tile_mask_of(mask, kind)
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
