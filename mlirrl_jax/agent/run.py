"""The `train` job: PPO on the surrogate, with checkpoints, metrics, a learning curve and a
report of the agent against the heuristic and random search on the test programs.

A run lives in one folder: `config.json` (the `AgentConfig`), `checkpoints/` (orbax, see
`checkpoint.py`), `metrics.jsonl` (one line per iteration; evaluations every
`config.eval_every` iterations), `baselines.json` (the heuristic's and random search's
predicted speedups per test program), `learning_curve.png` and `summary.json`. `resume=True`
continues a killed run from its newest checkpoint exactly as it would have gone on.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from mlirrl_jax.agent import checkpoint
from mlirrl_jax.agent.evaluate import Evaluator, geomean
from mlirrl_jax.agent.report import format_summary, save_learning_curve
from mlirrl_jax.agent.surrogate import Surrogate, load_surrogate
from mlirrl_jax.agent.train import AgentConfig, make_train
from mlirrl_jax.env.state import encode_programs
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import Program, parse_program
from mlirrl_jax.splits import TEST, TRAIN, entries, suite_of


class RunError(ValueError):
    """A run folder that cannot be started or resumed as asked."""


def load_programs(split: str, suite_names, progress: bool = False) -> list[Program]:
    """The programs of `split` in the given built-in suites, parsed."""
    chosen = entries(split, tuple(suite_names))
    bar = tqdm(chosen, desc=f"{split} programs", unit="program", disable=not progress, leave=False)
    return [parse_program(e.text, e.uri) for e in bar]


def _suites(config: AgentConfig, surrogate: Surrogate) -> tuple[str, ...]:
    known = set(suites.list_suites())
    chosen = tuple(s for s in (config.suites or surrogate.suites) if s in known)
    if not chosen:
        raise RunError(f"no built-in suite to train on among {config.suites or surrogate.suites}")
    return chosen


def _start(out: Path, config: AgentConfig | None, resume: bool) -> AgentConfig:
    saved_path = out / "config.json"
    if resume:
        if checkpoint.latest_step(out) is None:
            raise RunError(f"{out}: nothing to resume (no checkpoint in {out / 'checkpoints'})")
        saved = AgentConfig.from_json(json.loads(saved_path.read_text()))
        if config is not None and config != saved:
            raise RunError(
                f"{out}: --config differs from the run's own config.json; resume without --config"
            )
        return saved
    if saved_path.exists() or checkpoint.latest_step(out) is not None:
        raise RunError(f"{out} already holds a run: add --resume, or choose another --out")
    config = config or AgentConfig()
    out.mkdir(parents=True, exist_ok=True)
    saved_path.write_text(config.dumps())
    return config


def _read_metrics(path: Path, up_to: int) -> list[dict]:
    """The metric lines of iterations up to `up_to` (a resumed run rewrites the rest)."""
    if not path.is_file():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [m for m in lines if m["iteration"] <= up_to]


def _baselines(out: Path, evaluator: Evaluator, reward_params, surrogate, config) -> dict:
    """Per test program: the heuristic's and the best random schedules' predicted
    log-speedups, computed once per surrogate and kept in `baselines.json`."""
    path = out / "baselines.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("surrogate") == surrogate.identity:
            return saved
    heuristic = evaluator.heuristic(reward_params)
    random_best = evaluator.random_best(
        reward_params, config.eval_random_schedules, jax.random.PRNGKey(config.seed + 7)
    )
    saved = {
        "surrogate": surrogate.identity,
        "programs": [p.name for p in evaluator.programs],
        "heuristic": heuristic.tolist(),
        f"random_best_of_{config.eval_random_schedules}": random_best.tolist(),
    }
    path.write_text(json.dumps(saved, indent=1))
    return saved


def evaluation_row(names: list[str], agent: np.ndarray, baselines: dict, config) -> dict:
    """Geomean predicted speedups of the agent, the heuristic and random search: over all the
    test programs and per suite."""
    random_key = f"random_best_of_{config.eval_random_schedules}"
    heuristic, random_best = np.asarray(baselines["heuristic"]), np.asarray(baselines[random_key])
    groups = {"all": np.ones(len(names), bool)}
    for suite in sorted({suite_of(n) for n in names}):
        groups[suite] = np.array([suite_of(n) == suite for n in names])
    return {
        group: {
            "programs": int(rows.sum()),
            "agent": geomean(agent[rows]),
            "heuristic": geomean(heuristic[rows]),
            random_key: geomean(random_best[rows]),
            "agent_beats_random": float(np.mean(agent[rows] >= random_best[rows] - 1e-6)),
        }
        for group, rows in groups.items()
    }


def run_training(
    out: str | Path,
    config: AgentConfig | None = None,
    resume: bool = False,
    progress: bool = True,
    surrogate: Surrogate | None = None,
) -> dict:
    """Train (or resume) the run in `out`; returns its summary (also `summary.json`)."""
    out = Path(out).resolve()
    config = _start(out, config, resume)
    surrogate = surrogate or load_surrogate(config.surrogate)
    here = machine_fingerprint()["machine_id"]
    chosen_suites = _suites(config, surrogate)
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda t: None)
    say(
        f"reward: {surrogate.identity.get('kind')} {surrogate.path} (machine "
        f"{surrogate.machine_id or '-'}; this machine is {here}); suites {list(chosen_suites)}"
    )
    train_programs = load_programs(TRAIN, chosen_suites, progress)
    test_programs = load_programs(TEST, chosen_suites, progress) if config.eval_every else []
    table = encode_programs(train_programs)
    trainer = make_train(config, surrogate.model, table, np.arange(len(train_programs)))
    if test_programs:
        evaluator = Evaluator(trainer.env, test_programs, trainer.graphdef)
        test_reward = evaluator.prepare(surrogate.params)
    say(
        f"{len(train_programs)} train programs, {len(test_programs)} test programs; "
        f"{config.envs} environments x {config.steps} steps per iteration on "
        f"{trainer.devices} device(s)"
    )
    baselines = (
        _baselines(out, evaluator, test_reward, surrogate, config) if config.eval_every else {}
    )
    names = [p.name for p in test_programs]

    key = jax.random.PRNGKey(config.seed)
    if resume:
        like = jax.eval_shape(lambda: trainer.init(key, surrogate.params))
        state, meta = checkpoint.restore(out, like)
        state = trainer.place(state)
        trained_s = meta["trained_seconds"]
    else:
        state, meta, trained_s = trainer.init(key, surrogate.params), {}, 0.0
    model_params = trainer.replicate(surrogate.params)
    done = int(state.iteration)
    metrics = _read_metrics(out / "metrics.jsonl", done)
    steps_per_iteration = config.envs * config.steps
    iteration = jax.jit(trainer.iteration)

    def budget_progress(iterations_done: int, seconds: float) -> float:
        if config.iterations:
            return iterations_done / config.iterations
        return seconds / (60.0 * config.minutes)

    def checkpoint_meta() -> dict:
        return {
            "config": config.to_json(),
            "surrogate": surrogate.identity,
            "trained_seconds": trained_s,
            "env_steps": done * steps_per_iteration,
            "machine_id": here,
        }

    def evaluate(row: dict) -> None:  # on one device, the evaluator's
        agent = evaluator.greedy(jax.device_put(state.params, jax.devices()[0]), test_reward)
        row["test"] = evaluation_row(names, agent, baselines, config)

    compile_started = time.perf_counter()
    compiled = iteration.lower(state, model_params, 0.0).compile()
    say(f"compiled the training iteration in {time.perf_counter() - compile_started:.1f} s")
    total = config.iterations or 60.0 * config.minutes
    bar = tqdm(
        total=total,
        initial=done if config.iterations else min(trained_s, total),
        unit="it" if config.iterations else "s",
        disable=not progress,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} [{elapsed}<{remaining}{postfix}]",
    )
    last_checkpoint = time.perf_counter()
    metrics_file = out / "metrics.jsonl"
    metrics_file.write_text("".join(json.dumps(m) + "\n" for m in metrics))
    with metrics_file.open("a") as sink:
        while budget_progress(done, trained_s) < 1.0:
            started = time.perf_counter()
            state, values = compiled(state, model_params, budget_progress(done, trained_s))
            values = {k: float(v) for k, v in jax.device_get(values).items()}
            seconds = time.perf_counter() - started
            trained_s += seconds
            done += 1
            row = {
                "iteration": done,
                "trained_seconds": trained_s,
                "env_steps": done * steps_per_iteration,
                "steps_per_second": steps_per_iteration / seconds,
                "mean_predicted_speedup": float(np.exp(values["mean_log_speedup"])),
                **values,
            }
            finished = budget_progress(done, trained_s) >= 1.0
            if config.eval_every and (done % config.eval_every == 0 or finished or done == 1):
                evaluate(row)
            metrics.append(row)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            bar.update(1 if config.iterations else seconds)
            postfix = {
                "steps/s": f"{row['steps_per_second']:,.0f}",
                "speedup": f"{row['mean_predicted_speedup']:.2f}x",
            }
            latest_test = next((m["test"]["all"] for m in reversed(metrics) if "test" in m), None)
            if latest_test:
                postfix["test"] = (
                    f"{latest_test['agent']:.2f}x (heur. {latest_test['heuristic']:.2f}x)"
                )
            bar.set_postfix(postfix)
            if finished or time.perf_counter() - last_checkpoint >= config.checkpoint_seconds:
                checkpoint.save(out, state, checkpoint_meta())
                last_checkpoint = time.perf_counter()
    bar.close()
    checkpoint.save(out, state, checkpoint_meta())
    final = next((m for m in reversed(metrics) if "test" in m), {})
    summary = {
        "run": str(out),
        "iterations": done,
        "env_steps": done * steps_per_iteration,
        "trained_seconds": trained_s,
        "steps_per_second": done * steps_per_iteration / max(trained_s, 1e-9),
        "machine_id": here,
        "surrogate": surrogate.identity,
        "train_programs": len(train_programs),
        "test_programs": len(test_programs),
        "test": final.get("test", {}),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    save_learning_curve(metrics, out / "learning_curve.png", config)
    say(format_summary(summary, config))
    return summary
