"""This machine's agents: the one adapted to it at each thread count, else the shipped one.

`adapted/<machine id>.json` in the user data directory (`shipped.user_data_dir`) names the adapted runs per thread count; `mlirrl-jax demo`
and `train --adopt` write it (`adopt_agent_run`), `optimize` and `validate` read it
(`default_agent_run`, `runs_for_threads`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlirrl_jax.errors import ConfigError, Error
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.shipped import CHECKOUT_ADAPTED, SHIPPED_AGENT, adapted_dir


class NoAgentError(Error, ValueError):
    """No agent to use: none adapted to this machine and none shipped."""


def default_agent_run(threads: int = 1) -> Path:
    """The agent adapted to this machine at `threads` (else at one thread) if there is one,
    else the shipped agent."""
    name = f"{machine_fingerprint()['machine_id']}.json"
    pointer = adapted_dir() / name
    # a checkout's own pointer from before the per-user data directory is still read
    for found in (pointer, CHECKOUT_ADAPTED / name):
        if not found.is_file():
            continue
        recorded = json.loads(found.read_text())
        per_threads = recorded.get("threads", {})
        for run in (per_threads.get(str(threads)), per_threads.get("1"), recorded.get("run")):
            if run and (Path(run) / "checkpoints").is_dir():
                return Path(run)
    if (SHIPPED_AGENT / "checkpoints").is_dir():
        return SHIPPED_AGENT
    raise NoAgentError(
        f"no trained agent: neither an adapted one ({pointer}) nor a shipped one "
        f"({SHIPPED_AGENT}); train one with `mlirrl-jax train --out runs/NAME` and pass --run "
        "runs/NAME"
    )


def adopt_agent_run(run: str | os.PathLike, threads: int = 1) -> Path:
    """Make `run` this machine's adapted agent at `threads` (what `optimize` and `validate`
    use by default); returns the pointer file (`adapted/<machine id>.json` in the user data directory (`shipped.user_data_dir`))."""
    pointer = adapted_dir() / f"{machine_fingerprint()['machine_id']}.json"
    recorded = json.loads(pointer.read_text()) if pointer.is_file() else {}
    per_threads = recorded.get("threads", {})
    if "run" in recorded:  # a pointer of one run: its agent is the one-thread one
        per_threads.setdefault("1", recorded["run"])
    per_threads[str(threads)] = str(Path(run).resolve())
    recorded = {"run": per_threads.get("1", per_threads[str(threads)]), "threads": per_threads}
    pointer.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(pointer, json.dumps(recorded, indent=1))
    return pointer


def runs_for_threads(given: list, threads, default=default_agent_run) -> dict[int, Path]:
    """The agent run for each thread count. One run given: it for all. Several: each thread
    count takes the run whose surrogate was adapted at that count, else the one at one
    thread. None: `default(threads)` (this machine's adapted run at that count, else the
    shipped one)."""
    if not given:
        return {t: default(t) for t in threads}
    if len(given) == 1:
        return dict.fromkeys(threads, Path(given[0]))
    from mlirrl_jax.agent.checkpoint import load_meta

    by_threads: dict[int, Path] = {}
    for run in map(Path, given):
        t = int(load_meta(run).get("surrogate", {}).get("threads", 1))
        if t in by_threads:
            raise ConfigError(
                f"--run {by_threads[t]} and --run {run} were both adapted at {t} thread(s): "
                "give one run per thread count"
            )
        by_threads[t] = run
    missing = [t for t in threads if t not in by_threads and 1 not in by_threads]
    if missing:
        raise ConfigError(
            f"no --run adapted at {missing} thread(s) (nor at one thread): the runs given are "
            + ", ".join(f"{r} ({t} thread(s))" for t, r in sorted(by_threads.items()))
        )
    return {t: by_threads.get(t, by_threads.get(1)) for t in threads}
