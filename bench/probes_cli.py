"""Probes of `collect`, the flags, this machine and its profile (`probes.py` runs them): each
case reproduces a reported defect's recipe through real `mlirrl-jax` processes."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

from probes_runs import ROOT, cli, kernel, said

from mlirrl_jax.host_devices import available_cores
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.profile import CACHE_ENV, PROFILE_TOLERANCE, cached_profile_path
from mlirrl_jax.shipped import SHIPPED_SURROGATE

# JAX names each compilation on stderr; the collection's sampler compiles its step for seconds
COMPILING = "Finished jaxpr to MLIR module conversion jit(step)"


def _interrupted_while_compiling(out: Path, whole_group: bool) -> tuple[dict, str]:
    """A real collection, Ctrl-C'd half a second into its sampler's compilation: its exit, the
    telling lines, and whether its store is intact."""
    store = out / ("group.db" if whole_group else "process.db")
    args = ["collect", "--store", str(store), "--rows", "50", "--max-programs", "2"]
    args += ["--workers", "1"]
    job = subprocess.Popen(
        [sys.executable, "-m", "mlirrl_jax.cli", *args],
        cwd=ROOT,
        env={**os.environ, "JAX_LOG_COMPILES": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=whole_group,  # its own group, as a terminal's foreground job
    )
    lines: list[str] = []
    compiling = threading.Event()

    def read() -> None:
        for line in job.stderr:
            lines.append(line)
            if COMPILING in line:
                compiling.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = compiling.wait(120)
    if started:
        threading.Event().wait(0.5)
        if whole_group:
            os.killpg(job.pid, signal.SIGINT)  # as Ctrl-C: the job and its workers
        else:
            job.send_signal(signal.SIGINT)
    try:
        job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
    reader.join(10)
    job.stdout.close()
    err = "".join(lines)
    with contextlib.closing(sqlite3.connect(store)) as db:
        intact = db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    result = {
        "started": started,
        "code": job.returncode,
        "interrupted": "interrupted" in err,
        "crashed": "Fatal Python error" in err or "Segmentation fault" in err,
        "traceback": "Traceback" in err,
        "intact": intact,
    }
    kill = "kill -INT -PGID" if whole_group else "kill -INT PID"
    command = (
        f"JAX_LOG_COMPILES=1 {shlex.join(['mlirrl-jax', *args])} & (when jit(step) compiles) {kill}"
    )
    return result, command


def ctrl_c_on_collect(out: Path) -> dict:
    """7: Ctrl-C on collect, to the process and to its whole group, while JAX compiles."""
    runs = [_interrupted_while_compiling(out, group) for group in (False, True)]
    held = all(
        r["started"] and r["code"] == 130 and r["interrupted"] and r["intact"] for r, _ in runs
    ) and not any(r["crashed"] or r["traceback"] for r, _ in runs)
    got = "; ".join(
        f"{'group' if i else 'process'}: exit {r['code']}"
        + (", interrupted" if r["interrupted"] else "")
        + (", SEGMENTATION FAULT" if r["crashed"] else "")
        + (", a traceback" if r["traceback"] else "")
        + (", store intact" if r["intact"] else ", STORE DAMAGED")
        + ("" if r["started"] else ", never reached the compilation")
        for i, (r, _) in enumerate(runs)
    )
    return {
        "command": "; ".join(command for _, command in runs),
        "expected": "each run prints `interrupted` and exits 130, with no segmentation fault, "
        "and its store stays intact",
        "got": got,
        "held": held,
    }


def _refused(args: list[str], *needles: str) -> tuple[bool, str, str]:
    """Whether the command exits 2 with one `error:` line holding `needles`, no traceback."""
    done, command = cli(*args)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    held = (
        done.returncode == 2
        and len(errors) == 1
        and all(n in errors[0] for n in needles)
        and "Traceback" not in done.stderr
    )
    return held, command, said(done, "error:")


def infinite_mix_share(out: Path) -> dict:
    """9b: a schedule mix with an infinite share."""
    store = out / "m.db"
    args = ["collect", "--store", str(store), "--rows", "4", "--mix", "random:inf,heuristic:1"]
    held, command, got = _refused(args, "--mix", "'random'", "finite and positive")
    return {
        "command": command,
        "expected": "refused in one line naming the share of 'random', which must be finite and "
        "positive; no store is created",
        "got": got,
        "held": held and not store.exists(),
    }


def search_budget_without_search(out: Path) -> dict:
    """13a: --search-budget without the search it sizes, in optimize and optimize-model."""
    path = kernel(out)
    single, first, said_first = _refused(
        ["optimize", str(path), "--out", str(out / "o"), "--search-budget", "8"],
        "--search-budget",
        "--search evolutionary",
    )
    model, second, said_second = _refused(
        ["optimize-model", str(out), "--out", str(out / "m"), "--search-budget", "8"],
        "--search-budget",
        "--search-top",
    )
    return {
        "command": f"{first}; {second}",
        "expected": "each refused in one line naming --search-budget and the flag it needs",
        "got": f"{said_first}; {said_second}",
        "held": single and model and not (out / "o").exists() and not (out / "m").exists(),
    }


def empty_mix(out: Path) -> dict:
    """13b: an empty --mix."""
    store = out / "m.db"
    held, command, got = _refused(
        ["collect", "--store", str(store), "--rows", "4", "--mix", ""], "--mix"
    )
    return {
        "command": command,
        "expected": "refused in one line naming --mix, not taken as the default mix",
        "got": got,
        "held": held and not store.exists(),
    }


def unseen_machine_warned(out: Path) -> dict:
    """10: the shipped agent's schedules shown on this machine, at more threads than cores."""
    here = machine_fingerprint()["machine_id"]
    machines = json.loads((SHIPPED_SURROGATE / "model.json").read_text())["machines"]
    threads = available_cores() + 1
    args = ["show", "examples/matmul.mlir", "--agent", "data/agent", "--threads", str(threads)]
    done, command = cli(*args)
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    unseen = [line for line in warnings if f"this machine ({here}) is not among" in line]
    cores = [line for line in warnings if f"more than the {available_cores()} cores" in line]
    machine_told = (
        bool(unseen)
        and "recorded" in unseen[0]
        and "make demo" in unseen[0]
        and "--rounds N" in unseen[0]
        if here not in machines
        else not unseen
    )
    return {
        "command": command,
        "expected": f"one warning that this machine ({here}) is not among the surrogate's "
        f"machines ({', '.join(machines)}), with what is recorded of its transfer and how to "
        f"adapt it, and one that --threads {threads} is more than this machine's cores",
        "got": f"exit {done.returncode}: " + " | ".join(w[:220] for w in warnings),
        "held": done.returncode == 0 and machine_told and bool(cores),
    }


def _profile_in_home(home: Path) -> tuple[dict | None, str, str]:
    """A command that needs this machine's profile, run with a fresh $MLIRRL_HOME: the profile
    it cached there (None if it was refused), what it said, and the command."""
    args = ["show", "examples/matmul.mlir", "--agent", "data/agent"]
    environment = {"MLIRRL_HOME": str(home)}
    with mock.patch.dict(os.environ, environment):
        os.environ.pop(CACHE_ENV, None)  # the profile's own folder: under $MLIRRL_HOME
        done, command = cli(*args)
        cached = cached_profile_path()
    profile = json.loads(cached.read_text()) if cached.is_file() else None
    refused = done.returncode == 2 and "quiet machine" in done.stderr
    if profile is None and not refused:
        return None, f"MLIRRL_HOME={home} {command}", said(done)
    outcome = (
        f"bandwidth {profile['bandwidth_gbs']:.2f} GB/s, peak {profile['fma_peak_gflops']:.1f} "
        f"GFLOP/s in {cached.relative_to(home.parent)}"
        if profile
        else said(done, "error:")
    )
    return profile or {}, f"MLIRRL_HOME={home} {command}", outcome


def profile_quiet_and_under_home(out: Path) -> dict:
    """12: the profile measured in two fresh cache folders; `build/` ignored by git."""
    runs = [_profile_in_home(out / name) for name in ("home-a", "home-b")]
    profiles = [p for p, _, _ in runs if p]
    agree = all(
        abs(a[figure] - b[figure]) <= PROFILE_TOLERANCE * max(a[figure], b[figure])
        for a in profiles
        for b in profiles
        for figure in ("bandwidth_gbs", "fma_peak_gflops")
    )
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "build/lib/x.py"], cwd=ROOT, check=False
    ).returncode
    return {
        "command": "; ".join(c for _, c, _ in runs) + "; git check-ignore build/lib/x.py",
        "expected": "each run caches a profile under its $MLIRRL_HOME/cache or refuses a noisy "
        f"measurement in one line; the profiles measured agree within {PROFILE_TOLERANCE:.0%}; "
        "git ignores build/",
        "got": "; ".join(g for _, _, g in runs) + f"; build/ ignored: {ignored == 0}",
        "held": all(p is not None for p, _, _ in runs) and agree and ignored == 0,
    }


CASES = [
    (7, "Ctrl-C on collect is `interrupted`, exit 130, never a segfault", ctrl_c_on_collect),
    ("9b", "an infinite --mix share is refused by name", infinite_mix_share),
    (
        10,
        "a machine or thread count the surrogate has not seen is warned of",
        unseen_machine_warned,
    ),
    (
        12,
        "the profile is measured quietly and cached under $MLIRRL_HOME",
        profile_quiet_and_under_home,
    ),
    ("13a", "--search-budget without a search is refused", search_budget_without_search),
    ("13b", "an empty --mix is refused by name", empty_mix),
]
