"""`optimize_model`: every distinct layer of an imported model optimized and the model composed.

Per thread count, each distinct layer (`models.importer`) is measured unscheduled, with the
heuristic's schedule, with the agent's proposals (its start from what is known, as `optimize`)
and jitted by XLA:CPU, all verified against the reference. The model's time by each method is
the sum of its layers' times weighted by their counts. PyTorch eager and `torch.compile` run
the whole model in a child process pinned to the same cores (`models.torch_time`), when the
model came from PyTorch. The best schedules are then replayed through the model's steps
(`models.execute`) and the output compared with the model's own, so that the composed time is
the time of a computation that is right. An import whose own check failed, or could not run, is
refused: its cut may not compute the model. `force` optimizes it all the same, and then every
report says so. A replay that cannot run (an op left out of the layers that it cannot compute)
is said in the table; the composed time leaves that op out, as the import said.

A composed time leaves out what lies between layers: data movement that is not a layer
(`tensor.pad` and slices, named in the import's report), layout changes between layers, and any
fusion across layers (XLA and `torch.compile` may fuse a whole block). It counts the layers as if
each started with cold caches no more than a kernel timed alone does.

The folder holds `layers.jsonl` (one row per layer and thread count, appended as measured: a
rerun measures only what is missing), `torch.jsonl`, `schedules/T/LAYER.json`,
`measurements/T/LAYER.jsonl` (every kernel measurement of a layer: where its search starts, no
schedule measured twice), and, last,
`summary.json`, `table.md` and `time_by_layer.png`. `settings.json` records the import's hash
(`importer.cut_hash`): a rerun resumes only the same import.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlirrl_jax.errors import Error
from mlirrl_jax.models.cut import ModelError
from mlirrl_jax.models.importer import ModelImport, models_available
from mlirrl_jax.models.rows import LayerRow, ModelSummary, append_row, latest, read_rows
from mlirrl_jax.runfolder import write_atomic

log = logging.getLogger("mlirrl_jax.models")
TORCH_TIMEOUT_S = 1200.0


class ModelOptimizeError(Error, ValueError):
    """Settings `optimize_model` cannot take, or a folder holding another model's run."""


def _ms(m) -> float | None:
    return m.median_s * 1e3 if m is not None and m.ok and m.verified and m.median_s else None


def _xla_program(model_dir: Path, layer, program):
    """The program XLA:CPU's baseline times for a layer: a gathered strided convolution's
    direct form (XLA takes the convolution itself), else the layer's own."""
    from mlirrl_jax.programs.ir import load_program

    if layer.direct_path is None:
        return program
    return load_program(model_dir / layer.direct_path, layer.name)


def _measure_layer(runner, program, count, threads, proposals, method, xla) -> tuple:
    """One layer at `threads`: its row, the best verified schedule (None: unscheduled) and its
    kernels' measurements, the unscheduled one first. `xla`: the program XLA:CPU's baseline
    times (`_xla_program`), or False."""
    from mlirrl_jax.measure.baselines import measure_xla
    from mlirrl_jax.strategies import Measured, Method, Proposing, measure_candidates, registry

    row = LayerRow(program.name, threads, count, program.flops)
    base = runner.measure(program, None, threads=1, method=method)
    row.unscheduled_ms = _ms(base)
    candidates = []
    if proposals is not None:
        heuristic = registry()[Method.HEURISTIC].propose(Proposing([program], threads, 1))[0]
        chosen = {
            Method.HEURISTIC: heuristic,
            Method.AGENT_TOPK: [
                c for c in proposals if c.schedule.hash != heuristic[0].schedule.hash
            ],
        }
        once = Measured.on(runner, program, threads, method)
        trials = measure_candidates(once, chosen)
        row.heuristic_ms = _ms(trials[Method.HEURISTIC][0].measurement)
        candidates = [(t.source, t.measurement, t.schedule) for ts in trials.values() for t in ts]
    for source, m, _ in candidates:
        if _ms(m) is None:
            row.failures.append(f"{source}: {m.status}{'' if m.verified else ' (not verified)'}")
    good = [(_ms(m), source, s) for source, m, s in candidates if _ms(m) is not None]
    best = min(good, key=lambda g: g[0]) if good else None
    if best is not None:
        row.agent_ms, row.agent_source = best[0], best[1]
    elif row.unscheduled_ms is not None:  # beyond the agent, or nothing verified: as it is
        row.agent_ms, row.agent_source = row.unscheduled_ms, "unscheduled"
    if row.heuristic_ms is None:
        row.heuristic_ms = row.unscheduled_ms
    if xla is not False:
        row.xla_ms = _ms(measure_xla(xla, threads, method))
    row.measured = 1 + len(candidates) + int(xla is not False)
    return row, (best[2] if best is not None else None), [base, *(m for _, m, _ in candidates)]


def _measurements_path(out: Path, threads: int, layer: str) -> Path:
    """Every kernel measurement of a layer at `threads`: what its search starts from."""
    return out / "measurements" / str(threads) / f"{layer}.jsonl"


def _torch_times(source: str, shape: list[int], threads: int, compile_: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        request, out = Path(tmp) / "request.json", Path(tmp) / "out.json"
        cores = sorted(os.sched_getaffinity(0))
        request.write_text(
            json.dumps(
                {
                    "source": source,
                    "input_shape": shape,
                    "threads": threads,
                    "cores": cores,
                    "compile": compile_,
                }
            )
        )
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        # a child process of its own, as the importer's lowering (`importer._lower`): each
        # names its own module, time limit and environment
        try:
            done = subprocess.run(
                [sys.executable, "-m", "mlirrl_jax.models.torch_time", str(request), str(out)],
                capture_output=True,
                text=True,
                timeout=TORCH_TIMEOUT_S,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return {"threads": threads, "failed": f"over {TORCH_TIMEOUT_S:g} s"}
        if done.returncode != 0 or not out.is_file():
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])[:400]
            return {"threads": threads, "failed": tail or f"exit {done.returncode}"}
        return json.loads(out.read_text())


def _check(model_dir: Path, out: Path, threads: list[int]) -> tuple[dict, str | None]:
    """Each thread count's best schedules replayed through the model: the largest relative
    difference from the model's own output; and why the replay could not run (None: it ran)."""
    from mlirrl_jax.models.importer import check_cut
    from mlirrl_jax.programs.ir import load_program
    from mlirrl_jax.schedule import Schedule
    from mlirrl_jax.transform import transform_script

    errors = {}
    for t in threads:
        scripts = {}
        for path in sorted((out / "schedules" / str(t)).glob("*.json")):
            schedule = Schedule.from_json(json.loads(path.read_text()))
            program = load_program(model_dir / "layers" / f"{path.stem}.mlir", path.stem)
            scripts[path.stem] = transform_script(program, schedule)
        try:
            errors[str(t)] = check_cut(model_dir, scripts, say=log.info)
        except ModelError as exc:  # an op the replay cannot compute: the same at every count
            log.warning("the best schedules could not be replayed through the model: %s", exc)
            return errors, str(exc)
    return errors, None


def _failed_check(imported: ModelImport) -> str | None:
    """What the import's own check of its cut found (None: it agreed, or was not asked for)."""
    if imported.check_ok is not False:
        return None
    if imported.check_note:
        return f"the import's cut could not be checked against the model ({imported.check_note})"
    return (
        "the import's cut does not compute the model (its output differs from the model's by "
        f"{imported.check_error:.1e}, relative)"
    )


def optimize_model(
    model_dir: str | os.PathLike,
    out: str | os.PathLike,
    budget: int = 4,
    threads: tuple[int, ...] = (1,),
    run: str | os.PathLike | None = None,
    timeout_s: float = 60.0,
    mem_limit_mb: int | None = None,
    seed: int = 0,
    xla: bool = True,
    torch_baselines: bool = True,
    torch_compile: bool = True,
    search_top: int = 0,
    search_budget: int = 32,
    force: bool = False,
    say=log.info,
) -> ModelSummary:
    """Optimize the model imported in `model_dir` into `out` (see the module's documentation).
    `search_top` > 0: the evolutionary search (`search_budget` measurements) also runs on that
    many layers that take most of the model's time by the agent's schedules, per thread count.
    `force`: an import whose check failed is optimized too, with a warning in every report."""
    from mlirrl_jax.adopted import default_agent_run
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.measure.runner import Runner
    from mlirrl_jax.measure.timing import TimingMethod
    from mlirrl_jax.programs.ir import load_program
    from mlirrl_jax.runfolder import check_inputs

    if budget < 1:
        raise ModelOptimizeError(f"--budget must be at least 1, got {budget}")
    model_dir, out = Path(model_dir), Path(out)
    imported = ModelImport.load(model_dir)
    failed = _failed_check(imported)
    if failed is not None and not force:
        raise ModelOptimizeError(
            f"{model_dir}: {failed}: its times may not be the model's; pass --force to "
            "optimize it all the same (see its report.md)"
        )
    warning = None
    if failed is not None:
        warning = f"WARNING: {failed}; optimized with --force: these times may not be the model's"
        log.warning(warning)
    torch_baselines = torch_baselines and not imported.source.endswith(".onnx")
    if torch_baselines:
        models_available(
            ("torch",), "timing PyTorch eager and torch.compile", ", or pass --no-torch"
        )
    runs = {t: Path(run) if run else default_agent_run(t) for t in threads}
    check_inputs(runs=runs.values())
    machine = machine_fingerprint()["machine_id"]
    out.mkdir(parents=True, exist_ok=True)
    settings = {"model": str(model_dir.resolve()), "source": imported.source, "budget": budget}
    settings["cut_hash"] = imported.cut_hash
    settings |= {
        "machine_id": machine,
        "seed": seed,
        "agents": {t: str(r) for t, r in runs.items()},
    }
    settings = json.loads(json.dumps(settings))
    recorded = out / "settings.json"
    before = json.loads(recorded.read_text()) if recorded.is_file() else settings
    if before.get("cut_hash", imported.cut_hash) != imported.cut_hash:
        raise ModelOptimizeError(
            f"{out} holds a run of another import (cut {before['cut_hash']}); {model_dir} now "
            f"holds cut {imported.cut_hash}: use another folder, or import the model as it was"
        )
    if before != settings:
        raise ModelOptimizeError(
            f"{out} holds a run with other settings ({recorded}): use another folder"
        )
    write_atomic(recorded, json.dumps(settings, indent=1))
    layers = [layer for layer in imported.layers if layer.status != "refused"]
    programs = {layer.name: load_program(model_dir / layer.path, layer.name) for layer in layers}
    rows_path = out / "layers.jsonl"
    done = {(r["layer"], r["threads"]) for r in read_rows(rows_path)}
    method = TimingMethod(seed=seed)
    limits = {"mem_limit_mb": mem_limit_mb} if mem_limit_mb else {}
    for t in threads:
        todo = [layer for layer in layers if (layer.name, t) not in done]
        if not todo:
            continue
        schedulable = [programs[layer.name] for layer in todo if layer.status == "program"]
        proposals = _proposals(runs[t], schedulable, budget, seed, t, say)
        (out / "schedules" / str(t)).mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with Runner(timeout_s, **limits) as runner:
            for i, layer in enumerate(todo, 1):
                row, best, measured = _measure_layer(
                    runner,
                    programs[layer.name],
                    layer.count,
                    t,
                    proposals.get(layer.name),
                    method,
                    xla and _xla_program(model_dir, layer, programs[layer.name]),
                )
                if best is not None:
                    write_atomic(
                        out / "schedules" / str(t) / f"{layer.name}.json",
                        json.dumps(best.to_json()),
                    )
                path = _measurements_path(out, t, layer.name)
                path.parent.mkdir(parents=True, exist_ok=True)
                # before the row: a layer with a row has its measurements
                write_atomic(path, "".join(json.dumps(m.to_json()) + "\n" for m in measured))
                append_row(rows_path, row.to_json())
                rate = i / (time.perf_counter() - started)
                scheduled = "no schedule tried"  # beyond the agent: unscheduled in every sum
                if layer.status == "program":
                    scheduled = f"heuristic {_fmt(row.heuristic_ms)}, agent {_fmt(row.agent_ms)}"
                say(
                    f"  [{t} thread(s)] {i}/{len(todo)} {layer.name} x{layer.count}: "
                    f"unscheduled {_fmt(row.unscheduled_ms)}, {scheduled}, XLA "
                    f"{_fmt(row.xla_ms)} ms; ETA {(len(todo) - i) / rate:.0f} s"
                )
    for t in threads if search_top else ():
        _search_heaviest(
            out,
            programs,
            t,
            runs[t],
            search_top,
            search_budget,
            method,
            seed,
            Runner(timeout_s, **limits),
            say,
        )
    torch_path = out / "torch.jsonl"
    timed = {r["threads"] for r in read_rows(torch_path)}
    if torch_baselines:
        for t in threads:
            if t not in timed:
                say(f"timing PyTorch eager and torch.compile at {t} thread(s)")
                append_row(
                    torch_path,
                    _torch_times(imported.source, imported.input_shape, t, torch_compile),
                )
    replay, replay_note = _check(model_dir, out, list(threads))
    from mlirrl_jax.models.report import write_report

    if warning is not None:
        log.warning(warning)
    return write_report(out, imported, settings, list(threads), replay, replay_note, warning)


def _search_heaviest(out, programs, threads, run, top, budget, method, seed, runner, say):
    """The evolutionary search on the `top` layers that take most of the model's time; each
    searched layer gets a new row (its best of the agent's and the search's)."""
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.measure.timing import Measurement
    from mlirrl_jax.optimize import search_surrogate
    from mlirrl_jax.schedule import Schedule
    from mlirrl_jax.strategies import Candidate, Measured, Method, Searching, measure_candidates

    rows = [
        r
        for (_, t), r in latest(read_rows(out / "layers.jsonl")).items()
        if t == threads and r["layer"] in programs and r["agent_source"] != "unscheduled"
    ]
    rows.sort(key=lambda r: -(r["count"] * (r["agent_ms"] or 0)))
    todo = [r for r in rows[:top] if not r.get("searched")]
    if not todo:
        return
    surrogate = search_surrogate(Agent.load(run))
    with runner:
        for i, first in enumerate(todo, 1):
            row = LayerRow.from_json(first)
            program = programs[row.layer]
            say(f"[{threads} thread(s)] search {i}/{len(todo)}: {row.layer} x{row.count}")
            # the layer's measurements (the heuristic's and the agent's schedules) are the
            # search's first parents, none measured again: it mutates what is known to be good
            path = _measurements_path(out, threads, row.layer)
            measured = [Measurement.from_json(m) for m in read_rows(path)]
            base = next((m for m in measured if not m.schedule["ops"]), None)
            if base is None:  # a folder measured before its measurements were kept
                base = runner.measure(program, None, threads=1, method=method)
            once = Measured.on(runner, program, threads, method)
            known = [once.know(Schedule.from_json(m.schedule), m) for m in measured]
            known = [Candidate(s) for s in known if s.ops]
            ctx = Searching(program, threads, budget, seed, base, surrogate, say)
            trials = measure_candidates(
                once, {Method.AGENT_TOPK: known}, [Method.EVOLUTIONARY], ctx
            )[Method.EVOLUTIONARY]
            for t in trials:
                append_row(path, t.measurement.to_json())
            good = [(t.seconds * 1e3, t.source, t.measurement) for t in trials if t.seconds]
            row.searched = True
            row.measured += len(trials)
            if good:
                ms, source, m = min(good, key=lambda g: g[0])
                row.search_ms = ms
                if row.agent_ms is None or ms < row.agent_ms:
                    row.tuned_ms, row.tuned_source = ms, source
                    write_atomic(
                        out / "schedules" / str(threads) / f"{row.layer}.json",
                        json.dumps(Schedule.from_json(m.schedule).to_json()),
                    )
            append_row(out / "layers.jsonl", row.to_json())
            say(f"  search best {_fmt(row.search_ms)} ms against the agent's {_fmt(row.agent_ms)}")


def _proposals(run: Path, programs: list, budget: int, seed: int, threads: int, say) -> dict:
    """The agent's proposals per layer name (its start from what is known, as `optimize`)."""
    if not programs:
        return {}
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.host_devices import use_compilation_cache
    from mlirrl_jax.strategies import Method, Proposing, registry

    use_compilation_cache()
    agent = Agent.load(run)
    say(f"the agent ({run}) proposes {budget} schedules for each of {len(programs)} layers")
    ctx = Proposing(programs, threads, budget + 1, seed, agent, "known")
    found = registry()[Method.AGENT_TOPK].propose(ctx)
    return {p.name: chosen for p, chosen in zip(programs, found, strict=True)}


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.3f}"
