"""What a run's rounds measure and spend (`RoundMeasurer`): the schedules a round planned,
measured into the store with the most needed first, the run's spending (`measured.jsonl`),
each phase's wall-clock interval (`phases.jsonl`), and the job's deadline, if it has one."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from mlirrl_jax.budget import TimeBudget
from mlirrl_jax.collect import CollectConfig, CollectReport, Task, measure_stream
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.regrounding.config import RegroundConfig
from mlirrl_jax.regrounding.plan import Planned, priority
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.store.rows import StoredRow
from mlirrl_jax.util.progress import progress_bar

log = logging.getLogger(__name__)

MIN_MEASURE_S = 30.0  # the least measuring a round under a deadline is started for
UPDATE_SHARE = 0.2  # of the time left, kept for the first update under a deadline


class RoundMeasurer:
    """The measuring side of the rounds in `folder` (the run's `regrounding/`), on `machine`
    at the config's thread count.

    `deadline` (time.time(), with `budget` to record what it cuts): a round starts only if
    there is time for it (`time_for_round`), and its measuring stops in time for its update
    (`measure`); it is the job's, never saved with the run."""

    def __init__(
        self,
        folder: Path,
        config: RegroundConfig,
        machine: str,
        deadline: float | None = None,
        budget: TimeBudget | None = None,
    ):
        self.dir = Path(folder)
        self.config = config
        self.machine = machine
        self.deadline = deadline
        self.budget = budget

    def row(
        self, store: MeasurementStore, program_hash: str, schedule_hash: str
    ) -> StoredRow | None:
        """This machine's row of a schedule at the run's thread count, or None."""
        return store.get(program_hash, schedule_hash, self.machine, self.config.threads)

    def spent(self) -> int:
        """Measurements the run has made: the lines of `measured.jsonl` (one per measurement;
        one a kill lost before its commit and measured again counts twice, as it cost)."""
        path = self.dir / "measured.jsonl"
        if not path.is_file():
            return 0
        return sum(1 for line in path.read_text().splitlines() if line.strip())

    # -- the phases and the deadline
    def phase(self, round_: int, name: str, started: float, **extra) -> None:
        """Record that round `round_`'s phase `name` ran from `started` (time.time()) to now."""
        with (self.dir / "phases.jsonl").open("a") as sink:
            row = {"round": round_, "phase": name, "start": started}
            sink.write(json.dumps({**row, "end": time.time(), **extra}) + "\n")

    def phase_seconds(self) -> dict[str, list[float]]:
        """Seconds each phase of the rounds so far took ("choose", "measure", "update"), in
        round order, from `phases.jsonl`."""
        took: dict[str, list[float]] = {"choose": [], "measure": [], "update": []}
        path = self.dir / "phases.jsonl"
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    took.setdefault(row["phase"], []).append(row["end"] - row["start"])
        return took

    def round_needs_s(self) -> float:
        """The least time worth starting a round in: its choosing, `MIN_MEASURE_S` of
        measuring and its update, each as long as the last round's (the first round's
        choosing holds the one-time compile: a quarter of it stands for a later one's); 0
        before the first round, which always starts."""
        took = self.phase_seconds()
        if not took["update"]:
            return 0.0
        choose = took["choose"][-1] if len(took["choose"]) > 1 else 0.25 * took["choose"][-1]
        return choose + MIN_MEASURE_S + took["update"][-1]

    def time_for_round(self, round_: int) -> bool:
        """Whether round `round_` can end by the deadline (always, with none); a round that
        cannot is cut, and the cut recorded."""
        if self.deadline is None:
            return True
        needs, left = self.round_needs_s(), self.deadline - time.time()
        if left >= needs:
            return True
        self._cut(
            f"round {round_} of {self.config.rounds}",
            f"{max(left, 0):.0f} s left before the deadline, a round needs about {needs:.0f} s",
        )
        return False

    def measure_deadline(self) -> float | None:
        """When a round's measuring stops: the deadline less the update's time (the last
        round's, or `UPDATE_SHARE` of the time left before the first), but never before
        `MIN_MEASURE_S` from now: a round that started measures something to learn from,
        even where its choosing (the first round's compile, say) ran past the deadline."""
        if self.deadline is None:
            return None
        took = self.phase_seconds()["update"]
        update = took[-1] if took else UPDATE_SHARE * max(0.0, self.deadline - time.time())
        return max(self.deadline - update, time.time() + MIN_MEASURE_S)

    def _cut(self, what: str, why: str) -> None:
        if self.budget is not None:
            self.budget.cut("re-grounding", what, why)
        else:
            log.warning("re-grounding: %s cut for time (%s)", what, why)

    # -- measuring
    def measure(self, planned: list[Planned], deadline: float | None = None) -> CollectReport:
        """Measure what the store lacks of `planned` within the run's real budget, the most
        needed programs first; at `deadline` (time.time(); default `measure_deadline()`) the
        measurements not yet started are left out, counted in the report's `time_cut`."""
        deadline = self.measure_deadline() if deadline is None else deadline
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
                if key in by_key and self.row(store, *key) is None
            ]
            left = max(0, self.config.real_budget - self.spent())
            if len(needed) > left:  # a resumed round whose kill lost uncommitted rows
                log.info(
                    "the real budget leaves %d of the round's %d measurements", left, len(needed)
                )
            first = {h: i for i, (h, _) in reversed(list(enumerate(needed)))}
            # the most needed within the cap; a program's schedules back to back (a worker
            # keeps its inputs and reference), the program of the most needed one first
            chosen = sorted(needed[:left], key=lambda key: first[key[0]])
            todo = [Task(by_key[key].program, by_key[key].schedule) for key in chosen]
            report = CollectReport()
            if not todo:
                return report
            out_of_time = (lambda: time.time() >= deadline) if deadline else (lambda: False)
            bar = progress_bar(total=len(todo), unit="meas", desc="measuring")
            with (self.dir / "measured.jsonl").open("a") as sink:  # the run's own spending

                def spent(task: Task, _) -> None:
                    sink.write(json.dumps([task.program.hash, task.schedule.hash]) + "\n")
                    sink.flush()

                try:
                    measure_stream(
                        iter(todo), config, store, report, bar, done=out_of_time, on_result=spent
                    )
                finally:
                    bar.close()
        left_out = len(todo) - report.measured - report.skipped
        if deadline and left_out > 0 and out_of_time():
            report.time_cut = left_out
            self._cut(
                f"{left_out} of a round's {len(todo)} measurements, the least needed",
                "measuring stopped in time for the update before the deadline",
            )
        return report
