"""The `train` job: PPO on the surrogate, with checkpoints, metrics, a learning curve and a
report of the agent against the heuristic and random search on the test programs.

A run lives in one folder: `config.json` (the `AgentConfig`), `checkpoints/` (orbax, see
`checkpoint.py`), `metrics.jsonl` (one line per iteration; evaluations every
`config.eval_every` iterations), `baselines.json` (the heuristic's and random search's
predicted speedups per test program), `learning_curve.png` and `summary.json`. `resume=True`
continues a killed (or interrupted) run from its newest checkpoint: with an iteration budget,
exactly as it would have gone on.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import jax
import numpy as np

from mlirrl_jax.agent import checkpoint
from mlirrl_jax.agent.config import AgentConfig
from mlirrl_jax.agent.evaluate import Evaluator, geomean_speedup
from mlirrl_jax.agent.hooks import TrainingHook, TrainingHooks
from mlirrl_jax.agent.networks import abstract
from mlirrl_jax.agent.report import format_summary, save_learning_curve
from mlirrl_jax.agent.surrogate import Surrogate, check_this_machine, load_surrogate
from mlirrl_jax.agent.train import TrainingState, budget_share, make_train, optimizer
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.errors import Error
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import Program, parse_program
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.splits import SPLITS_VERSION, TEST, TRAIN, entries, suite_of
from mlirrl_jax.util.progress import progress_bar

log = logging.getLogger(__name__)


class RunError(Error, ValueError):
    """A run folder that cannot be started or resumed as asked."""


# the fields a resumed run may change: its budget
BUDGET_FIELDS = ("minutes", "iterations")


def load_programs(split: str, suite_names) -> list[Program]:
    """The programs of `split` in the given built-in suites, parsed."""
    chosen = entries(split, tuple(suite_names))
    bar = progress_bar(chosen, desc=f"{split} programs", unit="program", leave=False)
    return [parse_program(e.text, e.uri) for e in bar]


def training_suites(config: AgentConfig, surrogate: Surrogate) -> tuple[str, ...]:
    """The built-in suites whose train split the run trains on: the config's, else those the
    surrogate was fitted on (its programs of no suite, a user's own, are not among them)."""
    known = set(suites.list_suites())
    if config.suites:
        unknown = sorted(set(config.suites) - known)
        if unknown:
            raise RunError(
                f"unknown suites {unknown} in the config; the suites are {sorted(known)}"
            )
        return tuple(config.suites)
    chosen = tuple(s for s in surrogate.suites if s in known)
    if not chosen:
        raise RunError(f"the surrogate was fitted on no built-in suite ({list(surrogate.suites)})")
    return chosen


def training_threads(config: AgentConfig, surrogate: Surrogate) -> tuple[int, ...]:
    """The thread counts the run trains at: the config's, else every count the surrogate
    was fitted on."""
    return tuple(config.threads) or surrogate.thread_counts


def encode_at_threads(programs: list[Program], threads: tuple[int, ...]):
    """(the programs once per thread count, their table): each program at every count, the
    count in the table (and so in the observation and the surrogate's features)."""
    rows = [p for _ in threads for p in programs]
    counts = [t for t in threads for _ in programs]
    return rows, encode_programs(rows, threads=counts)


def _start(out: Path, config: AgentConfig | None, resume: bool, budget: dict) -> AgentConfig:
    """The run's config: a new one (written to config.json), or on resume the run's own, its
    budget replaced by `budget` if given."""
    saved_path = out / "config.json"
    step = checkpoint.latest_step(out)
    if not resume:
        if step is not None:
            raise RunError(
                f"{out} already holds a run ({step} iterations): add --resume, or choose "
                "another --out"
            )
        config = AgentConfig.from_json({**(config or AgentConfig()).to_json(), **budget})
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(saved_path, config.dumps())  # a start that never checkpointed starts anew
        return config
    if step is None:
        raise RunError(f"{out}: nothing to resume (no checkpoint in {out / 'checkpoints'})")
    saved = AgentConfig.from_json(checkpoint.load_meta(out)["config"])
    if config is not None and config != saved:
        raise RunError(f"{out}: --config differs from the run's own config; resume without it")
    unknown = sorted(set(budget) - set(BUDGET_FIELDS))
    if unknown:
        raise RunError(
            f"a resumed run keeps its config but for its budget; cannot change {unknown}"
        )
    resumed = AgentConfig.from_json({**saved.to_json(), **budget})
    write_atomic(saved_path, resumed.dumps())
    return resumed


def _read_metrics(path: Path, up_to: int) -> list[dict]:
    """The metric lines of iterations up to `up_to` (a resumed run rewrites the rest; a line
    a kill cut short is dropped)."""
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [m for m in lines if m.get("iteration", up_to + 1) <= up_to]


def _baselines(out: Path, evaluator: Evaluator, reward_params, surrogate, config) -> dict:
    """Per test program: the heuristic's and the best random schedules' predicted
    log-speedups (random: uniform over the masked choices, as the fuzzers draw them), computed
    once per surrogate and kept in `baselines.json`."""
    path = out / "baselines.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("surrogate") == surrogate.identity:
            return saved
    heuristic = evaluator.heuristic(reward_params)  # at each row's thread count
    random_best = evaluator.random_best(
        reward_params, config.eval_random_schedules, jax.random.PRNGKey(config.seed)
    )
    saved = {
        "surrogate": surrogate.identity,
        "programs": [p.name for p in evaluator.programs],
        "heuristic": heuristic.tolist(),
        config.random_best_key: random_best.tolist(),
    }
    write_atomic(path, json.dumps(saved, indent=1))
    return saved


def evaluation_row(
    names: list[str], agent: np.ndarray, baselines: dict, config, threads=None
) -> dict:
    """Geomean predicted speedups of the agent, the heuristic and random search: over all the
    test rows, per suite and (where `threads`, each row's count, holds several) per thread
    count."""
    random_key = config.random_best_key
    heuristic, random_best = np.asarray(baselines["heuristic"]), np.asarray(baselines[random_key])
    groups = {"all": np.ones(len(names), bool)}
    for suite in sorted({suite_of(n) for n in names}):
        groups[suite] = np.array([suite_of(n) == suite for n in names])
    counts = np.asarray(threads if threads is not None else np.ones(len(names)), np.int64)
    if len(set(counts.tolist())) > 1:
        for t in sorted(set(counts.tolist())):
            groups[f"{t} thread(s)"] = counts == t
    return {
        group: {
            "programs": int(rows.sum()),
            "agent": geomean_speedup(agent[rows]),
            "heuristic": geomean_speedup(heuristic[rows]),
            random_key: geomean_speedup(random_best[rows]),
            "agent_at_least_random": float(np.mean(agent[rows] >= random_best[rows] - 1e-6)),
        }
        for group, rows in groups.items()
    }


def _check_surrogate(out: Path, meta: dict, surrogate: Surrogate, also=None) -> None:
    """The checkpoint was trained against `surrogate` (or `also`, the surrogate before a
    re-grounding round that ended after the checkpoint)."""
    recorded = meta.get("surrogate", {})
    allowed = {s.identity.get("params_sha256") for s in (surrogate, also) if s is not None}
    if recorded.get("params_sha256") not in allowed:
        raise RunError(
            f"{out} was trained against the surrogate {recorded}; the one loaded now is "
            f"{surrogate.identity}. Resume with that surrogate (the config's `surrogate`)"
        )


def run_training(
    out: str | Path,
    config: AgentConfig | None = None,
    resume: bool = False,
    surrogate: Surrogate | None = None,
    budget: dict | None = None,
    regrounding: TrainingHooks | None = None,
    init_agent: str | Path | None = None,
) -> dict:
    """Train (or resume) the run in `out`; returns its summary (also `summary.json`).

    `budget` ({"minutes": M} or {"iterations": N}) replaces the config's, also on resume. A
    resumed run with an iteration budget continues exactly as it would have gone on; with a
    time budget, the step size and entropy anneal by the time trained, so the continuation is
    the same only up to where the wall clock differs.

    `regrounding` (a `TrainingHooks`, such as `mlirrl_jax.regrounding.rounds(config)`) gives
    the run's re-grounding rounds, which correct the surrogate on this machine every
    `iterations_per_round` iterations; the run then trains against each round's surrogate in
    turn.

    `init_agent` (a run folder, e.g. the shipped agent's) starts a new run from that agent's
    policy instead of a fresh network (the optimizer starts afresh); its network must be the
    config's.
    """
    if init_agent is not None and resume:
        raise RunError("a resumed run goes on from its own checkpoint: drop init_agent")
    out = Path(out).resolve()
    config = _start(out, config, resume, dict(budget or {}))
    surrogate = surrogate or load_surrogate(config.surrogate)
    here = machine_fingerprint()["machine_id"]
    chosen_suites = training_suites(config, surrogate)
    say = log.info
    threads = training_threads(config, surrogate)
    say(
        f"reward: {surrogate.identity.get('kind')} {surrogate.path} (machine "
        f"{surrogate.machine_id or '-'}; this machine is {here}); suites {list(chosen_suites)}; "
        f"at {', '.join(map(str, threads))} thread(s)"
    )
    meta = checkpoint.load_meta(out) if resume else {}
    train_programs = load_programs(TRAIN, chosen_suites)
    rounds: TrainingHook | None = (
        regrounding(out, resume, config, train_programs, surrogate) if regrounding else None
    )
    if rounds is not None:
        surrogate = rounds.current()
    check_this_machine(surrogate, threads, "--train-threads")
    if resume:
        _check_surrogate(out, meta, surrogate, rounds.before_last() if rounds else None)
    if not train_programs:
        raise RunError(f"the suites {list(chosen_suites)} have no train programs")
    test_programs = load_programs(TEST, chosen_suites) if config.eval_every else []
    if config.eval_every and not test_programs:
        say(f"the suites {list(chosen_suites)} have no test programs: no evaluation")
    train_rows, table = encode_at_threads(train_programs, threads)
    trainer = make_train(config, surrogate.model, table, np.arange(len(train_rows)))
    steps_per_iteration = config.envs * config.steps
    trained_s = meta.get("trained_seconds", 0.0)

    def budget_progress(iterations_done: int, seconds: float):
        if config.iterations:
            return budget_share(iterations_done, config.iterations)
        return np.float32(seconds / (60.0 * config.minutes))

    done = meta.get("iteration", 0)
    if resume and budget_progress(done, trained_s) >= 1.0:
        say(f"{out} finished its budget at {done} iterations: raise --iterations or --minutes")
        return (
            json.loads((out / "summary.json").read_text())
            if (out / "summary.json").is_file()
            else {}
        )
    test_rows, evaluator = [], None
    if test_programs:
        test_rows, test_table = encode_at_threads(test_programs, threads)
        evaluator = Evaluator(trainer.env, test_rows, trainer.graphdef, test_table)
    test_reward = evaluator.prepare(surrogate.params) if evaluator else None
    say(
        f"{len(train_programs)} train programs, {len(test_programs)} test programs; "
        f"{config.envs} environments x {config.steps} steps per iteration on "
        f"{trainer.devices} device(s)"
    )
    baselines = _baselines(out, evaluator, test_reward, surrogate, config) if evaluator else {}
    names = [p.name for p in test_rows]
    row_threads = np.asarray(evaluator.table.threads) if evaluator else None

    key = jax.random.PRNGKey(config.seed)
    if resume:
        like = jax.eval_shape(lambda: trainer.init(key, surrogate.params))
        state, meta = checkpoint.restore(out, like)
        state = trainer.place(state)
    else:
        state = trainer.init(key, surrogate.params)
        if init_agent is not None:
            state = trainer.place(_started_from(state, Path(init_agent), config))
            say(f"starting from the policy of {init_agent}")
    reward_params = trainer.prepare(surrogate.params)
    done = int(state.iteration)
    metrics = _read_metrics(out / "metrics.jsonl", done)
    iteration = jax.jit(trainer.iteration)

    def checkpoint_meta() -> dict:
        return {
            "config": config.to_json(),
            "surrogate": surrogate.identity,
            "trained_seconds": trained_s,
            "env_steps": done * steps_per_iteration,
            "machine_id": here,
            "splits_version": SPLITS_VERSION,
        }

    def evaluate(row: dict) -> None:  # on one device, the evaluator's
        agent = evaluator.greedy(jax.device_put(state.params, jax.devices()[0]), test_reward)
        row["test"] = evaluation_row(names, agent, baselines, config, row_threads)

    checkpoint.save(out, state, checkpoint_meta())  # resumable from the first moment
    compile_started = time.perf_counter()
    compiled = iteration.lower(state, reward_params, budget_progress(done, trained_s)).compile()
    say(f"compiled the training iteration in {time.perf_counter() - compile_started:.1f} s")
    total = config.iterations or 60.0 * config.minutes
    bar = progress_bar(
        total=total,
        initial=done if config.iterations else min(trained_s, total),
        unit="it" if config.iterations else "s",
        bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
    )
    last_checkpoint = time.perf_counter()
    metrics_file = out / "metrics.jsonl"
    write_atomic(metrics_file, "".join(json.dumps(m) + "\n" for m in metrics))
    try:
        with metrics_file.open("a") as sink:
            while budget_progress(done, trained_s) < 1.0:
                if rounds is not None and rounds.due(done):  # also first thing on resume
                    checkpoint.save(out, state, checkpoint_meta())  # the round starts here
                    bar.clear()
                    params = jax.device_put(jax.device_get(state.params), jax.devices()[0])
                    surrogate = rounds.run_round(params)
                    reward_params = trainer.prepare(surrogate.params)
                    if evaluator:
                        test_reward = evaluator.prepare(surrogate.params)
                        baselines = _baselines(out, evaluator, test_reward, surrogate, config)
                    last_checkpoint = time.perf_counter()
                started = time.perf_counter()
                state, values = compiled(state, reward_params, budget_progress(done, trained_s))
                values = {k: float(v) for k, v in jax.device_get(values).items()}
                seconds = time.perf_counter() - started
                trained_s += seconds
                done += 1
                row = {
                    "iteration": done,
                    "trained_seconds": trained_s,
                    "env_steps": done * steps_per_iteration,
                    "steps_per_second": steps_per_iteration / seconds,
                    "iteration_seconds": seconds,
                    "ended_at": time.time(),  # wall clock: phases of a run never overlap
                    # None: no episode ended in this iteration
                    "mean_predicted_speedup": float(np.exp(values["mean_log_speedup"]))
                    if values["episodes"]
                    else None,
                    **values,
                }
                finished = budget_progress(done, trained_s) >= 1.0
                if evaluator and (done % config.eval_every == 0 or finished or done == 1):
                    evaluate(row)
                metrics.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                bar.update(1 if config.iterations else min(seconds, max(total - bar.n, 0.0)))
                bar.set_postfix(_postfix(row, metrics))
                if finished or time.perf_counter() - last_checkpoint >= config.checkpoint_seconds:
                    checkpoint.save(out, state, checkpoint_meta())
                    last_checkpoint = time.perf_counter()

    except KeyboardInterrupt:
        checkpoint.save(out, state, checkpoint_meta())  # --resume goes on from here
        raise
    finally:
        bar.close()
    final = next((m for m in reversed(metrics) if "test" in m), {})
    summary = {
        "run": str(out),
        "iterations": done,
        "env_steps": done * steps_per_iteration,
        "trained_seconds": trained_s,
        "steps_per_second": done * steps_per_iteration / max(trained_s, 1e-9),
        "machine_id": here,
        "surrogate": surrogate.identity,
        "splits_version": SPLITS_VERSION,
        "train_programs": len(train_programs),
        "test_programs": len(test_programs),
        "threads": list(threads),
        "test": final.get("test", {}),
    }
    write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    save_learning_curve(metrics, out / "learning_curve.png", config)
    checkpoint.seal_run(out)  # the finished run's every file, checked when it loads
    say(format_summary(summary, config))
    return summary


def _started_from(state: TrainingState, run_dir: Path, config: AgentConfig) -> TrainingState:
    """`state` with the policy of the agent in `run_dir` and a fresh optimizer on it."""
    meta = checkpoint.load_meta(run_dir)
    theirs = AgentConfig.from_json(meta["config"])
    if theirs.network != config.network:
        raise RunError(
            f"{run_dir}'s network {theirs.network} is not this run's {config.network}: start "
            "from an agent of the same network, or from scratch"
        )
    params = checkpoint.restore_params(run_dir, abstract(config.network)[1], meta)
    params = jax.device_put(params, jax.devices()[0])
    return state.replace(params=params, opt_state=optimizer(config).init(params))


def _postfix(row: dict, metrics: list[dict]) -> dict:
    """The progress bar's figures: steps/s, the mean predicted speedup of the episodes that
    ended, and the latest evaluation on the test programs."""
    postfix = {"steps/s": f"{row['steps_per_second']:,.0f}"}
    if row["mean_predicted_speedup"]:
        postfix["speedup"] = f"{row['mean_predicted_speedup']:.2f}x"
    latest = next((m["test"]["all"] for m in reversed(metrics) if "test" in m), None)
    if latest:
        postfix["test"] = f"{latest['agent']:.2f}x (heur. {latest['heuristic']:.2f}x)"
    return postfix
