"""Store -> training examples: each stored schedule replayed through the environment's step.

The features of a measured schedule are computed exactly as the environment computes them for
an RL state: the schedule becomes its action sequence, the actions run through `transition`,
and `features` reads the state reached.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import jax
import numpy as np

from mlirrl_jax.actions import NEXT, encode_action
from mlirrl_jax.env.features import Features, features
from mlirrl_jax.env.jax_env import (
    MAX_EPISODE_STEPS,
    action_mask,
    run_actions,
    sample_action,
    transition,
)
from mlirrl_jax.env.replay import schedule_to_actions, state_of_schedule
from mlirrl_jax.env.state import EnvState, ProgramTable, initial_state
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.measure.profile import MachineProfile, profile_of
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule, ScheduleError
from mlirrl_jax.splits import check_split, split_of
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.util.progress import progress_bar


@dataclass
class Dataset:
    """Featurized measurements; `program` indexes the table's rows, one per (program, machine,
    threads), and `programs`, `families`, `machines` and `threads` describe each row."""

    states: EnvState  # the states the schedules reach, arrays with a leading axis N
    features: Features  # their features, arrays with a leading axis N
    log_time: np.ndarray  # (N,) float32, log of the measured median seconds
    program: np.ndarray  # (N,) int32
    is_baseline: np.ndarray  # (N,) bool, the empty schedule
    programs: list[Program]
    families: list[str]  # per program: model family of the suite, "user" otherwise
    table: ProgramTable
    skipped: int = 0  # stored rows whose schedule no state of the environment describes
    schedule_hash: np.ndarray | None = None  # (N,) str: the stored rows' schedule hashes
    machines: list[str] = field(default_factory=list)  # per table row: its machine's id
    threads: list[int] = field(default_factory=list)  # per table row: threads per kernel
    profiles: dict[str, MachineProfile] = field(default_factory=dict)  # of `machines`, by id

    def __len__(self) -> int:
        return int(self.log_time.shape[0])

    def machines_and_threads(self) -> tuple[list[str], list[int]]:
        """The machines and thread counts of the table rows its rows are of, sorted."""
        used = np.unique(self.program)
        return sorted({self.machines[i] for i in used}), sorted({self.threads[i] for i in used})

    def subset(self, rows: np.ndarray) -> Dataset:
        take = lambda a: a[rows]  # noqa: E731
        return replace(
            self,
            states=jax.tree.map(take, self.states),
            features=jax.tree.map(take, self.features),
            log_time=self.log_time[rows],
            program=self.program[rows],
            is_baseline=self.is_baseline[rows],
            skipped=0,
            schedule_hash=None if self.schedule_hash is None else self.schedule_hash[rows],
        )

    def concat(self, other: Dataset) -> Dataset:
        """The rows of both (same programs and table)."""
        join = lambda a, b: np.concatenate([np.asarray(a), np.asarray(b)])  # noqa: E731
        return replace(
            self,
            states=jax.tree.map(join, self.states, other.states),
            features=jax.tree.map(join, self.features, other.features),
            log_time=join(self.log_time, other.log_time),
            program=join(self.program, other.program),
            is_baseline=join(self.is_baseline, other.is_baseline),
            skipped=0,
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


def map_in_chunks(fn, *trees, size: int = 1024, desc: str | None = None):
    """`fn` over chunks of `size` rows of the pytrees `trees` (the last chunk zero-padded, so
    a jitted `fn` compiles once), outputs as NumPy arrays joined along the rows; `desc`
    names a progress bar over the rows (shown where bars are on)."""
    rows = len(jax.tree.leaves(trees)[0])
    outputs = []
    bar = progress_bar(total=rows, desc=desc, unit="row", leave=False, disable=desc is None)
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


@jax.jit
def _features_of_states(table: ProgramTable, states: EnvState) -> Features:
    return jax.vmap(features, in_axes=(None, 0))(table, states)


def featurize_states(table: ProgramTable, states: EnvState) -> Features:
    """The features of given states (batched, jitted once per table shape)."""
    return map_in_chunks(functools.partial(_features_of_states, table), states)


def featurize(
    table: ProgramTable, program_ids: np.ndarray, action_batches: np.ndarray
) -> tuple[EnvState, Features]:
    """The states each action sequence reaches, and their features (batched, jitted once per
    table shape)."""
    one_chunk = functools.partial(_featurize_chunk, table)
    return map_in_chunks(one_chunk, program_ids, action_batches)


def random_states(data: Dataset, count: int, seed: int = 0) -> Dataset:
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
    states, feats = map_in_chunks(one_chunk, ids, keys, next_weights, desc="random states")
    return replace(
        data,
        states=states,
        features=feats,
        log_time=np.zeros(count, np.float32),
        program=ids,
        is_baseline=np.zeros(count, bool),
        skipped=0,
        schedule_hash=None,
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
    machine_id: str | Sequence[str],
    threads: int | Sequence[int] = 1,
    programs: set[str] | None = None,
    table_programs: list[Program] | None = None,
) -> Dataset:
    """Every verified measurement of a machine at a thread count (of the programs with these
    hashes, if given), featurized.

    Several machines or thread counts are asked for by name: `machine_id` a list of ids,
    `threads` a list of counts. Each (program, machine, threads) with rows is then a table row
    of its own, encoded with that machine's profile (the store's record, else a known one:
    `measure.profile.profile_of`) and that thread count, and tile candidates of that machine's
    vectors; a thread count without rows of a machine is left out, a named machine without
    rows at any of them is an error. `table_programs`: each machine and thread count's
    programs are these (which must include every program with rows), so that datasets of one
    job share a table shape and its compiled functions."""
    machine_ids = [machine_id] if isinstance(machine_id, str) else sorted(set(machine_id))
    thread_counts = [threads] if isinstance(threads, int) else sorted(set(threads))
    recorded = store.machine_profiles()
    groups = []  # (machine, threads, its rows)
    for machine in machine_ids:
        if programs is None:
            found = list(store.rows(machine_id=machine, status="ok"))
        else:
            found = [
                r
                for h in sorted(programs)
                for r in store.rows(machine_id=machine, status="ok", program_hash=h)
            ]
        chosen = [(t, [r for r in found if r["threads"] == t]) for t in thread_counts]
        chosen = [(t, rows) for t, rows in chosen if rows]
        if not chosen:
            raise ConfigError(
                f"{store.path} has no verified measurements of machine {machine} at "
                f"{', '.join(map(str, thread_counts))} thread(s)"
            )
        groups += [(machine, t, rows) for t, rows in chosen]
    profiles = {m: profile_of(m, recorded) for m in machine_ids}
    parsed: dict[str, Program] = {p.hash: p for p in table_programs or []}
    row_programs: list[Program] = []
    row_machines: list[str] = []
    row_threads: list[int] = []
    index: dict[tuple[str, int, str], int] = {}  # (machine, threads, program hash) -> row
    for machine, count, rows in groups:
        hashes = sorted({r["program_hash"] for r in rows})
        if table_programs is None:
            for h in hashes:
                parsed.setdefault(h, store.program(h))
            chosen_programs = [parsed[h] for h in hashes]
        else:
            chosen_programs = list(table_programs)
            missing = set(hashes) - {p.hash for p in chosen_programs}
            if missing:
                raise ConfigError(f"{len(missing)} programs with rows are not among table_programs")
        for p in chosen_programs:
            index[machine, count, p.hash] = len(row_programs)
            row_programs.append(p)
            row_machines.append(machine)
            row_threads.append(count)
    kept, ids, actions, skipped = [], [], [], 0
    exact, exact_states = [], []  # rows whose schedule only a state describes (its tile sizes)
    for machine, count, rows in groups:
        # the candidates the measuring machine's environment offered: its vector width
        lanes = profiles[machine].vector_lanes
        for r in rows:
            row = index[machine, count, r["program_hash"]]
            try:
                schedule = Schedule.from_json(r["schedule"])
                actions.append(padded_actions(row_programs[row], schedule, lanes))
            except ScheduleError:
                # tile sizes off the candidates (the heuristic's, a user's): the state the
                # whole schedule describes, read as any state is
                try:
                    state = state_of_schedule(row_programs[row], schedule)
                except (ScheduleError, ValueError, IndexError, KeyError):
                    skipped += 1
                    continue
                exact.append(r)
                exact_states.append(state.to_env_state(row))
                continue
            kept.append(r)
            ids.append(row)
    table = encode_programs(
        row_programs, machine=[profiles[m] for m in row_machines], threads=row_threads
    )
    ids = np.array(ids, np.int32)
    if actions:
        states, feats = featurize(table, ids, np.stack(actions).astype(np.int32))
    if exact:
        stacked = jax.tree.map(lambda *leaves: np.stack(leaves), *exact_states)
        more = (stacked, featurize_states(table, stacked))
        states, feats = (
            more
            if not actions
            else jax.tree.map(lambda a, b: np.concatenate([a, b]), (states, feats), more)
        )
        kept += exact
        ids = np.concatenate([ids, np.array([int(s.program) for s in exact_states], np.int32)])
    if not kept:
        raise ConfigError(f"{store.path}: no stored schedule of these rows could be read")
    return Dataset(
        states=states,
        features=feats,
        log_time=np.log(np.array([r["median_s"] for r in kept], np.float64)).astype(np.float32),
        program=ids,
        is_baseline=np.array([r["schedule_hash"] == Schedule().hash for r in kept]),
        programs=row_programs,
        families=[_family(p.name) for p in row_programs],
        table=table,
        skipped=skipped,
        schedule_hash=np.array([r["schedule_hash"] for r in kept], dtype=object),
        machines=row_machines,
        threads=row_threads,
        profiles=profiles,
    )


def machine_table(
    programs: list[Program],
    machine: str | MachineProfile,
    threads: int = 1,
    store: MeasurementStore | None = None,
) -> ProgramTable:
    """The table of `programs` on a machine at `threads` per kernel: what the surrogate
    predicts that machine's run times from (a machine it was not fitted on included).
    `machine`: its profile, or its id (`measure.profile.profile_of`, with `store`'s records)."""
    if isinstance(machine, str):
        machine = profile_of(machine, store.machine_profiles() if store is not None else None)
    return encode_programs(programs, machine=machine, threads=threads)


def resolve_machines(store: MeasurementStore, spec: str) -> list[str]:
    """Machine ids from a comma-separated list, or "all" (every machine with rows in the
    store)."""
    if spec.strip() == "all":
        return sorted(store.machines())
    chosen = [m.strip() for m in spec.split(",") if m.strip()]
    if not chosen:
        raise ConfigError(f"no machine ids in {spec!r}")
    return chosen


def programs_in_split(dataset: Dataset, split: str) -> set[int]:
    """Indices of the dataset's programs in `split` (`mlirrl_jax.splits`: train,
    surrogate-validation or test), decided by each program's name."""
    check_split(split)
    return {i for i, p in enumerate(dataset.programs) if split_of(p.name) == split}
