"""Re-grounding: the agent's top schedules measured for real on this machine correct the
surrogate, between stretches of simulated training.

Every `iterations_per_round` PPO iterations, a round:
1. picks `round_programs` training programs (`selection`: where the agent's predicted gain
   over the heuristic times the surrogate ensemble's spread is largest, where the gain alone
   is, or uniformly) and takes the agent's `top_k` distinct
   schedules of each, sampled and ranked by the surrogate, plus each program's baseline if this
   machine has none; the fixed tracking programs' greedy schedules; and every
   `heldout_every` rounds the held-out test programs' greedy and heuristic schedules;
2. writes that list to `round-N/tasks.json`, then measures what the store lacks, committed as
   it goes (a killed round resumes its own list: nothing measured twice, nothing lost);
3. scores the surrogate on the schedules just measured (on-policy error), fine-tunes it on
   this machine's rows of the training programs but for the round's held-back programs, and
   scores it again on those: an update whose error on them grew is refused, the previous
   weights kept, and the refusal recorded in `rounds.jsonl` (`update_refused`, `refusal`);
4. saves the new surrogate to `round-N/surrogate`, records the round in `rounds.jsonl` and
   `state.json`, and training goes on against it: its parameters are an argument of the jitted
   iteration, so nothing recompiles.

Measurement and JAX work never share the cores: a round runs between iterations, in this
process, and its measuring phase starts only after the JAX work before it has finished
(`block_until_ready`); the workers are idle while JAX runs. Each phase's wall-clock interval is
logged in `phases.jsonl`.

Only this machine's rows are read or written. The first round on a machine that has no
measurements of its own also measures a calibration set: `calibration_programs` training
programs' baselines and the agent's greedy schedules, and the surrogate-validation programs
that score the surrogate on this machine (`validation_programs`, each with `validation_k`
schedules), which are never learned from.

The run's iterations: K (`iterations_per_round`) before each round and K after the last, so a
run given no budget of its own trains exactly (rounds + 1) x K iterations
(`RegroundConfig.run_iterations`); an iteration budget that ends before the last round is
refused. With a time budget the rounds happen while the time lasts.

The real budget (`real_budget`) is a hard cap on the measurements of the whole run, baselines,
calibration and validation included; a schedule the store already has costs nothing. The
spend is `measured.jsonl`, one line per measurement made. A round plans within its allowance:
what is left, less a reserve for each later round (its core: `round_programs` x (`top_k` +
1) learned schedules and baselines and `track_programs` greedy ones, or an even share of what
is left if that is less). A plan larger than that is
cut in the order of `CUT_ORDER`: validation first, then calibration, heuristic, held-out and
tracked schedules, the learned ones last; within a role, each program's lowest-ranked schedules
first. A program's baseline goes with its last schedule. The cut is printed and recorded in
the round's line of `rounds.jsonl` (`cut`: entries per role; `wanted` and `planned`: the new
measurements of the whole plan and of what was kept; `allowance`). Measuring stops at the cap whatever the plan says (a resumed
round re-measures what a kill lost before its commit, and that counts).

A job with a time budget (the demo) gives the rounds a deadline (`rounds(config, budget,
deadline)`; `RoundMeasurer`): a round starts only if its choosing, some measuring and its
update fit before it, as long as the last round's took, and a round's measuring stops in time
for its update, the least needed programs' measurements left out. Each cut is recorded in
the job's `budget.TimeBudget`, and the round's line counts what it left out (`time_cut`).

The modules: `job` (`Regrounding`, the rounds in order: `run_training`'s `TrainingHook`),
`planner` (the program pools and each round's plan), `plan` (a planned measurement and the cut
to the allowance), `measure` (measuring to the deadline, the phases' times), `update` (scoring
and updating the surrogate, the round's `RoundRow`), `state` (`RoundState`, what the rounds did),
`report` (the table and plots), `config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mlirrl_jax.regrounding.config import RegroundConfig
from mlirrl_jax.util.lazy import lazy_exports

# each name from its module at first use: `regrounding.config` loads without JAX
_EXPORTS = {
    "SELECTIONS": "mlirrl_jax.regrounding.config",
    "UPDATES": "mlirrl_jax.regrounding.config",
    "RegroundConfig": "mlirrl_jax.regrounding.config",
    "uncertain_gain_order": "mlirrl_jax.regrounding.config",
    "anchor_states": "mlirrl_jax.surrogate.adapt",
    "CUT_ORDER": "mlirrl_jax.regrounding.plan",
    "format_rounds": "mlirrl_jax.regrounding.report",
    "Planned": "mlirrl_jax.regrounding.plan",
    "priority": "mlirrl_jax.regrounding.plan",
    "Regrounding": "mlirrl_jax.regrounding.job",
    "save_round_plots": "mlirrl_jax.regrounding.report",
    "surrogate_metrics": "mlirrl_jax.surrogate.adapt",
    "update_refusal": "mlirrl_jax.surrogate.adapt",
    "within_budget": "mlirrl_jax.regrounding.plan",
}
__all__ = sorted(
    [
        *_EXPORTS,
        "RegroundConfig",
        "SELECTIONS",
        "UPDATES",
        "uncertain_gain_order",
        "Rounds",
        "rounds",
    ]
)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


@dataclass(frozen=True)
class Rounds:
    """The `regrounding` argument of `run_training` (`rounds(config)`, an
    `agent.hooks.TrainingHooks`): called with the run's
    folder, whether it resumes, its agent config, training programs and prior, it builds the
    run's `Regrounding` from `config`, or on resume from the config the run started with
    (`config` None); None where there are no rounds."""

    config: RegroundConfig | None
    budget: object = None  # a `budget.TimeBudget`: records what the deadline cut
    deadline: float | None = None  # time.time(): no round starts that would not end by it

    def __call__(self, out: Path, resume: bool, agent_config, train_programs, prior):
        from mlirrl_jax.agent.run import load_programs, training_suites
        from mlirrl_jax.regrounding.job import Regrounding
        from mlirrl_jax.splits import SURROGATE_VALIDATION, TEST

        chosen = self.config
        saved = Path(out) / "regrounding" / "config.json"
        if chosen is None and resume and saved.is_file():
            chosen = RegroundConfig.from_json(json.loads(saved.read_text()))
        if chosen is None or chosen.rounds == 0:
            return None
        return Regrounding(
            out,
            chosen,
            agent_config,
            train_programs,
            load_programs(TEST, ("dl-v0",)),
            load_programs(SURROGATE_VALIDATION, training_suites(agent_config, prior)),
            prior,
            budget=self.budget,
            deadline=self.deadline,
        )


def rounds(config: RegroundConfig | None, budget=None, deadline: float | None = None) -> Rounds:
    """The re-grounding of a training run: `config`'s, or (None) a resumed run's own; with a
    `deadline` (time.time(); `budget`, a `budget.TimeBudget`, records the cuts) the rounds
    end by it (`Regrounding.due`)."""
    return Rounds(config, budget, deadline)
