"""Store -> training examples: each stored schedule replayed through the environment's step.

The features of a measured schedule are computed exactly as the environment computes them for
an RL state: the schedule becomes its action sequence, the actions run through `transition`,
and `features` reads the state reached.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import numpy as np
from tqdm import tqdm

from mlirrl_jax.actions import NEXT, encode_action
from mlirrl_jax.env.features import Features, features
from mlirrl_jax.env.jax_env import (
    MAX_EPISODE_STEPS,
    action_mask,
    run_actions,
    sample_action,
    transition,
)
from mlirrl_jax.env.replay import schedule_to_actions
from mlirrl_jax.env.state import EnvState, ProgramTable, encode_programs, initial_state
from mlirrl_jax.measure.fingerprint import vector_lanes
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule, ScheduleError
from mlirrl_jax.splits import check_split, split_of
from mlirrl_jax.store import MeasurementStore


@dataclass
class Dataset:
    """Featurized measurements; `program` indexes `programs` (and the table's rows)."""

    states: EnvState  # the states the schedules reach, arrays with a leading axis N
    features: Features  # their features, arrays with a leading axis N
    log_time: np.ndarray  # (N,) float32, log of the measured median seconds
    program: np.ndarray  # (N,) int32
    is_baseline: np.ndarray  # (N,) bool, the empty schedule
    programs: list[Program]
    families: list[str]  # per program: model family of the suite, "user" otherwise
    table: ProgramTable
    skipped: int = 0  # stored rows whose schedule is not expressible in the action space
    schedule_hash: np.ndarray | None = None  # (N,) str: the stored rows' schedule hashes

    def __len__(self) -> int:
        return int(self.log_time.shape[0])

    def subset(self, rows: np.ndarray) -> Dataset:
        take = lambda a: a[rows]  # noqa: E731
        return Dataset(
            jax.tree.map(take, self.states),
            jax.tree.map(take, self.features),
            self.log_time[rows],
            self.program[rows],
            self.is_baseline[rows],
            self.programs,
            self.families,
            self.table,
            schedule_hash=None if self.schedule_hash is None else self.schedule_hash[rows],
        )

    def concat(self, other: Dataset) -> Dataset:
        """The rows of both (same programs and table)."""
        join = lambda a, b: np.concatenate([np.asarray(a), np.asarray(b)])  # noqa: E731
        return Dataset(
            jax.tree.map(join, self.states, other.states),
            jax.tree.map(join, self.features, other.features),
            join(self.log_time, other.log_time),
            join(self.program, other.program),
            join(self.is_baseline, other.is_baseline),
            self.programs,
            self.families,
            self.table,
            schedule_hash=None
            if self.schedule_hash is None or other.schedule_hash is None
            else join(self.schedule_hash, other.schedule_hash),
        )

    def of_programs(self, programs: set[int]) -> Dataset:
        """The rows of these programs (indices into `programs`)."""
        return self.subset(np.flatnonzero(np.isin(self.program, sorted(programs))))


def _family(name: str) -> str:
    try:
        return suites.get(name).model
    except KeyError:
        return "user"


def map_in_chunks(fn, *trees, size: int = 1024, progress: str | None = None):
    """`fn` over chunks of `size` rows of the pytrees `trees` (the last chunk zero-padded, so
    a jitted `fn` compiles once), outputs as NumPy arrays joined along the rows; `progress`
    names a progress bar over the rows."""
    rows = len(jax.tree.leaves(trees)[0])
    outputs = []
    bar = tqdm(total=rows, desc=progress, unit="row", disable=progress is None, leave=False)
    for start in range(0, rows, size):
        taken = min(size, rows - start)

        def chunk(a, start=start, taken=taken):
            part = np.asarray(a[start : start + taken])
            return np.concatenate([part, np.zeros((size - taken, *part.shape[1:]), part.dtype)])

        out = fn(*jax.tree.map(chunk, trees))
        outputs.append(jax.tree.map(lambda a, n=taken: np.asarray(a)[:n], out))
        bar.update(taken)
    bar.close()
    return jax.tree.map(lambda *chunks: np.concatenate(chunks), *outputs)


@jax.jit
def _featurize_chunk(table: ProgramTable, ids, actions):
    states = jax.vmap(run_actions, in_axes=(None, 0, 0))(table, ids, actions)
    return states, jax.vmap(features, in_axes=(None, 0))(table, states)


def featurize(
    table: ProgramTable, program_ids: np.ndarray, action_batches: np.ndarray
) -> tuple[EnvState, Features]:
    """The states each action sequence reaches, and their features (batched, jitted once per
    table shape)."""
    one_chunk = functools.partial(_featurize_chunk, table)
    return map_in_chunks(one_chunk, program_ids, action_batches)


def random_states(data: Dataset, count: int, seed: int = 0, progress: bool = False) -> Dataset:
    """`count` states that random legal episodes reach on `data`'s programs (half uniform, half
    biased toward deeper schedules, as collection samples them), unlabeled (log_time 0)."""
    table = data.table

    def episode(program, key, next_weight):
        step_keys = jax.random.split(key, MAX_EPISODE_STEPS)

        def body(carry):
            state, step = carry
            action = sample_action(step_keys[step], action_mask(table, state), next_weight)
            return transition(table, state, action)[0], step + 1

        # A while loop, not a scan: most episodes end long before the step limit, and a
        # vmapped loop stops as soon as every episode of the chunk has ended.
        state = initial_state(table, program, key)

        def running(carry):  # the step limit too: the same states as a scan of that length
            return ~carry[0].done & (carry[1] < MAX_EPISODE_STEPS)

        return jax.lax.while_loop(running, body, (state, 0))[0]

    @jax.jit
    def one_chunk(ids, keys, next_weights):
        states = jax.vmap(episode)(ids, keys, next_weights)
        return states, jax.vmap(features, in_axes=(None, 0))(table, states)

    rng = np.random.default_rng(seed)
    ids = rng.choice(np.unique(data.program), size=count).astype(np.int32)
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(seed), count))
    next_weights = np.where(np.arange(count) % 2, 1.0, 0.25).astype(np.float32)
    states, feats = map_in_chunks(
        one_chunk, ids, keys, next_weights, progress="random states" if progress else None
    )
    return Dataset(
        states,
        feats,
        np.zeros(count, np.float32),
        ids,
        np.zeros(count, bool),
        data.programs,
        data.families,
        table,
    )


def padded_actions(program: Program, schedule: Schedule, lanes: int | None = None) -> np.ndarray:
    """The schedule's actions (tile candidates for vectors of `lanes`), padded with `next` to
    the longest episode."""
    actions = schedule_to_actions(program, schedule, lanes)
    padded = np.tile(encode_action(NEXT), (MAX_EPISODE_STEPS, 1))
    padded[: len(actions)] = actions
    return padded


def load_dataset(
    store: MeasurementStore,
    machine_id: str,
    threads: int = 1,
    programs: set[str] | None = None,
    table_programs: list[Program] | None = None,
) -> Dataset:
    """Every verified measurement of one machine (of the programs with these hashes, if
    given), featurized. `table_programs`: the dataset's programs and table are these (which
    must include every program with rows), so that datasets of one job share a table shape
    and its compiled functions."""
    if programs is None:
        found = store.rows(machine_id=machine_id, status="ok")
    else:
        found = (
            r
            for h in sorted(programs)
            for r in store.rows(machine_id=machine_id, status="ok", program_hash=h)
        )
    rows = [r for r in found if r["threads"] == threads]
    if not rows:
        raise ValueError(f"{store.path} has no verified measurements of machine {machine_id}")
    if table_programs is None:
        programs = [store.program(h) for h in sorted({r["program_hash"] for r in rows})]
    else:
        programs = list(table_programs)
    index = {p.hash: i for i, p in enumerate(programs)}
    missing = {r["program_hash"] for r in rows} - set(index)
    if missing:
        raise ValueError(f"{len(missing)} programs with rows are not among table_programs")
    # the candidates the measuring machine's environment offered: its vector width
    lanes = vector_lanes(machine=rows[0]["fingerprint"]["machine"])
    kept, actions, skipped = [], [], 0
    for r in rows:
        program = programs[index[r["program_hash"]]]
        try:
            actions.append(padded_actions(program, Schedule.from_json(r["schedule"]), lanes))
        except ScheduleError:
            skipped += 1
            continue
        kept.append(r)
    table = encode_programs(programs, lanes)
    ids = np.array([index[r["program_hash"]] for r in kept], np.int32)
    states, feats = featurize(table, ids, np.stack(actions).astype(np.int32))
    return Dataset(
        states=states,
        features=feats,
        log_time=np.log(np.array([r["median_s"] for r in kept], np.float64)).astype(np.float32),
        program=ids,
        is_baseline=np.array([r["schedule_hash"] == Schedule().hash for r in kept]),
        programs=programs,
        families=[_family(p.name) for p in programs],
        table=table,
        skipped=skipped,
        schedule_hash=np.array([r["schedule_hash"] for r in kept], dtype=object),
    )


def programs_in_split(dataset: Dataset, split: str) -> set[int]:
    """Indices of the dataset's programs in `split` (`mlirrl_jax.splits`: train,
    surrogate-validation or test), decided by each program's name."""
    check_split(split)
    return {i for i, p in enumerate(dataset.programs) if split_of(p.name) == split}
