"""The rounds of one training run (`Regrounding`): plan, measure, score and update the
surrogate, report; the whole story is the package's documentation (`mlirrl_jax.regrounding`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import jax
import numpy as np

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.agent.config import AgentConfig
from mlirrl_jax.agent.surrogate import Surrogate, load_surrogate
from mlirrl_jax.budget import TimeBudget
from mlirrl_jax.env.replay import state_of_schedule
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.records import RoundRow
from mlirrl_jax.regrounding.config import RegroundConfig, uncertain_gain_order
from mlirrl_jax.regrounding.measure import RoundMeasurer
from mlirrl_jax.regrounding.plan import Planned, within_budget
from mlirrl_jax.regrounding.report import (
    budget_line,
    format_rounds,
    real_speedups,
    round_line,
    save_round_plots,
)
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.sampler import EpisodeSampler, random_policy
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.adapt import (
    anchor_states,
    scratch_trees,
    surrogate_metrics,
    update_refusal,
)
from mlirrl_jax.surrogate.api import CostModel
from mlirrl_jax.surrogate.dataset import Dataset, load_dataset
from mlirrl_jax.util.stats import pick_evenly

log = logging.getLogger(__name__)


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
        budget: TimeBudget | None = None,
        deadline: float | None = None,
    ):
        """`deadline` (time.time(), with `budget` to record what it cuts): no round starts
        that would not end by it, and a round's measuring stops in time for its update; it is
        the job's, never saved with the run (`RoundMeasurer`)."""
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
        self.measurer = RoundMeasurer(self.dir, config, self.machine, deadline, budget)
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
        round_ = iteration // c.iterations_per_round
        if self.measurer.spent() >= c.real_budget:
            self.say(
                f"re-grounding round {round_} skipped: the real budget "
                f"({c.real_budget} measurements) is spent; training goes on"
            )
            return False
        return self.measurer.time_for_round(round_)

    def allowance(self, round_: int) -> int:
        """The new measurements round `round_` may plan: what is left of the budget, less a
        reserve for each later round (its core: the learned and tracked schedules with their
        baselines, or an even share of what is left)."""
        c = self.config
        left = max(0, c.real_budget - self.measurer.spent())
        later = c.rounds - round_
        core = c.round_programs * (c.top_k + 1) + c.track_programs
        return left - min(later * core, left * later // (later + 1))

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
            self.measurer.phase(round_, "choose", started, tasks=len(planned))
            self.say(budget_line(round_, budget, self.config.real_budget - self.measurer.spent()))
        started = time.time()
        report = self.measurer.measure(planned)
        self.measurer.phase(round_, "measure", started, measured=report.measured)
        started = time.time()
        found = self._score_and_update(round_, planned, model, surrogate, folder)
        self.measurer.phase(round_, "update", started)
        self.state["completed"] = round_
        self.state["chosen"] = sorted(
            {*self.state["chosen"], *(p.program.name for p in planned if p.role == "learn")}
        )
        self.state["spent"] = self.measurer.spent()
        row = RoundRow.from_json(
            {
                **found,
                **budget,
                "measured_now": report.measured,
                "spent": self.state["spent"],
                "time_cut": report.time_cut,
            }
        )
        # the round's line, then the state: a kill between the two repeats the round's update
        # (its measurements are in the store) and its line is written again, not twice
        earlier = [r for r in self.rounds() if r.round < round_]
        text = "".join(json.dumps(r.to_json()) + "\n" for r in [*earlier, row])
        write_atomic(self.dir / "rounds.jsonl", text)
        write_atomic(self.dir / "state.json", json.dumps(self.state, indent=1))
        self.say(round_line(row))
        self.report()
        return self.current()

    def report(self) -> list[Path]:
        """`rounds.md` (the table of `format_rounds`) and the plots, from the rounds so far."""
        rows = self.rounds()
        points = []
        for r in rows:
            path = self.dir / f"round-{r.round}" / "points.json"
            if path.is_file():
                points += [{**p, "round": r.round} for p in json.loads(path.read_text())]
        header = (
            f"Re-grounding on machine {self.machine}; prior: surrogate of machine "
            f"{self.prior.machine_id or '-'}; real budget {self.config.real_budget}.\n\n"
        )
        write_atomic(self.dir / "rounds.md", header + format_rounds(rows) + "\n")
        return save_round_plots(self.dir, rows, points)

    def rounds(self) -> list[RoundRow]:
        """The completed rounds' records (`rounds.jsonl`)."""
        path = self.dir / "rounds.jsonl"
        if not path.is_file():
            return []
        lines = path.read_text().splitlines()
        return [RoundRow.from_json(json.loads(line)) for line in lines if line.strip()]

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

    def _has_rows(self) -> set[str]:
        """Hashes of the pool's programs whose baseline this machine has measured."""
        with MeasurementStore(self.config.store) as store:
            return {
                p.hash
                for p in self.by_name.values()
                if self.measurer.row(store, p.hash, Schedule().hash) is not None
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
            stored = {p.key for p in planned if self.measurer.row(store, *p.key) is not None}
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

    def _rows(self, programs: list[Program]) -> Dataset | None:
        hashes = {p.hash for p in programs}
        with MeasurementStore(self.config.store) as store:
            if not any(
                r["threads"] == self.config.threads
                for h in hashes
                for r in store.rows(machine_id=self.machine, status="ok", program_hash=h)
            ):
                return None  # nothing verified of these programs here yet
            return load_dataset(
                store,
                self.machine,
                threads=self.config.threads,
                programs=hashes,
                table_programs=self.programs,
            )

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
        with MeasurementStore(self.config.store) as store:

            def time_of(p: Program, s: Schedule) -> float | None:
                r = self.measurer.row(store, p.hash, s.hash)
                return r["median_s"] if r and r["status"] == "ok" else None

            row.update(real_speedups(planned, folder, time_of))
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
