"""The main job (`mlirrl-jax demo`): adapt the shipped surrogate and agent to this machine
with a short re-grounding while training on from the shipped agent, adopt the adapted agent
as this machine's default, then validate it on held-out programs against unscheduled code,
the heuristic, random search, the surrogate's own pick and XLA.

It plans to a time budget (`DemoConfig.minutes`) from the rates it measures as it goes, and
cuts in this order (each cut is logged, printed with the report and kept in `budget.json`):
1. re-grounding, which ends by `ADAPT_SHARE` of the budget: a round's measuring stops in time
   for its update (the least needed measurements go first), and a round that would not end
   by then is not started (`regrounding.measure.RoundMeasurer`);
2. validation, which ends with the budget: a program is measured only if it is expected to
   end in time, at the mean time of those before it (the first always is).
Start-up, the first round's choosing and updates, the training after the rounds and the
validation's choosing are not cut: their time is what the rest plans around."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from mlirrl_jax.budget import TimeBudget
from mlirrl_jax.measure.runner import DEFAULT_MEM_LIMIT_MB, DEFAULT_TIMEOUT_S
from mlirrl_jax.programs.ir import Program, load_program
from mlirrl_jax.records import ValidationRow
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.shipped import default_store
from mlirrl_jax.util.configs import option

log = logging.getLogger(__name__)

VALIDATION_PROGRAMS = (  # held-out dl-v0 test programs of several kinds, small enough for minutes
    "suite://dl-v0/matmul_m32_n1000_k512",
    "suite://dl-v0/conv2d_nhwc_n1_h56_w56_c64_f128_k1_s2_d1",
    "suite://dl-v0/conv_bias_relu_n1_h28_w28_c32_f192_k1_s1_d1",
    "suite://dl-v0/depthwise_n1_h30_w30_c192_k3_s1_d1",
    "suite://dl-v0/pool_max_n1_h56_w56_c256_k2_s2_d1",
    "suite://dl-v0/relu_1x56x56x256",
)
REGROUNDING = {  # a short re-grounding: a few hundred measurements of this machine
    "rounds": 2,
    "iterations_per_round": 30,
    "round_programs": 12,
    "top_k": 6,
    "real_budget": 400,
    "track_programs": 6,
    "heldout_programs": 6,
    "heldout_every": 1,
    "calibration_programs": 16,
    "validation_programs": 8,
    "validation_k": 6,
}


ADAPT_SHARE = 0.6  # of the time budget: re-grounding ends by then, validation gets the rest
REPORT_S = 15.0  # kept at the end of the budget for the report and its plots


@dataclass(frozen=True)
class DemoConfig:
    """The main job's settings.

    Its fields are declared alike, each documented (`util.configs.option`): the flags and
    their help come from them (`cli.options`).
    """

    store: str = option(factory=default_store, doc="This machine's measurement store.")
    threads: tuple[int, ...] = option((1,), doc="Thread counts of the validation.")
    budget: int = option(
        4, doc="k of the validation: real measurements of the agent's top-k per program."
    )
    rounds: int = option(REGROUNDING["rounds"], doc="Re-grounding rounds.")
    real_budget: int = option(
        REGROUNDING["real_budget"], doc="Real measurements of the re-grounding, a hard cap."
    )
    iterations: int | None = option(None, doc="PPO iterations (default: 30 per round + 30).")
    minutes: float = option(
        8.0,
        doc=(
            "The whole job's time budget in minutes (the install aside): re-grounding ends by"
            " 60% of it, validation cuts programs to fit the rest; the report says what was "
            "cut."
        ),
    )
    seed: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    mem_limit_mb: int = DEFAULT_MEM_LIMIT_MB


def demo_programs(uris=None) -> list[Program]:
    """The validation programs (default: `VALIDATION_PROGRAMS`), read before minutes of
    adapting so that a bad one fails first."""
    return [load_program(p) for p in (uris or VALIDATION_PROGRAMS)]


def run_demo(out_dir: Path, programs: list[Program], config: DemoConfig) -> tuple[list, dict]:
    """Adapt into `out_dir/agent`, adopt it, validate into `out_dir`; the validation's rows
    and summary (`validation.Validation.report`)."""
    from mlirrl_jax.host_devices import use_compilation_cache, use_host_devices

    budget = TimeBudget(60.0 * config.minutes)
    run = out_dir / "agent"
    use_host_devices()  # before any JAX work: the agent's environments use every core
    use_compilation_cache()
    from mlirrl_jax.adopted import adopt_agent_run
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.agent.checkpoint import load_meta
    from mlirrl_jax.agent.config import AgentConfig
    from mlirrl_jax.agent.run import run_training
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.measure.profile import this_machine_profile
    from mlirrl_jax.regrounding import RegroundConfig, rounds
    from mlirrl_jax.shipped import SHIPPED_AGENT
    from mlirrl_jax.validation import Validation, ValidationConfig

    here = machine_fingerprint()["machine_id"]
    shipped = (SHIPPED_AGENT / "checkpoints").is_dir()
    agent = AgentConfig.from_json(load_meta(SHIPPED_AGENT)["config"]) if shipped else AgentConfig()
    regrounding = RegroundConfig.from_json(
        {
            **REGROUNDING,
            "store": config.store,
            "rounds": config.rounds,
            "real_budget": config.real_budget,
        }
    )
    iterations = config.iterations or regrounding.rounds * regrounding.iterations_per_round + 30
    log.info(
        "machine %s: adapting the %s and the shipped surrogate to it (%d re-grounding rounds, at "
        "most %d real measurements into %s, ending by %.1f min of the %.1f min budget; %d PPO "
        "iterations); run in %s",
        here,
        "shipped agent" if shipped else "a new agent",
        regrounding.rounds,
        regrounding.real_budget,
        regrounding.store,
        ADAPT_SHARE * config.minutes,
        config.minutes,
        iterations,
        run,
    )
    # no evaluation on the test split while training: the validation is the demo's, and the
    # evaluation's programs and compiles would cost a minute of its budget
    agent = replace(agent, eval_every=0)
    if shipped:  # go on as the shipped run ended: its final step size and entropy bonus
        agent = replace(
            agent, learning_rate=agent.final_learning_rate, entropy_coef=agent.final_entropy_coef
        )
    run_training(
        run,
        replace(agent, minutes=0.0, iterations=iterations),
        regrounding=rounds(regrounding, budget, budget.at(ADAPT_SHARE)),
        init_agent=SHIPPED_AGENT if shipped else None,
    )
    budget.mark("adapted")
    adopt_agent_run(run, regrounding.threads)
    rounds_md = run / "regrounding" / "rounds.md"
    if rounds_md.is_file():
        log.info("%s", rounds_md.read_text())
    log.info(
        "adapted in %.1f min; `mlirrl-jax optimize` now uses this agent on this machine. "
        "Validating it on %d held-out programs in the %.1f min left:",
        budget.elapsed() / 60,
        len(programs),
        budget.left() / 60,
    )
    validation = Validation(
        Agent.load(run),
        programs,
        out_dir,
        ValidationConfig(
            threads=config.threads,
            budget=config.budget,
            guided_samples=max(64, config.budget),
            timeout_s=config.timeout_s,
            mem_limit_mb=config.mem_limit_mb,
            seed=config.seed,
            store=config.store,
        ),
        agent_run=str(run),
        deadline=budget.deadline - REPORT_S,
        budget=budget,
    )
    rows = validation.run()
    budget.mark("validated")
    summary = validation.report(rows, this_machine_profile().fma_peak_gflops)
    budget.mark("reported")
    budget.save(out_dir / "budget.json")
    text = budget.summary()
    report = out_dir / "validation.md"
    write_atomic(report, report.read_text() + "\n## Time budget\n\n" + text + "\n")
    log.info("whole pipeline in %.1f min\n%s", budget.elapsed() / 60, text)
    return rows, summary


def methods_without_result(rows: list[ValidationRow]) -> list[str]:
    """The (program, method) pairs of a validation with no verified result, each logged as an
    error. A candidate schedule that crashed, timed out or computed a wrong output is a
    recorded result, not a failure of the run: only a method left with nothing verified is."""
    for r in rows:
        if r.failed or r.unverified:
            what = [*r.failed, *(["unverified"] if r.unverified else [])]
            log.warning(
                "%s at %s thread(s): candidate schedules ended %s (recorded in "
                "validation.jsonl: results, not failures)",
                r.program,
                r.threads,
                ", ".join(what),
            )
    missing = [
        f"{r.program} ({method}: {entry.status})"
        for r in rows
        for method, entry in r.methods.items()
        if entry.ms is None and entry.status != "not available for this program"
    ]
    for line in missing:
        log.error("no verified result: %s", line)
    return missing
