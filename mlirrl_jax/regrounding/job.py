"""The rounds of one training run (`Regrounding`): each round planned (`planner`), measured
(`measure`), scored and the surrogate updated (`update`), then reported; the whole story is the
package's documentation (`mlirrl_jax.regrounding`). It is `run_training`'s `TrainingHook`."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import jax

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.agent.config import AgentConfig
from mlirrl_jax.agent.surrogate import Surrogate, load_surrogate
from mlirrl_jax.budget import TimeBudget
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.records import RoundRow
from mlirrl_jax.regrounding.config import RegroundConfig
from mlirrl_jax.regrounding.measure import RoundMeasurer
from mlirrl_jax.regrounding.plan import Planned
from mlirrl_jax.regrounding.planner import Pools, RoundPlanner
from mlirrl_jax.regrounding.report import budget_line, format_rounds, round_line, save_round_plots
from mlirrl_jax.regrounding.state import RoundState
from mlirrl_jax.regrounding.update import RoundUpdater
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.api import CostModel

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
        self.pools = Pools.of(config, train_programs, heldout_programs, validation_programs)
        self.measurer = RoundMeasurer(self.dir, config, self.machine, deadline, budget)
        self.planner = RoundPlanner(config, self.pools, self.measurer)
        self.updater = RoundUpdater(config, self.pools, self.measurer, prior, say=self.say)
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
        self.state = RoundState.load(self.dir / "state.json", self.machine)
        with MeasurementStore(config.store) as store:
            store.add_programs(self.pools.programs)

    # -- the run's surrogate
    def surrogate_dir(self, round_: int) -> Path:
        return self.dir / f"round-{round_}" / "surrogate"

    def current(self) -> Surrogate:
        """The surrogate after the last completed round (the prior before the first)."""
        done = self.state.completed
        return load_surrogate(str(self.surrogate_dir(done))) if done else self.prior

    def before_last(self) -> Surrogate | None:
        """The surrogate before the last completed round (None before the first)."""
        done = self.state.completed
        if not done:
            return None
        return load_surrogate(str(self.surrogate_dir(done - 1))) if done > 1 else self.prior

    def due(self, iteration: int) -> bool:
        """A round is due after `iteration` iterations (one whose budget is spent is skipped,
        and training goes on)."""
        c = self.config
        if not (
            self.state.completed < c.rounds
            and iteration > 0
            and iteration % c.iterations_per_round == 0
            and iteration // c.iterations_per_round > self.state.completed
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

    # -- one round
    def run_round(self, policy_params) -> Surrogate:
        """Measure, score, update; returns the new surrogate. `policy_params`: the agent's
        parameters now (host arrays)."""
        jax.block_until_ready(policy_params)
        round_ = self.state.completed + 1
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
            planned, budget = self.planner.plan(round_, agent, set(self.state.chosen))
            write_atomic(budget_path, json.dumps(budget))  # first: tasks.json ends the plan
            write_atomic(tasks_path, json.dumps([p.to_json() for p in planned], indent=1))
            self.measurer.phase(round_, "choose", started, tasks=len(planned))
            self.say(budget_line(round_, budget, self.config.real_budget - self.measurer.spent()))
        started = time.time()
        report = self.measurer.measure(planned)
        self.measurer.phase(round_, "measure", started, measured=report.measured)
        started = time.time()
        row = self.updater.update(round_, planned, model, folder, self.surrogate_dir(round_))
        self.measurer.phase(round_, "update", started)
        self.state.completed = round_
        self.state.chosen = sorted(
            {*self.state.chosen, *(p.program.name for p in planned if p.role == "learn")}
        )
        self.state.spent = self.measurer.spent()
        row = dataclasses.replace(
            row,
            **budget,
            measured_now=report.measured,
            spent=self.state.spent,
            time_cut=report.time_cut,
        )
        # the round's line, then the state: a kill between the two repeats the round's update
        # (its measurements are in the store) and its line is written again, not twice
        earlier = [r for r in self.rounds() if r.round < round_]
        text = "".join(json.dumps(r.to_json()) + "\n" for r in [*earlier, row])
        write_atomic(self.dir / "rounds.jsonl", text)
        self.state.save(self.dir / "state.json")
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

    def _planned(self, data: dict) -> Planned:
        return Planned(
            self.pools.by_name[data["program"]],
            Schedule.from_json(data["schedule"]),
            data["role"],
            data["predicted_speedup"],
        )
