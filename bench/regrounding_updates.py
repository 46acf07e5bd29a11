"""What a re-grounding update should learn from, judged on the schedules the agent goes to
next: the on-policy error of surrogates made from the same measurements of this machine.

    python bench/regrounding_updates.py --run runs/NAME [--test-round R] [--epochs 20]

From a re-grounding run's store and task lists: the rows of this machine measured in rounds
before R (every round before the last, by default) are the training rows; round R's learned
schedules are the on-policy test (programs no earlier round learned from), and the run's
validation programs the held-out test. Candidates, each from the same rows:
- the prior, not fine-tuned;
- fine-tuned from the prior on the rows ("measured");
- fine-tuned on the rows plus random states of the same programs labeled by the prior
  ("anchored"), or by the prior corrected by residual trees fitted on the rows ("residual");
- a network fitted from scratch on the rows alone (no teacher; its own default schedule).
Prints a table (MAPE of speedup, Spearman per program, top-1 hit) per test set and writes it
to `<run>/regrounding/updates.md`.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.programs.ir import load_program
from mlirrl_jax.regrounding import RegroundConfig, anchor_states, surrogate_metrics
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.shipped import SHIPPED_SURROGATE
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.api import CostModel
from mlirrl_jax.surrogate.dataset import load_dataset
from mlirrl_jax.surrogate.model import ModelConfig
from mlirrl_jax.surrogate.train import TrainConfig

# the training programs' roles (a validation or held-out program's baseline is not learned)
ROLES_LEARNED = ("learn", "calibration", "track")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--test-round", type=int, help="default: the last completed round")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    folder = Path(args.run) / "regrounding"
    config = RegroundConfig.from_json(json.loads((folder / "config.json").read_text()))
    state = json.loads((folder / "state.json").read_text())
    test_round = args.test_round or state["completed"]
    here = machine_fingerprint()["machine_id"]
    tasks = {
        r: json.loads((folder / f"round-{r}" / "tasks.json").read_text())
        for r in range(1, test_round + 1)
    }
    learned_programs = {
        t["program_hash"]
        for r in range(1, test_round)
        for t in tasks[r]
        if t["role"] in ROLES_LEARNED
    }
    on_policy_programs = {t["program_hash"] for t in tasks[test_round] if t["role"] == "learn"}
    on_policy_programs -= learned_programs
    validation_programs = {
        t["program_hash"] for r in tasks for t in tasks[r] if t["role"] == "validation"
    }
    on_policy_keys = {
        (t["program_hash"], Schedule.from_json(t["schedule"]).hash)
        for t in tasks[test_round]
        if t["role"] == "learn"
    }
    names = {t["program_hash"]: t["program"] for r in tasks for t in tasks[r]}
    programs = [load_program(names[h]) for h in sorted(names)]
    with MeasurementStore(config.store) as store:

        def rows(hashes):
            return load_dataset(store, here, programs=hashes, table_programs=programs)

        train = rows(learned_programs)
        on_policy = rows(on_policy_programs)
        validation = rows(validation_programs) if validation_programs else None
    recorded = folder / "prior.json"  # runs before it was recorded: the shipped surrogate
    prior_path = (
        json.loads(recorded.read_text())["path"] if recorded.is_file() else SHIPPED_SURROGATE
    )
    prior = CostModel.load(prior_path)
    print(
        f"machine {here}; prior of machine {prior.meta.get('machine_id')}; training rows "
        f"{len(train)} of {len(learned_programs)} programs (rounds 1-{test_round - 1}); "
        f"on-policy test: round {test_round}, {len(on_policy)} rows of {len(on_policy_programs)} programs; "
        f"validation {0 if validation is None else len(validation)} rows",
        flush=True,
    )
    candidates = {"prior, not fine-tuned": lambda: prior}
    for kind in ("measured", "anchored", "residual"):
        candidates[f"fine-tuned: {kind}"] = lambda kind=kind: prior.update(
            train,
            args.epochs,
            machine_id=here,
            anchor=anchor_states(kind, train, prior, config.anchor_share, config.seed),
        )
    scratch = replace(
        TrainConfig(**{**prior.meta["train"], "model": prior_model_config(prior)}), teacher="none"
    )
    candidates["from scratch on this machine's rows"] = lambda: CostModel.fit(
        train, scratch, machine_id=here
    )[0]
    lines = [
        f"`python bench/regrounding_updates.py --run {args.run} --test-round {test_round} --epochs {args.epochs}`",
        "",
        "| surrogate | on-policy MAPE | on-policy Spearman | on-policy top-1 hit | validation MAPE | validation Spearman | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, make in candidates.items():
        started = time.perf_counter()
        model = make()
        seconds = time.perf_counter() - started
        mine = surrogate_metrics(model, on_policy, on_policy_keys)
        held = surrogate_metrics(model, validation)
        cells = [
            f"{mine['mape_speedup']:.1%}",
            f"{mine['spearman']:.3f}",
            f"{mine['top1_hit']:.2f}",
            f"{held['mape_speedup']:.1%}" if held else "-",
            f"{held['spearman']:.3f}" if held else "-",
            f"{seconds:.0f}",
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    (folder / "updates.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def prior_model_config(prior: CostModel) -> ModelConfig:
    return ModelConfig(**prior.meta["train"]["model"])


if __name__ == "__main__":
    main()
