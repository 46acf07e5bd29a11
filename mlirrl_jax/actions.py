"""The action space: a transformation-kind head, per-loop tile-size heads and a level pointer.

An episode walks a program's ops consumer-first. For the current op an action picks a kind;
tiling kinds also read one tile-size choice per loop, and interchange reads the level pointer:
the permutation is built one level at a time, each sub-step pointing at a loop not yet placed.

Kinds follow a fixed order within an op (the step grammar), each at most once except tiling
(two levels): parallel tiling or tiled fusion, interchange, tiling, packing, decomposition,
vectorization, then the next op. A schedule is therefore a function of what was chosen, not of
the order it was chosen in, and the same state is reached by any replay of the same choices.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from mlirrl_jax.measure.fingerprint import vector_lanes
from mlirrl_jax.schedule import Kind

# Bump when the action space changes (heads, their sizes, tile candidates, the grammar): a
# policy trained on another one refuses to load (`agent.checkpoint`).
ACTION_SPACE_VERSION = 3
MAX_OPS = 8  # ops per program the environments accept
MAX_LOOPS = 8  # loops per op
N_DIVISOR_CHOICES = 8  # per loop: "no tiling" + up to 7 divisors of the extent
REMAINDER_VECTORS = (0.5, 1, 2, 4)  # vectors of the machine's width offered with a remainder
N_TILE_CHOICES = N_DIVISOR_CHOICES + len(REMAINDER_VECTORS)
VECTOR_BUDGET = 4096  # most iteration points a vectorized op may have (bounds compile time)

_REGISTER_FRIENDLY = (1, 8, 16, 32, 64)

# Kind head: 0 moves to the next op, then the transformation kinds in `schedule.Kind`'s order
NEXT = 0
TILE_PARALLEL, TILE_FUSE, INTERCHANGE, TILE, DECOMPOSE, VECTORIZE, PACK = (k.action for k in Kind)
KIND_NAMES = ("next", *(k.value for k in Kind))
N_KINDS = len(KIND_NAMES)

# Which tile mask a kind's tile heads read
NO_TILES, SEQUENTIAL_TILES, PARALLEL_TILES = 0, 1, 2


@dataclass(frozen=True)
class KindRule:
    """One row of the step grammar."""

    phase: int  # the phase the kind moves its op to; allowed only from an earlier phase
    repeats: int  # times the kind may apply in its own phase (tiling levels); 1: once
    tiles: int  # NO_TILES, or which tile mask its per-loop tile heads read
    pointer: bool  # reads the level pointer (one interchange sub-step)
    ends_op: bool  # moves the episode to the next op


# The step grammar: the masks, the JAX transition, the Python replay and the policy's
# log-probability all read this one table (or the arrays below, made from it).
GRAMMAR = {
    NEXT: KindRule(phase=0, repeats=0, tiles=NO_TILES, pointer=False, ends_op=True),
    TILE_PARALLEL: KindRule(phase=1, repeats=1, tiles=PARALLEL_TILES, pointer=False, ends_op=False),
    TILE_FUSE: KindRule(phase=1, repeats=1, tiles=PARALLEL_TILES, pointer=False, ends_op=False),
    INTERCHANGE: KindRule(phase=2, repeats=1, tiles=NO_TILES, pointer=True, ends_op=False),
    TILE: KindRule(phase=3, repeats=2, tiles=SEQUENTIAL_TILES, pointer=False, ends_op=False),
    DECOMPOSE: KindRule(phase=5, repeats=1, tiles=NO_TILES, pointer=False, ends_op=False),
    VECTORIZE: KindRule(phase=6, repeats=1, tiles=NO_TILES, pointer=False, ends_op=True),
    # B's (a filter's) tile copied into a panel per outer tile, right after the tiling
    PACK: KindRule(phase=4, repeats=1, tiles=NO_TILES, pointer=False, ends_op=False),
}
assert sorted(GRAMMAR) == list(range(N_KINDS))
MAX_TILE_LEVELS = GRAMMAR[TILE].repeats
# per kind, indexed by the kind head's value (NumPy: usable in JAX and in Python alike)
PHASE_OF = np.array([GRAMMAR[k].phase for k in range(N_KINDS)], np.int32)
TILES_OF = np.array([GRAMMAR[k].tiles for k in range(N_KINDS)], np.int32)
USES_TILES = TILES_OF != NO_TILES
USES_POINTER = np.array([GRAMMAR[k].pointer for k in range(N_KINDS)])
ENDS_OP = np.array([GRAMMAR[k].ends_op for k in range(N_KINDS)])
N_PHASES = int(PHASE_OF.max()) + 1


def _may_follow(kind: int, phase: int) -> bool:
    rule = GRAMMAR[kind]
    return kind == NEXT or phase < rule.phase or (rule.repeats > 1 and phase == rule.phase)


# (N_PHASES, N_KINDS): whether a kind may follow an op's phase (a repeatable kind's count of
# levels aside); `next` always may
MAY_FOLLOW = np.array([[_may_follow(k, ph) for k in range(N_KINDS)] for ph in range(N_PHASES)])


def _max_steps_per_op() -> int:
    """A bound on an op's part of an episode: the most steps of each phase (an interchange
    places all but the last loop, one step each), then `next` (one more than the longest,
    since vectorizing also ends the op)."""
    most: dict[int, int] = {}
    for kind, rule in GRAMMAR.items():
        if kind != NEXT:
            steps = MAX_LOOPS - 1 if rule.pointer else rule.repeats
            most[rule.phase] = max(most.get(rule.phase, 0), steps)
    return 1 + sum(most.values())


MAX_STEPS_PER_OP = _max_steps_per_op()
MAX_EPISODE_STEPS = MAX_OPS * MAX_STEPS_PER_OP  # the grammar ends every episode by then

# An action as one int32 vector: [kind, pointer, tile choice per loop]
ACTION_WIDTH = 2 + MAX_LOOPS
KIND_INDEX, POINTER_INDEX, TILES_INDEX = 0, 1, 2


def tile_candidates(extent: int, lanes: int | None = None) -> tuple[int, ...]:
    """Tile sizes a loop offers (`N_TILE_CHOICES`): 0 ("no tiling"), up to 7 proper divisors
    of the extent, then whole vectors of the machine that leave a partial last tile.

    Divisors, not only powers of two: extents such as 7, 14, 28, 112 or 196 get real choices.
    Register-friendly divisors (1, 8, 16, 32, 64) come first; the other divisor slots are
    spread on a log scale over the remaining divisors. The last slots hold the sizes of half,
    one, two and four vector registers of `lanes` f32 (default: this machine's vector width)
    that are below the extent and do not divide it: a 28-wide loop runs as one 16-lane vector
    and a remainder of 12, which the pipeline peels (or masks inside a forall). Padded with 0.
    """
    return _candidates(extent, vector_lanes() if lanes is None else lanes)


@functools.lru_cache(maxsize=8192)  # replaying a store asks for the same extents many times
def _candidates(extent: int, lanes: int) -> tuple[int, ...]:
    n = N_DIVISOR_CHOICES
    divisors = [d for d in range(1, extent) if extent % d == 0]
    chosen = [d for d in _REGISTER_FRIENDLY if d in divisors]
    rest = [d for d in divisors if d not in chosen]
    slots = n - 1 - len(chosen)
    if len(rest) <= slots:
        chosen += rest
    else:
        low, high = math.log(rest[0]), math.log(rest[-1])
        for k in range(slots):  # quantiles of the log range, so a few slots land mid-range
            target = math.exp(low + (high - low) * (k + 0.5) / slots)
            free = [d for d in rest if d not in chosen]
            chosen.append(min(free, key=lambda d: abs(math.log(d / target))))
    chosen.sort()
    remainders = sorted(
        {
            size
            for size in (int(v * lanes) for v in REMAINDER_VECTORS)
            if 1 < size < extent and extent % size
        }
    )
    return (
        0,
        *chosen,
        *[0] * (n - 1 - len(chosen)),
        *remainders,
        *[0] * (len(REMAINDER_VECTORS) - len(remainders)),
    )


def encode_action(kind: int, pointer: int = 0, tiles: tuple[int, ...] = ()) -> np.ndarray:
    """An action vector from its parts (tile choices are indices into the loop's candidates)."""
    action = np.zeros(ACTION_WIDTH, np.int32)
    action[KIND_INDEX] = kind
    action[POINTER_INDEX] = pointer
    action[TILES_INDEX : TILES_INDEX + len(tiles)] = tiles
    return action
