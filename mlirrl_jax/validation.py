"""The final validation: the trained agent's schedules, run for real on this machine, against
what the user could have had otherwise, every method measured in the same run, the same way,
every output verified.

Per program and thread count the methods are

- `unscheduled`: the program as written (measured once, at one thread: the reference of every
  speedup in the run);
- `heuristic`: the heuristic schedule for the thread count;
- `agent_greedy`: the agent's most likely schedule, chosen with no real measurement;
- `agent_topk`: the agent's k proposals, all measured, the best kept (k real measurements).
  By default (`agent_start="known"`) they start from what is known: the heuristic's
  schedule, the surrogate's best refinements of it and the agent's own best schedules, about
  half each (`Agent.proposals`);
- `agent_scratch_topk` (beside a "known" start): the agent's own k best distinct schedules by
  the surrogate alone, what it proposes from scratch;
- `random_k` and `random_8k`: random search over the action space with the same k, and with
  8k, real measurements (draws as collection makes them, half uniform, half biased toward
  deeper schedules; the k are the first k of the 8k);
- `surrogate_topk`: search guided by the surrogate without the agent: `guided_samples` random
  schedules ranked by the surrogate, its top k measured;
- `evolutionary` (with `evolutionary_budget` > 0): the surrogate-guided evolutionary search a
  user would pick instead of an agent (`mlirrl_jax.search`), with its own budget of real
  measurements, its surrogate fine-tuned between batches;
- `xla`: XLA:CPU through `jax.jit` on the same computation and thread count, output buffer
  donated and reused (`mlirrl_jax.measure.xla`);
- `numpy`: NumPy's matmul with BLAS on the same threads (matmuls only).

Every schedule is chosen first (JAX work), then every measurement runs in one worker, one at a
time, so no JAX work shares the cores with a timed kernel. Results are appended per (program,
thread count) to `validation.jsonl` as they come: a killed validation run again with the same
folder goes on where it stopped. The report is `validation.md` and `validation.json` beside
it, the plots `validation_speedups.png`, `validation_cdf.png`, `validation_predicted.png`,
and every measured method's best schedule is saved under `validation/schedules/`, replayable
with the `mlirrl-jax measure` command the report prints. Every file but the appended
`validation.jsonl` is written whole or not at all; a line of it cut short (a kill, a full
disk) is cut off before the next run appends to it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jax
import numpy as np

from mlirrl_jax.agent.agent import STARTS, Agent, _bucket
from mlirrl_jax.env.replay import replay
from mlirrl_jax.errors import Error
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import DEFAULT_MEM_LIMIT_MB, Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.programs.select import program_kind
from mlirrl_jax.runfolder import naming, write_atomic
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.util.progress import progress_bar
from mlirrl_jax.util.stats import geomean
from mlirrl_jax.validation_report import (
    LABELS,
    METHODS,
    SCHEDULED,
    TRIAL_METHODS,
    format_sample_efficiency,
    sample_efficiency,
    save_validation_plots,
    speedups,
)

log = logging.getLogger(__name__)

SEARCHES = ("heuristic", "random_8k", "evolutionary")  # the agent's rivals on this machine's code
MATMUL_KINDS = ("matmul", "batch_matmul")


class ValidationError(Error, ValueError):
    """Bad validation input (a setting, a program beyond the environment's limits)."""


@dataclass(frozen=True)
class ValidationConfig:
    threads: tuple[int, ...] = (1, 2)
    budget: int = 8  # k: the agent's and the guided search's measured schedules per program
    random_factor: int = 8  # the larger random search: random_factor * k measurements
    guided_samples: int = 256  # random schedules the surrogate ranks for `surrogate_topk`
    evolutionary_budget: int = 0  # real measurements of the evolutionary search (0: not run)
    # the agent's top-k: "known" (the heuristic's schedule, refinements of it and the agent's
    # own, with the agent's own alone measured beside it as `agent_scratch_topk`) or "scratch"
    agent_start: str = "known"
    xla: bool = True  # XLA:CPU (jax.jit of the program) measured too
    numpy: bool = True  # NumPy/BLAS measured too, where it has the op
    seed: int = 0
    timeout_s: float = 60.0
    mem_limit_mb: int = DEFAULT_MEM_LIMIT_MB
    store: str | None = None  # also put every kernel measurement in this store

    def __post_init__(self):
        if not self.threads or any(int(t) != t or t < 1 for t in self.threads):
            raise ValidationError(f"threads must be whole numbers >= 1, got {self.threads}")
        if len(set(self.threads)) != len(self.threads):
            raise ValidationError(f"threads repeat: {self.threads}")
        if self.budget < 1:
            raise ValidationError(f"budget must be at least 1, got {self.budget}")
        if self.random_factor < 1:
            raise ValidationError(f"random_factor must be at least 1, got {self.random_factor}")
        if self.guided_samples < self.budget:
            raise ValidationError(
                f"guided_samples ({self.guided_samples}) must be at least the budget "
                f"({self.budget})"
            )
        if self.timeout_s <= 0:
            raise ValidationError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.agent_start not in STARTS:
            raise ValidationError(
                f"agent_start {self.agent_start!r}: expected one of {', '.join(STARTS)}"
            )
        if self.evolutionary_budget < 0:
            raise ValidationError(
                f"evolutionary_budget must be at least 0, got {self.evolutionary_budget}"
            )


@dataclass
class Plan:
    """The schedules each method measures on one program (chosen before any measurement)."""

    program: Program
    greedy: tuple[Schedule, float]
    agent_topk: list[tuple[Schedule, float]]
    agent_scratch: list[tuple[Schedule, float]]  # the agent's own top-k (= agent_topk: scratch)
    random: list[tuple[Schedule, float]]  # in draw order: random_k is the first k
    guided: list[tuple[Schedule, float]]
    heuristic_predicted: float
    predicted: dict = field(default_factory=dict)  # schedule hash -> predicted speedup


def plan(
    agent: Agent, programs: list[Program], config: ValidationConfig, threads: int = 1
) -> list[Plan]:
    """Every method's schedules of every program for kernels on `threads`, chosen by the agent
    and the surrogate alone (the count is in the agent's observation and the surrogate's
    features)."""
    k, random_n = config.budget, config.budget * config.random_factor
    evaluator = agent.evaluator(programs, threads)
    greedy = agent.scored_schedules(programs, n=1, evaluator=evaluator, seed=config.seed)
    scratch = agent.scored_schedules(programs, n=k, evaluator=evaluator, seed=config.seed)
    topk = agent.proposals(
        programs, k, config.agent_start, config.seed, evaluator=evaluator, own=scratch
    )
    reward_params = evaluator.prepare(agent.surrogate.params)
    heuristic = np.exp(evaluator.heuristic(reward_params, threads))
    draws = _random_draws(agent, evaluator, reward_params, programs, config)
    plans = []
    for i, program in enumerate(programs):
        found = draws[i]
        distinct = list(found.items())  # draw order
        ranked = sorted(distinct, key=lambda item: -item[1][1])
        p = Plan(
            program=program,
            greedy=(greedy[i][0].schedule, greedy[i][0].predicted_speedup),
            agent_topk=[(s.schedule, s.predicted_speedup) for s in topk[i]],
            agent_scratch=[(s.schedule, s.predicted_speedup) for s in scratch[i]],
            random=[item[1] for item in distinct[:random_n]],
            guided=[item[1] for item in ranked[:k]],
            heuristic_predicted=float(heuristic[i]),
        )
        for schedule, predicted in [p.greedy, *p.agent_scratch, *p.agent_topk, *found.values()]:
            p.predicted[schedule.hash] = predicted
        plans.append(p)
    return plans


def _random_draws(agent, evaluator, reward_params, programs, config) -> list[dict]:
    """Per program, its distinct non-empty random schedules (hash -> (schedule, predicted
    speedup)) in draw order, half uniform and half deeper-biased episodes interleaved."""
    wanted = max(config.budget * config.random_factor, config.guided_samples)
    found: list[dict] = [{} for _ in programs]
    rows = np.arange(len(programs))
    for attempt in range(4):  # repeats: draw more until each program has `wanted` or gives up
        short = [i for i in rows if len(found[i]) < wanted]
        if not short:
            break
        per = wanted * (1 + attempt)
        chosen = np.repeat(np.asarray(short), per)
        padded = np.resize(chosen, _bucket(len(chosen))).astype(np.int32)
        runs = []
        for j, weight in enumerate((1.0, 0.25)):
            key = jax.random.PRNGKey(config.seed * 7919 + attempt * 31 + j)
            runs.append(evaluator.random_episodes(reward_params, padded, key, weight))
        actions = [np.asarray(r.actions) for r in runs]
        steps = [np.asarray(r.steps) for r in runs]
        speedups = [np.exp(np.asarray(r.log_speedup)) for r in runs]
        for e in range(len(chosen)):  # interleaved: uniform, deep, uniform, ...
            for j in range(2):
                row = int(padded[e])
                if len(found[row]) >= wanted:
                    continue
                schedule, _ = replay(programs[row], actions[j][e, : steps[j][e]])
                if schedule.ops:
                    found[row].setdefault(schedule.hash, (schedule, float(speedups[j][e])))
    return found


def _best(measurements: list[Measurement]) -> Measurement | None:
    ok = [m for m in measurements if m.ok and m.verified and m.median_s]
    return min(ok, key=lambda m: m.median_s) if ok else None


def _measure_plan(
    p: Plan,
    threads: int,
    base: Measurement,
    runner: Runner,
    config: ValidationConfig,
    store,
    surrogate=None,
) -> dict:
    """Every method's measurements of one program at one thread count: each distinct
    schedule measured once, each method credited with what it would have spent. The
    evolutionary search (`surrogate`: the cost model it starts from) runs last, so that it
    reuses what the other methods measured."""
    k = config.budget
    method = TimingMethod(seed=config.seed)
    heuristic = heuristic_schedule(p.program, threads)
    schedules = {
        "heuristic": [heuristic],
        "agent_greedy": [p.greedy[0]],
        "agent_topk": [s for s, _ in p.agent_topk],
        "random_k": [s for s, _ in p.random[:k]],
        "random_8k": [s for s, _ in p.random],
        "surrogate_topk": [s for s, _ in p.guided],
    }
    if config.agent_start != "scratch":
        schedules["agent_scratch_topk"] = [s for s, _ in p.agent_scratch]
    spent = {
        "heuristic": 0,
        "agent_greedy": 0,
        "agent_topk": len(schedules["agent_topk"]),
        "random_k": len(schedules["random_k"]),
        "random_8k": len(schedules["random_8k"]),
        "surrogate_topk": len(schedules["surrogate_topk"]),
        "agent_scratch_topk": len(p.agent_scratch),
    }
    measured: dict[str, Measurement] = {}

    def measure(s: Schedule) -> Measurement:
        if s.hash not in measured:
            measured[s.hash] = runner.measure(
                p.program, s, threads=threads, method=method, timeout_s=config.timeout_s
            )
        return measured[s.hash]

    for name in schedules:
        for s in schedules[name]:
            measure(s)
    evolved = None
    if config.evolutionary_budget and surrogate is not None:
        from mlirrl_jax.search import EvolutionarySearch, EvolutionConfig

        search = EvolutionarySearch(
            p.program,
            surrogate,
            threads,
            EvolutionConfig(budget=config.evolutionary_budget, seed=config.seed),
        )
        evolved = search.run(measure, baseline=base if base.ok and base.verified else None)
        schedules["evolutionary"] = [t.schedule for t in evolved.trials]
        spent["evolutionary"] = len(evolved.trials)
    if store is not None:
        store.put(list(measured.values()))
    row = {
        "program": p.program.name,
        "kind": program_kind(p.program),
        "threads": threads,
        "flops": p.program.flops,
        "kernel_measurements": len(measured) + (1 if threads == config.threads[0] else 0),
        "failed": sorted({m.status for m in measured.values() if not m.ok}),
        # candidate schedules that timed out, crashed or computed a wrong output: recorded
        # results, by reason, shown in the report's table
        "failed_counts": _counts(m.status for m in measured.values() if not m.ok),
        "unverified": sum(1 for m in measured.values() if m.ok and not m.verified),
        "methods": {"unscheduled": _entry(base, 0, None)},
    }
    for name in schedules:
        best = _best([measured[s.hash] for s in schedules[name]])
        predicted = (
            p.heuristic_predicted
            if name == "heuristic"
            else (p.predicted.get(best.schedule_hash) if best else None)
        )
        if name == "evolutionary" and evolved is not None and best is not None:
            # what the search's surrogate predicted when it chose the schedule
            predicted = next(
                t.predicted_speedup for t in evolved.trials if t.schedule.hash == best.schedule_hash
            )
        row["methods"][name] = _entry(best, spent[name], predicted)
        if name in TRIAL_METHODS:  # in the order measured: the sample-efficiency curve
            row["methods"][name]["trials_ms"] = [
                _verified_ms(measured[s.hash]) for s in schedules[name]
            ]
    if config.xla:
        from mlirrl_jax.measure.xla import measure_xla

        row["methods"]["xla"] = _external(
            measure_xla(p.program, threads, method, timeout_s=config.timeout_s)
        )
    if config.numpy and row["kind"] in MATMUL_KINDS:
        from mlirrl_jax.measure.xla import measure_numpy

        row["methods"]["numpy"] = _external(
            measure_numpy(p.program, threads, method, timeout_s=config.timeout_s)
        )
    return row


def _verified_ms(m: Measurement) -> float | None:
    return m.median_s * 1e3 if m.ok and m.verified and m.median_s else None


def _entry(m: Measurement | None, spent: int, predicted: float | None) -> dict:
    if m is None:
        return {"ms": None, "spent": spent, "status": "no verified schedule"}
    return {
        "ms": _verified_ms(m),
        "spent": spent,
        "status": m.status if m.verified or not m.ok else "unverified",
        "predicted": predicted,
        "schedule": m.schedule,
    }


def _external(m) -> dict:
    if m is None:
        return {"ms": None, "spent": 0, "status": "not available for this program"}
    good = m.status == "ok" and m.verified and m.median_s
    return {
        "ms": m.median_s * 1e3 if good else None,
        "spent": 0,
        "status": m.status if m.verified or m.status != "ok" else "unverified",
    }


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
    ):
        """`agent`: one agent for every thread count, or one per thread count (for example
        each adapted to this machine at its thread count); `agent_run` names them alike."""
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
        self.out = Path(out)
        self.machine = machine_fingerprint()["machine_id"]
        self.rows_path = self.out / "validation.jsonl"
        self.out.mkdir(parents=True, exist_ok=True)
        settings = self.out / "validation_config.json"
        recorded = {
            "config": {**asdict(self.config), "threads": list(self.config.threads)},
            "machine_id": self.machine,
            "programs": names,
            "agent": _per_threads(self.agent_runs, threads),
        }
        if settings.is_file():
            before = json.loads(settings.read_text())
            if before != recorded:
                raise ValidationError(
                    f"{self.out} holds a validation with other settings ({settings}): use "
                    "another folder, or remove it to start again"
                )
        else:
            write_atomic(settings, json.dumps(recorded, indent=1))

    def done(self) -> list[dict]:
        if not self.rows_path.is_file():
            return []
        rows = []
        for line in self.rows_path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
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

    def run(self) -> list[dict]:
        self._cut_partial_line()
        rows = self.done()
        have = {(r["program"], r["threads"]) for r in rows}
        todo = [
            p for p in self.programs if any((p.name, t) not in have for t in self.config.threads)
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
            if (p.name, t) not in have
        ]
        bar = progress_bar(total=len(jobs), desc="validation", unit="run")
        try:
            with (
                Runner(self.config.timeout_s, self.config.mem_limit_mb) as runner,
                open(self.rows_path, "ab", buffering=0) as rows_file,  # no buffer to flush at close
            ):
                bases: dict[str, Measurement] = {}
                for p, threads in jobs:
                    name = p.program.name
                    if name not in bases:
                        bases[name] = runner.measure(
                            p.program, None, threads=1, method=TimingMethod(seed=self.config.seed)
                        )
                        if store is not None:
                            store.put([bases[name]])
                    row = _measure_plan(
                        p, threads, bases[name], runner, self.config, store, surrogates.get(threads)
                    )
                    row["machine_id"] = self.machine
                    line = (json.dumps(row) + "\n").encode()
                    with naming(self.rows_path):
                        while line:  # a write cut short by a filling disk: the rest, or ENOSPC
                            line = line[rows_file.write(line) :]
                        os.fsync(rows_file.fileno())
                    rows.append(row)
                    bar.update(1)
                    bar.set_postfix_str(f"{name.split('/')[-1]} t{threads}")
        finally:
            bar.close()
            if store is not None:
                store.close()
        return rows

    def _search_surrogates(self) -> dict:
        """Per thread count, the cost model the evolutionary search starts from: the one its
        agent trains against (none for the analytic stand-in)."""
        if not self.config.evolutionary_budget:
            return {}
        from cost_model.api import CostModel

        loaded: dict[str, object] = {}
        out = {}
        for t in self.config.threads:
            path = self.agents[t].surrogate.path
            if path and path != "analytic":
                if path not in loaded:
                    loaded[path] = CostModel.load(path)
                out[t] = loaded[path]
        return out

    def report(self, rows: list[dict] | None = None, peak_gflops: float | None = None) -> dict:
        rows = self.done() if rows is None else rows
        summary = summarize(rows, self.config, peak_gflops)
        summary["machine_id"] = self.machine
        threads = self.config.threads
        summary["agent"] = _per_threads(self.agent_runs, threads)
        summary["surrogate_machine"] = _per_threads(
            {t: a.surrogate.machine_id for t, a in self.agents.items()}, threads
        )
        summary["surrogate_threads"] = {str(t): self.agents[t].surrogate.threads for t in threads}
        paths = save_schedules(rows, self.out / "validation" / "schedules")
        text = format_validation(rows, summary, self.config, paths)
        write_atomic(self.out / "validation.md", text + "\n")
        write_atomic(
            self.out / "validation.json", json.dumps({"summary": summary, "rows": rows}, indent=1)
        )
        save_validation_plots(rows, self.out)
        return summary


def _per_threads(values: dict, threads) -> object:
    """One value if every thread count has the same, else {"threads": value}."""
    distinct = {json.dumps(values[t], default=str) for t in threads}
    return values[threads[0]] if len(distinct) == 1 else {str(t): values[t] for t in threads}


def summarize(rows: list[dict], config: ValidationConfig, peak_gflops: float | None) -> dict:
    """Per thread count: each method's geomean speedup over unscheduled (on the programs
    where every compared method verified), measurement counts, the agent against random
    search and against XLA per op kind, and GFLOP/s against the measured peak."""
    out: dict = {"threads": {}, "peak_gflops_one_core": peak_gflops}
    for threads in config.threads:
        group = [r for r in rows if r["threads"] == threads]
        if not group:
            continue
        per = [speedups(r) for r in group]
        by_method = {}
        for name in METHODS:
            values = [s[name] for s in per if s.get(name)]
            spent = [r["methods"][name]["spent"] for r in group if name in r["methods"]]
            by_method[name] = {
                "geomean_speedup": geomean(values) if values else None,
                "programs": len(values),
                "measurements_per_program": float(np.mean(spent)) if spent else None,
                **_predicted_against_real(group, per, name),
            }
        common = [s for s in per if s.get("agent_topk") and s.get("random_8k")]
        greedy_common = [s for s in per if s.get("agent_greedy") and s.get("random_8k")]
        entry = {
            "programs": len(group),
            "methods": by_method,
            "agent_topk_over_random_8k": _ratio(common, "agent_topk", "random_8k"),
            "agent_greedy_over_random_8k": _ratio(greedy_common, "agent_greedy", "random_8k"),
            "agent_topk_over_heuristic": _ratio(per, "agent_topk", "heuristic"),
            "agent_topk_over_evolutionary": _ratio(per, "agent_topk", "evolutionary"),
            # per program, the best of the heuristic and the searches the run measured
            "agent_topk_over_best_search": _ratio(
                _with_best_search(per), "agent_topk", "best_search"
            ),
            "agent_greedy_over_heuristic": _ratio(per, "agent_greedy", "heuristic"),
            # the heuristic's schedule and its refinements in the pool, against without them
            "agent_topk_over_agent_scratch_topk": _ratio(per, "agent_topk", "agent_scratch_topk"),
            "agent_scratch_topk_over_heuristic": _ratio(per, "agent_scratch_topk", "heuristic"),
            "by_kind": {},
        }
        kinds = defaultdict(list)
        for r, s in zip(group, per, strict=True):
            kinds[r["kind"]].append((r, s))
        for kind, members in sorted(kinds.items()):
            ss = [s for _, s in members]
            best_any = [
                {**s, "best_any": max(s[n] for n in SCHEDULED if s.get(n))}
                for s in ss
                if any(s.get(n) for n in SCHEDULED)
            ]
            k_entry = {
                "programs": len(members),
                "agent_topk_over_heuristic": _ratio(ss, "agent_topk", "heuristic"),
                "agent_greedy_over_heuristic": _ratio(ss, "agent_greedy", "heuristic"),
                "agent_topk_over_xla": _ratio(ss, "agent_topk", "xla"),
                "best_any_over_xla": _ratio(best_any, "best_any", "xla"),
                "agent_topk_over_random_8k": _ratio(ss, "agent_topk", "random_8k"),
                "agent_scratch_topk_over_heuristic": _ratio(
                    ss, "agent_scratch_topk", "heuristic"
                ),
                **{
                    n: geomean([s[n] for s in ss if s.get(n)])
                    if any(s.get(n) for s in ss)
                    else None
                    for n in METHODS
                },
            }
            if peak_gflops:
                fractions = []
                for r, s in members:
                    best = max((s[n] for n in SCHEDULED if s.get(n)), default=None)
                    if best:
                        ms = r["methods"]["unscheduled"]["ms"] / best
                        fractions.append(r["flops"] / (ms * 1e-3) * 1e-9 / (peak_gflops * threads))
                k_entry["best_fraction_of_peak"] = (
                    float(np.median(fractions)) if fractions else None
                )
            entry["by_kind"][kind] = k_entry
        out["threads"][str(threads)] = entry
    out["sample_efficiency"] = sample_efficiency(rows, config.threads)
    return out


def _with_best_search(per: list[dict]) -> list[dict]:
    """Each program's speedups plus `best_search`: the best of the heuristic and the
    searches (`SEARCHES`) measured on it."""
    return [
        {**s, "best_search": max((s[n] for n in SEARCHES if s.get(n)), default=None)} for s in per
    ]


def _predicted_against_real(group: list[dict], per: list[dict], name: str) -> dict:
    """The surrogate's predicted speedups of a method's best schedules (one thread) against
    their real ones: geomeans of both and the MAPE, on the programs that have both."""
    pairs = [
        (r["methods"][name]["predicted"], s[name])
        for r, s in zip(group, per, strict=True)
        if r["methods"].get(name, {}).get("predicted") and s.get(name)
    ]
    if not pairs:
        return {}
    predicted, real = (np.array(v, np.float64) for v in zip(*pairs, strict=True))
    return {
        "predicted_geomean": geomean(predicted),
        "real_geomean_predicted_programs": geomean(real),
        "prediction_mape": float(np.mean(np.abs(predicted - real) / real)),
    }


def _ratio(per: list[dict], a: str, b: str) -> float | None:
    pairs = [(s[a], s[b]) for s in per if s.get(a) and s.get(b)]
    if not pairs:
        return None
    return geomean([x for x, _ in pairs]) / geomean([y for _, y in pairs])


def _slug(name: str) -> str:
    return name.split("://")[-1].replace("/", "_")


def save_schedules(rows: list[dict], folder: Path) -> dict:
    """Each row's measured methods' best schedules as JSON files; returns
    {(program, threads, method): path}."""
    paths = {}
    for r in rows:
        for name, m in r["methods"].items():
            if name == "unscheduled" or m.get("schedule") is None or m.get("ms") is None:
                continue
            path = folder / _slug(r["program"]) / f"{name}-t{r['threads']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(m["schedule"], indent=1))
            paths[(r["program"], r["threads"], name)] = path
    return paths


def _f(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _agents_line(summary: dict) -> str:
    """Which agent (run, its surrogate's machine and threads) each thread count used."""
    agent, machine = summary.get("agent"), summary.get("surrogate_machine")
    threads = summary.get("surrogate_threads") or {}
    if not isinstance(agent, dict) and not isinstance(machine, dict):
        adapted = sorted(set(threads.values())) or [1]
        return (
            f"`{agent}` (surrogate of machine {machine}, fitted at "
            f"{'/'.join(map(str, adapted))} thread(s)) at every thread count"
        )
    parts = []
    for t in threads or {}:
        run = agent.get(t) if isinstance(agent, dict) else agent
        m = machine.get(t) if isinstance(machine, dict) else machine
        parts.append(f"{t} thread(s): `{run}` (surrogate of machine {m} at {threads[t]})")
    return "; ".join(parts)


def _counts(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items()))


def format_validation(rows: list[dict], summary: dict, config: ValidationConfig, paths) -> str:
    """Markdown: per thread count, each program's speedups per method, then the geomeans,
    the agent against the baselines, per op kind against XLA, and replay commands."""
    k = config.budget
    lines = [
        f"# Validation on machine {summary.get('machine_id')}",
        "",
        f"Agent: {_agents_line(summary)}. "
        f"k = {k}: the agent's top-k, random search with k and {k * config.random_factor} real "
        f"measurements, the surrogate's top-k of {config.guided_samples} random schedules"
        + (
            f", the surrogate-guided evolutionary search with {config.evolutionary_budget}"
            if config.evolutionary_budget
            else ""
        )
        + ". Speedups "
        "are over the unscheduled program measured in the same run (one thread); every kernel "
        "output verified against the reference; '-' where a method had no verified result. A "
        "candidate that timed out, crashed or computed a wrong output is a recorded result, "
        "counted in the last column.",
    ]
    if summary.get("peak_gflops_one_core"):
        lines.append(
            f"Measured FMA peak: {summary['peak_gflops_one_core']:.1f} GFLOP/s per core "
            "(`mlirrl_jax/measure/peak.py`)."
        )
    for threads, entry in summary["threads"].items():
        group = [r for r in rows if str(r["threads"]) == threads]
        names = [n for n in METHODS if n != "unscheduled" and any(n in r["methods"] for r in group)]
        lines += [
            "",
            f"## {threads} thread(s): {entry['programs']} programs",
            "",
            "| program | kind | unscheduled ms | "
            + " | ".join(LABELS[n] for n in names)
            + " | candidates failed |",
            "|---|---|---|" + "---|" * len(names) + "---|",
        ]
        for r in group:
            s = speedups(r)
            failed = r.get("failed_counts") or {f: "" for f in r.get("failed", [])}
            lines.append(
                f"| {r['program'].split('/')[-1]} | {r['kind']} | "
                f"{_f(r['methods']['unscheduled']['ms'], '.3f')} | "
                + " | ".join(_f(s.get(n), ".2f") + ("x" if s.get(n) else "") for n in names)
                + f" | {', '.join(f'{k} {v}'.strip() for k, v in failed.items()) or '-'} |"
            )
        m = entry["methods"]
        lines += [
            "",
            "| method | geomean speedup | programs | real measurements per program |",
            "|---|---|---|---|",
            *(
                f"| {LABELS[n]} | {_f(m[n]['geomean_speedup'], '.2f')}x | {m[n]['programs']} | "
                f"{_f(m[n]['measurements_per_program'], '.0f')} |"
                for n in METHODS
                if m[n]["programs"]
            ),
            "",
            f"Agent top-{k} / random search with {k * config.random_factor}: "
            f"{_f(entry['agent_topk_over_random_8k'], '.3f')}; agent greedy (0 measurements) / "
            f"random {k * config.random_factor}: {_f(entry['agent_greedy_over_random_8k'], '.3f')}; "
            f"agent top-{k} / heuristic: {_f(entry['agent_topk_over_heuristic'], '.3f')}; "
            f"agent greedy / heuristic: {_f(entry.get('agent_greedy_over_heuristic'), '.3f')}"
            + (
                f"; agent top-{k} / evolutionary search with {config.evolutionary_budget}: "
                f"{_f(entry.get('agent_topk_over_evolutionary'), '.3f')}"
                if config.evolutionary_budget
                else ""
            )
            + f"; agent top-{k} / the best of the heuristic and the searches: "
            f"{_f(entry.get('agent_topk_over_best_search'), '.3f')}"
            + (
                f"; agent top-{k} / its top-{k} from scratch (without the heuristic's schedule "
                f"and its refinements): {_f(entry.get('agent_topk_over_agent_scratch_topk'), '.3f')}"
                f"; from scratch / heuristic: "
                f"{_f(entry.get('agent_scratch_topk_over_heuristic'), '.3f')}"
                if entry.get("agent_topk_over_agent_scratch_topk")
                else ""
            )
            + " (geomeans over the programs where both verified).",
            "",
            f"Surrogate's predicted speedup (its rows' threads: "
            f"{summary.get('surrogate_threads', {}).get(threads, 1)}) against real, best schedules: "
            + "; ".join(
                f"{LABELS[n]} predicted {m[n]['predicted_geomean']:.2f}x, real "
                f"{m[n]['real_geomean_predicted_programs']:.2f}x, MAPE {m[n]['prediction_mape']:.0%}"
                for n in SCHEDULED
                if m[n].get("predicted_geomean")
            )
            + ".",
            "",
            "| op kind | programs | agent top-k / heuristic | from scratch / heuristic | agent greedy / heuristic | agent top-k / XLA | best any method / XLA | agent top-k / random 8k | best fraction of peak |",
            "|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {kind} | {e['programs']} | {_f(e.get('agent_topk_over_heuristic'), '.2f')} | "
                f"{_f(e.get('agent_scratch_topk_over_heuristic'), '.2f')} | "
                f"{_f(e.get('agent_greedy_over_heuristic'), '.2f')} | "
                f"{_f(e['agent_topk_over_xla'], '.2f')} | "
                f"{_f(e['best_any_over_xla'], '.2f')} | {_f(e['agent_topk_over_random_8k'], '.2f')} | "
                f"{_f(e.get('best_fraction_of_peak'), '.0%')} |"
                for kind, e in entry["by_kind"].items()
            ),
        ]
    lines += format_sample_efficiency(summary.get("sample_efficiency") or {}, config.budget)
    if paths:
        lines += [
            "",
            "## Replay",
            "",
            "Every measured method's best schedule is saved; the agent's top-k, for example:",
            "",
        ]
        shown = sorted((key, path) for key, path in paths.items() if key[2] == "agent_topk")
        for (program, threads, _), path in shown[:12]:
            lines.append(f"    mlirrl-jax measure {program} --schedule {path} --threads {threads}")
        lines.append("")
        lines.append(
            f"({len(paths)} schedules under `{Path(next(iter(paths.values()))).parents[1]}`.)"
        )
    return "\n".join(lines)
