"""Re-grounding: the agent's top schedules measured for real on this machine correct the
surrogate, between stretches of simulated training.

Every `iterations_per_round` PPO iterations, a round:
1. picks `round_programs` training programs (`selection`: where the agent's predicted gain
   over the heuristic times the surrogate ensemble's spread is largest, where the gain alone
   is, or uniformly) and takes the agent's `top_k` distinct
   schedules of each, sampled and ranked by the surrogate, plus each program's baseline if this
   machine has none; the fixed tracking programs' greedy schedules; and every
   `heldout_every` rounds the held-out test programs' greedy and heuristic schedules;
2. writes that list to `round-N/tasks.json`, then measures what the store lacks, committed as
   it goes (a killed round resumes its own list: nothing measured twice, nothing lost);
3. scores the surrogate on the schedules just measured (on-policy error), fine-tunes it on
   this machine's rows of the training programs but for the round's held-back programs, and
   scores it again on those: an update whose error on them grew is refused, the previous
   weights kept, and the refusal recorded in `rounds.jsonl` (`update_refused`, `refusal`);
4. saves the new surrogate to `round-N/surrogate`, records the round in `rounds.jsonl` and
   `state.json`, and training goes on against it: its parameters are an argument of the jitted
   iteration, so nothing recompiles.

Measurement and JAX work never share the cores: a round runs between iterations, in this
process, and its measuring phase starts only after the JAX work before it has finished
(`block_until_ready`); the workers are idle while JAX runs. Each phase's wall-clock interval is
logged in `phases.jsonl`.

Only this machine's rows are read or written. The first round on a machine that has no
measurements of its own also measures a calibration set: `calibration_programs` training
programs' baselines and the agent's greedy schedules, and the surrogate-validation programs
that score the surrogate on this machine (`validation_programs`, each with `validation_k`
schedules), which are never learned from.

The run's iterations: K (`iterations_per_round`) before each round and K after the last, so a
run given no budget of its own trains exactly (rounds + 1) x K iterations
(`RegroundConfig.run_iterations`); an iteration budget that ends before the last round is
refused. With a time budget the rounds happen while the time lasts.

The real budget (`real_budget`) is a hard cap on the measurements of the whole run, baselines,
calibration and validation included; a schedule the store already has costs nothing. The
spend is `measured.jsonl`, one line per measurement made. A round plans within its allowance:
what is left, less a reserve for each later round (its core: `round_programs` x (`top_k` +
1) learned schedules and baselines and `track_programs` greedy ones, or an even share of what
is left if that is less). A plan larger than that is
cut in the order of `CUT_ORDER`: validation first, then calibration, heuristic, held-out and
tracked schedules, the learned ones last; within a role, each program's lowest-ranked schedules
first. A program's baseline goes with its last schedule. The cut is printed and recorded in
the round's line of `rounds.jsonl` (`cut`: entries per role; `wanted` and `planned`: the new
measurements of the whole plan and of what was kept; `allowance`). Measuring stops at the cap whatever the plan says (a resumed
round re-measures what a kill lost before its commit, and that counts).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import jax
import numpy as np

from cost_model.api import CostModel, predict_dataset
from cost_model.dataset import Dataset, load_dataset, random_states
from cost_model.metrics import evaluate
from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.agent.surrogate import Surrogate, load_surrogate
from mlirrl_jax.agent.train import AgentConfig
from mlirrl_jax.collect import CollectConfig, CollectReport, Task, measure_stream
from mlirrl_jax.env.replay import state_of_schedule
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.sampler import EpisodeSampler, random_policy
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.shipped import DEFAULT_STORE
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.util.plots import pyplot, save_figure
from mlirrl_jax.util.progress import progress_bar
from mlirrl_jax.util.stats import geomean, pick_evenly

log = logging.getLogger(__name__)

SELECTIONS = ("uncertain_gain", "gain", "uniform")
UPDATES = ("measured", "anchored", "residual")


def uncertain_gain_order(gain: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """Indices of programs, the largest claim first: the agent's predicted log-gain over the
    heuristic (none counted below 0) times the surrogate ensemble's spread on its schedule;
    programs that claim nothing follow, by their gain."""
    claim = np.maximum(gain, 0.0) * spread
    return np.lexsort((-gain, -claim))


@dataclass(frozen=True)
class RegroundConfig:
    """How a training run re-grounds its surrogate; saved as `regrounding/config.json`."""

    rounds: int = 6
    """Re-grounding rounds in the run (0: simulated training only)."""
    iterations_per_round: int = 60
    """PPO iterations before each round and after the last (K): a run given no budget of its
    own trains (rounds + 1) x K."""
    round_programs: int = 16
    """Training programs whose top schedules a round measures (P)."""
    top_k: int = 8
    """Distinct schedules per program, the agent's best by the surrogate (k)."""
    real_budget: int = 2000
    """Real measurements the run may make in all, a hard cap (baselines, calibration,
    validation and tracking included; what the store already has costs nothing)."""
    selection: str = "uncertain_gain"
    """How a round picks its programs: "uncertain_gain" (largest predicted gain of the
    agent's greedy schedule over the heuristic times the ensemble's spread on it: where the
    surrogate claims much and is unsure of it; programs with no predicted gain last, by gain),
    "gain" (largest predicted gain) or "uniform"."""
    update: str = "residual"
    """What an update learns from: "measured" (this machine's rows alone), "anchored" (plus
    random states of the same programs labeled by the prior) or "residual" (plus random states
    labeled by the prior corrected by small trees fitted on this machine's rows to what the
    prior gets wrong there); anchor states: `anchor_share` per measured row."""
    anchor_share: float = 0.5
    """With `update="anchored"`: anchor states per measured row."""
    update_epochs: int = 20
    """Passes over the rows in each update."""
    held_back: float = 0.25
    """Share of a round's programs kept out of its update, to score it after."""
    track_programs: int = 12
    """Fixed training programs whose greedy schedules are measured every round."""
    heldout_programs: int = 12
    """Test programs (dl-v0) whose greedy and heuristic schedules are measured for real."""
    heldout_every: int = 2
    """Rounds between two measurements of the held-out programs (and at the last round)."""
    calibration_programs: int = 24
    """Round 1 on a machine without its own rows: training programs measured for their
    baseline, the agent's greedy schedule and `calibration_k` random schedules."""
    calibration_k: int = 0
    """Random schedules per calibration program (as collection samples them)."""
    validation_programs: int = 16
    """Surrogate-validation programs measured once, to score the surrogate on this machine."""
    validation_k: int = 8
    """Random schedules per validation program (as collection samples them), besides the
    baseline."""
    max_mflops: float = 400.0
    """Only programs of at most this many MFLOP are measured (a measurement's time)."""
    store: str = DEFAULT_STORE
    """The measurement store; only this machine's rows are read and written."""
    threads: int = 1
    """Threads per measured kernel: the rounds measure, learn from and track only this
    machine's rows at this thread count, so a run adapts its surrogate and agent to it."""
    workers: int = 2
    """Measurements in flight at once (each in its own worker process)."""
    timeout_s: float = 60.0
    """A measurement running longer is recorded as a timeout."""
    seed: int = 0
    """Fixes the program choice and the sampled schedules."""

    def __post_init__(self):
        if self.selection not in SELECTIONS:
            raise ConfigError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.update not in UPDATES:
            raise ConfigError(f"update must be one of {UPDATES}, got {self.update!r}")
        for name in ("iterations_per_round", "round_programs", "top_k", "workers", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("rounds", "real_budget", "track_programs", "heldout_programs"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.held_back < 1.0:
            raise ConfigError(f"held_back must be in [0, 1), got {self.held_back}")

    def run_iterations(self) -> int:
        """The iterations of a run given no budget: K before each round and K after the last."""
        return (self.rounds + 1) * self.iterations_per_round

    def check_iterations(self, iterations: int) -> None:
        """Refuses an iteration budget that ends before the last round (0, a time budget,
        passes)."""
        last = self.rounds * self.iterations_per_round
        if 0 < iterations <= last:
            raise ConfigError(
                f"--iterations {iterations} reaches {(iterations - 1) // self.iterations_per_round}"
                f" of the {self.rounds} re-grounding rounds (the last comes after iteration "
                f"{last}): give --iterations {last + 1} or more, or leave it out to train "
                f"(rounds + 1) x iterations per round = {self.run_iterations()}"
            )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RegroundConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown re-grounding keys {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass
class Planned:
    """One measurement a round asks for."""

    program: Program
    schedule: Schedule
    role: str  # learn | baseline | track | heldout | heuristic | calibration | validation
    predicted_speedup: float | None = None

    def to_json(self) -> dict:
        return {
            "program": self.program.name,
            "program_hash": self.program.hash,
            "schedule": self.schedule.to_json(),
            "schedule_hash": self.schedule.hash,
            "role": self.role,
            "predicted_speedup": self.predicted_speedup,
        }

    @property
    def key(self) -> tuple[str, str]:
        return self.program.hash, self.schedule.hash


# the order in which a plan over its allowance is cut: what scores the surrogate first, what
# the round learns from last
CUT_ORDER = ("validation", "calibration", "heuristic", "heldout", "track", "learn")


def priority(planned: list[Planned]) -> list[int]:
    """The indices of the plan's schedules but baselines, the most needed first: by role
    (`CUT_ORDER` reversed), then by rank within the program (the agent's best first), then as
    planned."""
    rank, seen = [], {}
    for p in planned:
        rank.append(seen.get((p.role, p.program.hash), 0))
        seen[(p.role, p.program.hash)] = rank[-1] + 1
    needed = {role: i for i, role in enumerate(reversed(CUT_ORDER))}
    chosen = [i for i, p in enumerate(planned) if p.role != "baseline"]
    return sorted(chosen, key=lambda i: (needed[planned[i].role], rank[i]))


def within_budget(
    planned: list[Planned], stored: set[tuple[str, str]], allowance: int
) -> tuple[list[Planned], dict]:
    """The plan cut to `allowance` new measurements, most needed first (`priority`): a
    schedule stays if it and its program's baseline, where the store (`stored`) lacks them,
    still fit. A program's baseline stays while one of its schedules does. Returns the plan
    kept and {"allowance", "wanted": new measurements of the whole plan, "planned": those
    kept, "cut": entries cut per role}."""
    baseline = Schedule().hash
    kept_keys: set[tuple[str, str]] = set()
    kept: set[int] = set()
    cut: dict[str, int] = {}
    left = allowance
    for i in priority(planned):
        p = planned[i]
        new = {p.key, (p.program.hash, baseline)} - stored - kept_keys
        if len(new) <= left:
            kept.add(i)
            kept_keys |= new
            left -= len(new)
        else:
            cut[p.role] = cut.get(p.role, 0) + 1
    programs = {planned[i].program.hash for i in kept}
    for i, p in enumerate(planned):
        if p.role == "baseline":
            if p.program.hash in programs:
                kept.add(i)
            else:
                cut["baseline"] = cut.get("baseline", 0) + 1
    wanted = len({p.key for p in planned} - stored)
    record = {"allowance": allowance, "wanted": wanted, "planned": allowance - left, "cut": cut}
    return [p for i, p in enumerate(planned) if i in kept], record


class Regrounding:
    """The rounds of one run, in `run_dir/regrounding/`."""

    def __init__(
        self,
        run_dir: Path,
        config: RegroundConfig,
        agent_config: AgentConfig,
        train_programs: list[Program],
        heldout_programs: list[Program],
        validation_programs: list[Program],
        prior: Surrogate,
    ):
        config.check_iterations(agent_config.iterations)  # before anything is written
        self.dir = Path(run_dir) / "regrounding"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.agent_config = agent_config
        self.prior = prior
        self.machine = machine_fingerprint()["machine_id"]
        self.say = log.info
        small = lambda ps: [p for p in ps if p.flops <= config.max_mflops * 1e6]  # noqa: E731
        self.pool = small(train_programs)
        if not self.pool:
            raise ConfigError(f"no training program of at most {config.max_mflops} MFLOP")
        self.track = pick_evenly(self.pool, config.track_programs)
        self.heldout = pick_evenly(small(heldout_programs), config.heldout_programs)
        self.validation = pick_evenly(small(validation_programs), config.validation_programs)
        self.by_name = {p.name: p for p in [*self.pool, *self.heldout, *self.validation]}
        self.programs = list(self.by_name.values())
        self._evaluator = None
        self._prior: CostModel | None = None
        config_path = self.dir / "config.json"
        if config_path.is_file():
            saved = RegroundConfig.from_json(json.loads(config_path.read_text()))
            if saved != config:
                raise ConfigError(
                    f"{self.dir} was started with another re-grounding config; resume with it"
                )
        else:
            write_atomic(config_path, json.dumps(config.to_json(), indent=1))
            prior_record = {"path": prior.path, **prior.identity}
            write_atomic(self.dir / "prior.json", json.dumps(prior_record, indent=1))
        state_path = self.dir / "state.json"
        self.state = (
            json.loads(state_path.read_text())
            if state_path.is_file()
            else {"completed": 0, "spent": 0, "chosen": [], "machine_id": self.machine}
        )
        if self.state["machine_id"] != self.machine:
            raise ConfigError(
                f"{self.dir} re-grounds on machine {self.state['machine_id']}; this is "
                f"{self.machine}: start a new run here"
            )
        with MeasurementStore(config.store) as store:
            store.add_programs(self.programs)

    # -- the run's surrogate
    def surrogate_dir(self, round_: int) -> Path:
        return self.dir / f"round-{round_}" / "surrogate"

    def current(self) -> Surrogate:
        """The surrogate after the last completed round (the prior before the first)."""
        done = self.state["completed"]
        return load_surrogate(str(self.surrogate_dir(done))) if done else self.prior

    def before_last(self) -> Surrogate | None:
        """The surrogate before the last completed round (None before the first)."""
        done = self.state["completed"]
        if not done:
            return None
        return load_surrogate(str(self.surrogate_dir(done - 1))) if done > 1 else self.prior

    def due(self, iteration: int) -> bool:
        """A round is due after `iteration` iterations (one whose budget is spent is skipped,
        and training goes on)."""
        c = self.config
        if not (
            self.state["completed"] < c.rounds
            and iteration > 0
            and iteration % c.iterations_per_round == 0
            and iteration // c.iterations_per_round > self.state["completed"]
        ):
            return False
        if self._spent() < c.real_budget:
            return True
        self.say(
            f"re-grounding round {iteration // c.iterations_per_round} skipped: the real budget "
            f"({c.real_budget} measurements) is spent; training goes on"
        )
        return False

    def allowance(self, round_: int) -> int:
        """The new measurements round `round_` may plan: what is left of the budget, less a
        reserve for each later round (its core: the learned and tracked schedules with their
        baselines, or an even share of what is left)."""
        c = self.config
        left = max(0, c.real_budget - self._spent())
        later = c.rounds - round_
        core = c.round_programs * (c.top_k + 1) + c.track_programs
        return left - min(later * core, left * later // (later + 1))

    def _phase(self, name: str, started: float, **extra) -> None:
        with (self.dir / "phases.jsonl").open("a") as sink:
            row = {"round": self.state["completed"] + 1, "phase": name, "start": started}
            sink.write(json.dumps({**row, "end": time.time(), **extra}) + "\n")

    # -- one round
    def run_round(self, policy_params) -> Surrogate:
        """Measure, score, update; returns the new surrogate. `policy_params`: the agent's
        parameters now (host arrays)."""
        jax.block_until_ready(policy_params)
        round_ = self.state["completed"] + 1
        folder = self.dir / f"round-{round_}"
        folder.mkdir(exist_ok=True)
        surrogate = self.current()
        model = CostModel.load(surrogate.path)
        tasks_path, budget_path = folder / "tasks.json", folder / "budget.json"
        if tasks_path.is_file():
            planned = [self._planned(t) for t in json.loads(tasks_path.read_text())]
            budget = json.loads(budget_path.read_text()) if budget_path.is_file() else {}
        else:
            started = time.time()
            agent = Agent(self.agent_config, policy_params, surrogate)
            planned, budget = self._plan(round_, agent)
            write_atomic(budget_path, json.dumps(budget))  # first: tasks.json ends the plan
            write_atomic(tasks_path, json.dumps([p.to_json() for p in planned], indent=1))
            self._phase("choose", started, tasks=len(planned))
            self.say(_budget_line(round_, budget, self.config.real_budget - self._spent()))
        started = time.time()
        report = self._measure(planned)
        self._phase("measure", started, measured=report.measured)
        started = time.time()
        row = self._score_and_update(round_, planned, model, surrogate, folder)
        row["measured_now"] = report.measured
        row.update(budget)
        self._phase("update", started)
        self.state["completed"] = round_
        self.state["chosen"] = sorted(
            {*self.state["chosen"], *(p.program.name for p in planned if p.role == "learn")}
        )
        self.state["spent"] = self._spent()
        row["spent"] = self.state["spent"]
        # the round's line, then the state: a kill between the two repeats the round's update
        # (its measurements are in the store) and its line is written again, not twice
        earlier = [r for r in self.rounds() if r["round"] < round_]
        text = "".join(json.dumps(r) + "\n" for r in [*earlier, row])
        write_atomic(self.dir / "rounds.jsonl", text)
        write_atomic(self.dir / "state.json", json.dumps(self.state, indent=1))
        self.say(_round_line(row))
        self.report()
        return self.current()

    def report(self) -> list[Path]:
        """`rounds.md` (the table of `format_rounds`) and the plots, from the rounds so far."""
        rows = self.rounds()
        points = []
        for r in rows:
            path = self.dir / f"round-{r['round']}" / "points.json"
            if path.is_file():
                points += [{**p, "round": r["round"]} for p in json.loads(path.read_text())]
        header = (
            f"Re-grounding on machine {self.machine}; prior: surrogate of machine "
            f"{self.prior.machine_id or '-'}; real budget {self.config.real_budget}.\n\n"
        )
        write_atomic(self.dir / "rounds.md", header + format_rounds(rows) + "\n")
        return save_round_plots(self.dir, rows, points)

    def rounds(self) -> list[dict]:
        """The completed rounds' records (`rounds.jsonl`)."""
        path = self.dir / "rounds.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _prior_model(self) -> CostModel:
        if self._prior is None:
            self._prior = CostModel.load(self.prior.path)
        return self._prior

    def _planned(self, data: dict) -> Planned:
        return Planned(
            self.by_name[data["program"]],
            Schedule.from_json(data["schedule"]),
            data["role"],
            data["predicted_speedup"],
        )

    def _row(self, store: MeasurementStore, program_hash: str, schedule_hash: str):
        """This machine's row of a schedule at the run's thread count, or None."""
        return store.get(program_hash, schedule_hash, self.machine, self.config.threads)

    def _has_rows(self) -> set[str]:
        """Hashes of the pool's programs whose baseline this machine has measured."""
        with MeasurementStore(self.config.store) as store:
            return {
                p.hash
                for p in self.by_name.values()
                if self._row(store, p.hash, Schedule().hash) is not None
            }

    def _plan(self, round_: int, agent: Agent) -> tuple[list[Planned], dict]:
        """The round's measurements within its allowance, and what the cut left out."""
        c = self.config
        rng = np.random.default_rng([c.seed, round_])
        if self._evaluator is None:  # one table and compiled episodes for every round
            self._evaluator = agent.evaluator(self.programs, self.config.threads)
        evaluator, row_of = self._evaluator, {p.name: i for i, p in enumerate(self.programs)}

        def best(programs: list[Program], n: int = 1):
            rows = [row_of[p.name] for p in programs]
            return zip(
                programs, agent.scored_schedules([], n, evaluator=evaluator, rows=rows, seed=round_)
            )

        measured = self._has_rows()
        planned: list[Planned] = []
        if round_ == 1 and not measured & {p.hash for p in self.pool}:
            calibration = pick_evenly(self.pool[::-1], c.calibration_programs)
            planned += [Planned(p, s[0].schedule, "calibration") for p, s in best(calibration)]
            planned += self._random_schedules(calibration, c.calibration_k, "calibration")
        if round_ == 1:
            planned += self._random_schedules(self.validation, c.validation_k, "validation")
        chosen_before = set(self.state["chosen"])
        candidates = [p for p in self.pool if p.name not in chosen_before]
        if c.selection == "uniform":
            picks = [candidates[i] for i in rng.permutation(len(candidates))[: c.round_programs]]
        else:
            reward = evaluator.prepare(agent.surrogate.params)
            greedy = list(best(candidates))
            rows = [row_of[p.name] for p in candidates]
            gain = (
                np.log([s[0].predicted_speedup for _, s in greedy])
                - evaluator.heuristic(reward, c.threads)[rows]
            )
            order = np.argsort(-gain, kind="stable")
            if c.selection == "uncertain_gain":
                states = [
                    state_of_schedule(p, s[0].schedule).to_env_state(row)
                    for (p, s), row in zip(greedy, rows, strict=True)
                ]
                order = uncertain_gain_order(gain, evaluator.spread_states(reward, states))
            picks = [candidates[i] for i in order[: c.round_programs]]
        for program, scored in best(picks, c.top_k):
            planned += [Planned(program, s.schedule, "learn", s.predicted_speedup) for s in scored]
        for program, scored in best(self.track):
            planned.append(
                Planned(program, scored[0].schedule, "track", scored[0].predicted_speedup)
            )
        if self.heldout and (round_ % c.heldout_every == 0 or round_ in (1, c.rounds)):
            for program, scored in best(self.heldout):
                planned.append(
                    Planned(program, scored[0].schedule, "heldout", scored[0].predicted_speedup)
                )
                planned.append(
                    Planned(program, heuristic_schedule(program, c.threads), "heuristic")
                )
        for program in {p.program.name: p.program for p in planned}.values():
            planned.append(Planned(program, Schedule(), "baseline"))
        with MeasurementStore(c.store) as store:
            stored = {p.key for p in planned if self._row(store, *p.key) is not None}
        return within_budget(planned, stored, self.allowance(round_))

    def _random_schedules(self, programs: list[Program], k: int, role: str) -> list[Planned]:
        """`k` distinct random schedules of each program, drawn as collection draws them
        (half uniform, half biased toward deeper schedules): the spread of schedules the
        surrogate's own validation scores it on, never the agent's."""
        if not programs or k < 1:
            return []
        uniform = EpisodeSampler(programs, random_policy(1.0))
        samplers = [uniform, EpisodeSampler(programs, random_policy(0.25), uniform.table)]
        planned, salt = [], sum(map(ord, role))
        for i, program in enumerate(programs):
            found: dict[str, Schedule] = {}
            for draw in range(8 * k):
                if len(found) == k:
                    break
                key = jax.random.PRNGKey(
                    self.config.seed * 1_000_003 + salt * 7919 + i * 1009 + draw
                )
                schedule, _ = samplers[draw % 2].schedule(i, key)
                if schedule.ops:  # the empty schedule is the baseline, measured anyway
                    found.setdefault(schedule.hash, schedule)
            planned += [Planned(program, s, role) for s in found.values()]
        return planned

    def _measure(self, planned: list[Planned]) -> CollectReport:
        config = CollectConfig(
            store=Path(self.config.store),
            workers=self.config.workers,
            timeout_s=self.config.timeout_s,
            threads=self.config.threads,
            method=TimingMethod(seed=self.config.seed),
        )
        by_key, baseline = {p.key: p for p in planned}, Schedule().hash
        most_needed = [
            key
            for i in priority(planned)
            for key in ((planned[i].program.hash, baseline), planned[i].key)
        ]
        with MeasurementStore(self.config.store) as store:
            needed = [
                key
                for key in dict.fromkeys([*most_needed, *by_key])
                if key in by_key and self._row(store, *key) is None
            ]
            left = max(0, self.config.real_budget - self._spent())
            if len(needed) > left:  # a resumed round whose kill lost uncommitted rows
                self.say(f"the real budget leaves {left} of the round's {len(needed)} measurements")
            first = {h: i for i, h in reversed(list(enumerate(p.program.hash for p in planned)))}
            # the most needed within the cap; a program's schedules back to back: a worker
            # keeps its inputs and reference
            chosen = sorted(needed[:left], key=lambda key: first[key[0]])
            todo = [Task(by_key[key].program, by_key[key].schedule) for key in chosen]
            report = CollectReport()
            if not todo:
                return report
            bar = progress_bar(total=len(todo), unit="meas", desc="measuring")
            with (self.dir / "measured.jsonl").open("a") as sink:  # the run's own spending

                def spent(task: Task, _) -> None:
                    sink.write(json.dumps([task.program.hash, task.schedule.hash]) + "\n")
                    sink.flush()

                try:
                    measure_stream(iter(todo), config, store, report, bar, on_result=spent)
                finally:
                    bar.close()
        return report

    def _spent(self) -> int:
        """Measurements the run has made: the lines of `measured.jsonl` (one per measurement;
        one a kill lost before its commit and measured again counts twice, as it cost)."""
        path = self.dir / "measured.jsonl"
        if not path.is_file():
            return 0
        return sum(1 for line in path.read_text().splitlines() if line.strip())

    def _rows(self, programs: list[Program]) -> Dataset | None:
        with MeasurementStore(self.config.store) as store:
            try:
                return load_dataset(
                    store,
                    self.machine,
                    threads=self.config.threads,
                    programs={p.hash for p in programs},
                    table_programs=self.programs,
                )
            except ValueError:
                return None

    def _score_and_update(
        self, round_: int, planned: list[Planned], model: CostModel, surrogate, folder: Path
    ) -> dict:
        c = self.config
        rng = np.random.default_rng([c.seed, round_, 1])
        learn = sorted({p.program.name for p in planned if p.role == "learn"})
        held = set(rng.permutation(learn)[: int(round(c.held_back * len(learn)))].tolist())
        row: dict = {
            "round": round_,
            "machine_id": self.machine,
            "programs": len(learn),
            "held_back_programs": len(held),
            "held_back": sorted(held),  # by name: the update never saw their rows
            "selection": c.selection,
            "update": c.update,
        }
        before, mine = model, self._round_schedules(planned)
        on_policy = self._rows([self.by_name[n] for n in learn])
        row["on_policy_before"] = surrogate_metrics(model, on_policy, mine)
        row["on_policy_prior"] = surrogate_metrics(self._prior_model(), on_policy, mine)
        train = [p for p in self.pool if p.name not in held]
        data = self._rows(train)
        if data is not None:  # the baseline fitted from scratch, on what `before` knew
            earlier = scratch_trees(data, exclude=mine, seed=c.seed + round_)
            row["on_policy_scratch"] = surrogate_metrics(earlier, on_policy, mine)
        if data is not None:
            anchor = anchor_states(
                c.update, data, self._prior_model(), c.anchor_share, c.seed + round_
            )
            started = time.perf_counter()
            model = model.update(
                data,
                c.update_epochs,
                machine_id=self.machine,
                threads=c.threads,
                anchor=anchor,
                note=f"re-grounding round {round_}",
            )
            row["update_seconds"] = time.perf_counter() - started
            row["update_rows"] = len(data)
        held_rows = self._rows([self.by_name[n] for n in sorted(held)])
        validation = self._rows(self.validation)
        row["held_back_after"] = surrogate_metrics(model, held_rows, mine)
        row["held_back_before"] = surrogate_metrics(before, held_rows, mine)
        refusal = update_refusal(row["held_back_before"], row["held_back_after"])
        row["update_refused"] = refusal is not None
        if refusal is not None:  # the previous weights stay: an update never makes it worse
            row["refusal"] = refusal
            model = before
            self.say(f"round {round_}: update refused, the previous weights kept ({refusal})")
        row["held_back_prior"] = surrogate_metrics(self._prior_model(), held_rows, mine)
        row["validation"] = surrogate_metrics(model, validation)
        row["validation_prior"] = surrogate_metrics(self._prior_model(), validation)
        if data is not None:  # on every row the update learnt from
            scratch = scratch_trees(data, exclude=set(), seed=c.seed + round_)
            row["held_back_scratch"] = surrogate_metrics(scratch, held_rows, mine)
            row["validation_scratch"] = surrogate_metrics(scratch, validation)
        row.update(self._real_speedups(planned, folder))
        target = self.surrogate_dir(round_)
        tmp = target.with_name("surrogate.tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # a save a kill cut short
        model.save(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        return row

    @staticmethod
    def _round_schedules(planned: list[Planned]) -> set[tuple[str, str]]:
        return {(p.program.hash, p.schedule.hash) for p in planned}

    def _real_speedups(self, planned: list[Planned], folder: Path) -> dict:
        """Real geomean speedups over unscheduled of the round's tracked and held-out
        schedules (verified rows only); the learned schedules' predicted and real speedups go
        to `points.json`."""
        out = {}
        with MeasurementStore(self.config.store) as store:

            def time_of(p: Program, s: Schedule) -> float | None:
                r = self._row(store, p.hash, s.hash)
                return r["median_s"] if r and r["status"] == "ok" else None

            points = []
            for p in planned:
                if p.role != "learn" or not p.predicted_speedup:
                    continue
                base, tuned = time_of(p.program, Schedule()), time_of(p.program, p.schedule)
                if base and tuned:
                    points.append({"predicted": p.predicted_speedup, "real": base / tuned})
            write_atomic(folder / "points.json", json.dumps(points))

            for role in ("track", "heldout", "heuristic"):
                speedups = []
                for p in planned:
                    if p.role != role:
                        continue
                    base, tuned = time_of(p.program, Schedule()), time_of(p.program, p.schedule)
                    if base and tuned:
                        speedups.append(base / tuned)
                if speedups:
                    out[f"real_{role}_geomean"] = geomean(speedups)
                    out[f"real_{role}_programs"] = len(speedups)
        if "real_heldout_geomean" in out and "real_heuristic_geomean" in out:
            out["heldout_over_heuristic"] = (
                out["real_heldout_geomean"] / out["real_heuristic_geomean"]
            )
        return out


RESIDUAL_TREES = {
    "objective": "regression",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 10,
    "feature_fraction": 0.5,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "deterministic": True,
    "verbose": -1,
}
RESIDUAL_ROUNDS = 150


def anchor_states(
    kind: str, data: Dataset, prior: CostModel, share: float, seed: int
) -> Dataset | None:
    """The unmeasured states an update of `kind` learns from beside `data` (see
    `RegroundConfig.update`): None for "measured"."""
    if kind == "measured" or share <= 0:
        return None
    anchor = random_states(data, max(1, int(share * len(data))), seed=seed)
    anchor.log_time = predict_dataset(prior, anchor)
    if kind == "residual":
        import lightgbm

        from cost_model.teacher import tree_inputs

        inputs, _ = tree_inputs(data.features)
        residual = data.log_time - predict_dataset(prior, data)
        params = {**RESIDUAL_TREES, "seed": seed, "num_threads": os.cpu_count() or 1}
        booster = lightgbm.train(
            params, lightgbm.Dataset(inputs, residual), num_boost_round=RESIDUAL_ROUNDS
        )
        correction = booster.predict(
            tree_inputs(anchor.features)[0], num_threads=params["num_threads"]
        )
        anchor.log_time = (anchor.log_time + correction).astype(np.float32)
    return anchor


def scratch_trees(data: Dataset, exclude: set, seed: int) -> Callable[[Dataset], np.ndarray]:
    """The from-scratch baseline: the teacher's recipe (gradient-boosted trees, as shaped the
    shipped network) fitted on this machine's rows alone, those of `exclude`'s schedules left
    out (baselines kept); returns its predictor of log time."""
    from cost_model.teacher import fit_tree_teacher

    if exclude:
        keep = [
            i
            for i in range(len(data))
            if data.is_baseline[i]
            or (data.programs[data.program[i]].hash, data.schedule_hash[i]) not in exclude
        ]
        data = data.subset(np.asarray(keep, np.int64))
    teacher, _ = fit_tree_teacher(data, SCRATCH_ROUNDS, SCRATCH_LEAVES, seed)
    return lambda rows: teacher.predict(rows.features)


SCRATCH_ROUNDS, SCRATCH_LEAVES = 500, 31  # the teacher's rounds; leaves for ~1,000 rows


def update_refusal(before: dict | None, after: dict | None) -> str | None:
    """Why an update is refused, None if it is kept: its MAPE of speedup on the round's
    held-back rows (programs the update never saw) grew. Without held-back rows to judge by,
    the update is kept."""
    b = (before or {}).get("mape_speedup")
    a = (after or {}).get("mape_speedup")
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    if a > b:
        return f"held-back MAPE of speedup grew from {b:.1%} to {a:.1%}"
    return None


def surrogate_metrics(
    model: CostModel | Callable[[Dataset], np.ndarray],
    data: Dataset | None,
    only: set | None = None,
) -> dict | None:
    """The error on `data` of a surrogate (or of a predictor of log time; on-policy: on the
    rows of `only`'s schedules, each program's baseline kept): MAPE of speedup, Spearman per
    program, pairwise accuracy, and how often its top-1 is the measured top-1."""
    if data is None:
        return None
    if only is not None:
        keep = np.array(
            [
                bool(data.is_baseline[i])
                or (data.programs[data.program[i]].hash, data.schedule_hash[i]) in only
                for i in range(len(data))
            ]
        )
        data = data.subset(np.flatnonzero(keep))
    predicted = predict_dataset(model, data) if isinstance(model, CostModel) else model(data)
    result = evaluate(predicted, data.log_time, data.program, data.is_baseline)
    hits = []
    for p in np.unique(data.program):
        rows = np.flatnonzero((data.program == p) & ~data.is_baseline)
        if len(rows) >= 2:
            hits.append(np.argmin(predicted[rows]) == np.argmin(data.log_time[rows]))
    result["top1_hit"] = float(np.mean(hits)) if hits else math.nan
    result["rows"] = len(data)
    return result


def _budget_line(round_: int, budget: dict, left: int) -> str:
    """What a round's plan asks for, within its allowance, and what was cut."""
    cut = ", ".join(f"{n} {role}" for role, n in budget["cut"].items())
    return (
        f"round {round_}: {budget['planned']} new measurements planned"
        f" (the plan wanted {budget['wanted']}; {budget['allowance']} allowed of {left} left)"
        + (f"; cut: {cut}" if cut else "")
    )


def _round_line(row: dict) -> str:
    def m(key: str, name: str) -> str:
        value = (row.get(key) or {}).get(name)
        return (
            "-"
            if value is None or (isinstance(value, float) and math.isnan(value))
            else f"{value:.3f}"
        )

    return (
        f"round {row['round']}: on-policy MAPE {m('on_policy_before', 'mape_speedup')} before, "
        f"held-back {m('held_back_before', 'mape_speedup')} -> {m('held_back_after', 'mape_speedup')}"
        f"{' (update refused: previous weights kept)' if row.get('update_refused') else ''}; "
        f"validation Spearman {m('validation', 'spearman')} (prior {m('validation_prior', 'spearman')}); "
        f"real greedy on tracked programs {row.get('real_track_geomean', float('nan')):.2f}x; "
        f"{row['spent']} measurements spent"
    )


@dataclass(frozen=True)
class Rounds:
    """The `regrounding` argument of `run_training` (`rounds(config)`): called with the run's
    folder, whether it resumes, its agent config, training programs and prior, it builds the
    run's `Regrounding` from `config`, or on resume from the config the run started with
    (`config` None); None where there are no rounds."""

    config: RegroundConfig | None

    def __call__(
        self, out: Path, resume: bool, agent_config, train_programs, prior
    ) -> Regrounding | None:
        from mlirrl_jax.agent.run import load_programs, training_suites
        from mlirrl_jax.splits import SURROGATE_VALIDATION, TEST

        chosen = self.config
        saved = Path(out) / "regrounding" / "config.json"
        if chosen is None and resume and saved.is_file():
            chosen = RegroundConfig.from_json(json.loads(saved.read_text()))
        if chosen is None or chosen.rounds == 0:
            return None
        return Regrounding(
            out,
            chosen,
            agent_config,
            train_programs,
            load_programs(TEST, ("dl-v0",)),
            load_programs(SURROGATE_VALIDATION, training_suites(agent_config, prior)),
            prior,
        )


def rounds(config: RegroundConfig | None) -> Rounds:
    """The re-grounding of a training run: `config`'s, or (None) a resumed run's own."""
    return Rounds(config)


def format_rounds(rows: list[dict]) -> str:
    """Markdown: per round, the surrogate's on-policy error before its update, on the
    held-back programs after it, on this machine's validation programs, and the real
    geomean speedups of the agent's greedy schedules."""

    def m(row: dict, key: str, name: str, fmt: str = ".3f") -> str:
        value = (row.get(key) or {}).get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return format(value, fmt)

    def x(row: dict, key: str) -> str:
        return f"{row[key]:.2f}x" if key in row else "-"

    def three(row: dict, key: str, name: str, fmt: str) -> str:
        return " / ".join(m(row, key + suffix, name, fmt) for suffix in ("", "_prior", "_scratch"))

    lines = [
        "Each error cell: the re-grounded surrogate / the prior not fine-tuned / trees fitted "
        "from scratch on this machine's rows alone, on the same rows.",
        "",
        "| round | measured (total) | on-policy MAPE before update | on-policy Spearman | "
        "top-1 hit | held-back MAPE after update | validation Spearman | validation MAPE "
        "| real greedy, tracked | real greedy, held-out / heuristic |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        r = {**r, "on_policy": r.get("on_policy_before"), "held_back": r.get("held_back_after")}
        lines.append(
            f"| {r['round']} | {r.get('measured_now', 0)} ({r['spent']}) | "
            f"{three(r, 'on_policy', 'mape_speedup', '.1%')} | "
            f"{three(r, 'on_policy', 'spearman', '.3f')} | "
            f"{three(r, 'on_policy', 'top1_hit', '.2f')} | "
            f"{three(r, 'held_back', 'mape_speedup', '.1%')} | "
            f"{three(r, 'validation', 'spearman', '.3f')} | "
            f"{three(r, 'validation', 'mape_speedup', '.1%')} | {x(r, 'real_track_geomean')} | "
            f"{x(r, 'real_heldout_geomean')} / {x(r, 'real_heuristic_geomean')} |"
        )
    return "\n".join(lines)


def save_round_plots(directory: Path, rows: list[dict], points: list[dict]) -> list[Path]:
    """`onpolicy_error.png` (the errors per round) and `predicted_vs_real.png` (each round's
    measured schedules: the speedup the surrogate predicted when choosing them against the
    real one, coloured by round)."""
    plt = pyplot()
    written = []
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4))
        rounds_ = [r["round"] for r in rows]
        for key, label in (
            ("on_policy_before", "on-policy, before the update"),
            ("held_back_after", "held-back programs, after the update"),
            ("validation", "validation programs (this machine)"),
        ):
            values = [(r.get(key) or {}).get("mape_speedup", math.nan) for r in rows]
            ax.plot(rounds_, values, marker="o", label=label)
        ax.axhline(0.2, color="grey", linestyle=":", label="20%")
        ax.set_xlabel("round")
        ax.set_ylabel("MAPE of speedup")
        ax.legend()
        fig.tight_layout()
        written.append(save_figure(fig, directory / "onpolicy_error.png"))
    if points:
        fig, ax = plt.subplots(figsize=(5, 5))
        scatter = ax.scatter(
            [p["real"] for p in points],
            [p["predicted"] for p in points],
            c=[p["round"] for p in points],
            cmap="viridis",
            s=12,
        )
        low = min(min(p["real"], p["predicted"]) for p in points)
        high = max(max(p["real"], p["predicted"]) for p in points)
        ax.plot([low, high], [low, high], color="grey", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("real speedup (this machine)")
        ax.set_ylabel("predicted when chosen")
        fig.colorbar(scatter, label="round")
        fig.tight_layout()
        written.append(save_figure(fig, directory / "predicted_vs_real.png"))
    return written
