"""The validation job: plans, measurements appended as they come, resumable, and its report
(`Validation`)."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.records import ValidationRow
from mlirrl_jax.runfolder import naming, write_atomic
from mlirrl_jax.util.progress import progress_bar
from mlirrl_jax.validation.config import ValidationConfig, ValidationError
from mlirrl_jax.validation.measure import measure_plan
from mlirrl_jax.validation.plan import Plan, plan
from mlirrl_jax.validation.report import (
    save_validation_plots,
)
from mlirrl_jax.validation.summary import per_threads, summarize
from mlirrl_jax.validation.tables import format_validation, save_programs, save_schedules

log = logging.getLogger(__name__)


class Validation:
    """One validation run into a folder: `run()` measures what is not done yet, `report()`
    writes the Markdown, JSON and plots from everything measured."""

    def __init__(
        self,
        agent: Agent | dict[int, Agent],
        programs: list[Program],
        out: str | os.PathLike,
        config: ValidationConfig | None = None,
        agent_run: str | dict[int, str] | None = None,
        deadline: float | None = None,
        budget=None,
    ):
        """`agent`: one agent for every thread count, or one per thread count (for example
        each adapted to this machine at its thread count); `agent_run` names them alike.

        `deadline` (time.time()): a program (at a thread count) is measured only if it is
        expected to end by then, at the mean time of those measured so far; the first always
        is. What is left out is recorded in `budget` (a `budget.TimeBudget`) and logged."""
        if not programs:
            raise ValidationError("no programs to validate")
        names = [p.name for p in programs]
        if len(set(names)) != len(names):
            raise ValidationError(
                f"programs repeat: {sorted(n for n in names if names.count(n) > 1)}"
            )
        self.config = config or ValidationConfig()
        threads = self.config.threads
        self.agents = agent if isinstance(agent, dict) else dict.fromkeys(threads, agent)
        missing = [t for t in threads if t not in self.agents]
        if missing:
            raise ValidationError(f"no agent for {missing} thread(s)")
        self.agent_runs = (
            agent_run if isinstance(agent_run, dict) else dict.fromkeys(threads, agent_run)
        )
        self.programs = programs
        self.deadline = deadline
        self.budget = budget
        self.out = Path(out)
        self.machine = machine_fingerprint()["machine_id"]
        self.rows_path = self.out / "validation.jsonl"
        self.out.mkdir(parents=True, exist_ok=True)
        settings = self.out / "validation_config.json"
        recorded = {
            "config": {**asdict(self.config), "threads": list(self.config.threads)},
            "machine_id": self.machine,
            "programs": {p.name: p.hash for p in programs},
            "agent": per_threads(self.agent_runs, threads),
        }
        if settings.is_file():
            before = json.loads(settings.read_text())
            self._check_same_programs(before.get("programs"), recorded["programs"])
            if before != recorded:
                raise ValidationError(
                    f"{self.out} holds a validation with other settings ({settings}): use "
                    "another folder, or remove it to start again"
                )
        else:
            write_atomic(settings, json.dumps(recorded, indent=1))

    def _check_same_programs(self, before, now: dict[str, str]) -> None:
        """Refuse a program whose content changed under the name the folder measured it by:
        its rows are another program's."""
        if not isinstance(before, dict):
            return  # the folder names its programs only: refused as other settings
        for name, digest in now.items():
            if before.get(name, digest) != digest:
                raise ValidationError(
                    f"{name} is not the program {self.out} measured under that name (program "
                    f"hash {before[name][:12]} there, {digest[:12]} now): use another --out"
                )

    def done(self) -> list[ValidationRow]:
        if not self.rows_path.is_file():
            return []
        rows = []
        for line in self.rows_path.read_text().splitlines():
            try:
                rows.append(ValidationRow.from_json(json.loads(line)))
            except json.JSONDecodeError:
                break  # a line a kill cut short: measured again
        return rows

    def _cut_partial_line(self) -> None:
        """Drop a last line a kill or a full disk cut short, so that appended rows follow a
        whole one (`done` stops reading at a broken line)."""
        if not self.rows_path.is_file():
            return
        data = self.rows_path.read_bytes()
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            os.truncate(self.rows_path, whole)

    def run(self) -> list[ValidationRow]:
        self._cut_partial_line()
        rows = self.done()
        have = {(r.program_hash, r.threads) for r in rows}
        todo = [
            p for p in self.programs if any((p.hash, t) not in have for t in self.config.threads)
        ]
        if not todo:
            return rows
        started = time.perf_counter()
        say = log.info
        if say:
            say(f"choosing schedules of {len(todo)} programs (agent, random, surrogate-ranked)")
        plans: dict[int, list[Plan]] = {}  # per thread count: the count is observed
        for t in self.config.threads:
            plans[t] = plan(self.agents[t], todo, self.config, t)
        if say:
            say(f"  chosen in {time.perf_counter() - started:.0f} s; measuring on {self.machine}")
        store = None
        if self.config.store:
            from mlirrl_jax.store import MeasurementStore

            store = MeasurementStore(self.config.store)
            store.add_programs(todo)
        surrogates = self._search_surrogates()
        jobs = [
            (plans[t][i], t)
            for i, p in enumerate(todo)
            for t in self.config.threads
            if (p.hash, t) not in have
        ]
        bar = progress_bar(total=len(jobs), desc="validation", unit="run")
        try:
            with (
                Runner(self.config.timeout_s, self.config.mem_limit_mb) as runner,
                open(self.rows_path, "ab", buffering=0) as rows_file,  # no buffer to flush at close
            ):
                bases: dict[str, Measurement] = {}
                took: list[float] = []
                for j, (p, threads) in enumerate(jobs):
                    if self._out_of_time(took, jobs[j:]):
                        break
                    job_started = time.perf_counter()
                    name = p.program.name
                    if name not in bases:
                        bases[name] = runner.measure(
                            p.program, None, threads=1, method=TimingMethod(seed=self.config.seed)
                        )
                        if store is not None:
                            store.put([bases[name]])
                    row = measure_plan(
                        p, threads, bases[name], runner, self.config, store, surrogates.get(threads)
                    )
                    row.machine_id = self.machine
                    line = (json.dumps(row.to_json()) + "\n").encode()
                    with naming(self.rows_path):
                        while line:  # a write cut short by a filling disk: the rest, or ENOSPC
                            line = line[rows_file.write(line) :]
                        os.fsync(rows_file.fileno())
                    rows.append(row)
                    took.append(time.perf_counter() - job_started)
                    bar.update(1)
                    bar.set_postfix_str(f"{name.split('/')[-1]} t{threads}")
        finally:
            bar.close()
            if store is not None:
                store.close()
        return rows

    def _out_of_time(self, took: list[float], left: list[tuple[Plan, int]]) -> bool:
        """Whether the rest (`left`) is cut: the next program would not end by the deadline
        at the mean time of those measured so far (`took`)."""
        if self.deadline is None or not took:
            return False
        expected = sum(took) / len(took)
        if time.time() + expected <= self.deadline:
            return False
        names = [f"{p.program.name.split('/')[-1]} ({t}t)" for p, t in left]
        what = f"{len(left)} of {len(left) + len(took)} programs: {', '.join(names)}"
        why = f"{expected:.0f} s each, {max(0.0, self.deadline - time.time()):.0f} s left"
        if self.budget is not None:
            self.budget.cut("validation", what, why)
        else:
            log.warning("validation: %s cut for time (%s)", what, why)
        return True

    def _search_surrogates(self) -> dict:
        """Per thread count, the cost model the evolutionary search starts from: the one its
        agent trains against (none for the analytic stand-in)."""
        if not self.config.evolutionary_budget:
            return {}
        from mlirrl_jax.surrogate.api import CostModel

        loaded: dict[str, object] = {}
        out = {}
        for t in self.config.threads:
            path = self.agents[t].surrogate.path
            if path and path != "analytic":
                if path not in loaded:
                    loaded[path] = CostModel.load(path)
                out[t] = loaded[path]
        return out

    def report(
        self, rows: list[ValidationRow] | None = None, peak_gflops: float | None = None
    ) -> dict:
        rows = self.done() if rows is None else rows
        summary = summarize(rows, self.config, peak_gflops)
        summary["machine_id"] = self.machine
        threads = self.config.threads
        summary["agent"] = per_threads(self.agent_runs, threads)
        summary["surrogate_machine"] = per_threads(
            {t: a.surrogate.machine_id for t, a in self.agents.items()}, threads
        )
        summary["surrogate_threads"] = {str(t): self.agents[t].surrogate.threads for t in threads}
        paths = save_schedules(rows, self.out / "validation" / "schedules")
        sources = save_programs(self.programs, self.out / "validation" / "programs")
        text = format_validation(rows, summary, self.config, paths, sources)
        write_atomic(self.out / "validation.md", text + "\n")
        write_atomic(
            self.out / "validation.json",
            json.dumps({"summary": summary, "rows": [r.to_json() for r in rows]}, indent=1),
        )
        save_validation_plots(rows, self.out)
        return summary
