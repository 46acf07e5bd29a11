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
- `refined_topk` (not by default: `also="refined_topk"`): the surrogate's k best refinements
  of the heuristic's schedule, without the agent's own episodes;
- `xla`: XLA:CPU through `jax.jit` on the same computation and thread count, output buffer
  donated and reused (`mlirrl_jax.measure.baselines`);
- `numpy`: NumPy's matmul with BLAS on the same threads (matmuls only).

Each method is a strategy of `mlirrl_jax.strategies`, its name a `Method`. Every schedule is
chosen first (JAX work), then every measurement runs in one worker, one at a
time, so no JAX work shares the cores with a timed kernel. Results are appended per (program,
thread count) to `validation.jsonl` as they come: a killed validation run again with the same
folder goes on where it stopped. A program is known there by the hash of its content, and one
that changed under the same name is refused, both hashes named. The report is `validation.md`
and `validation.json` beside it, the plots `validation_speedups.png`, `validation_cdf.png`,
`validation_predicted.png`, and every measured method's best schedule is saved under
`validation/schedules/` (each program that is not a suite's under `validation/programs/`),
replayable with the `mlirrl-jax measure` command the report prints. Every file but the
appended `validation.jsonl` is written whole or not at all; a line of it cut short (a kill, a
full disk) is cut off before the next run appends to it.
"""

from mlirrl_jax.util.lazy import lazy_exports

# each name from its module at first use: `validation.config` loads without JAX
_EXPORTS = {
    "agents_line": "mlirrl_jax.validation.tables",
    "format_validation": "mlirrl_jax.validation.tables",
    "MATMUL_KINDS": "mlirrl_jax.validation.config",
    "Plan": "mlirrl_jax.validation.plan",
    "save_schedules": "mlirrl_jax.validation.tables",
    "SEARCHES": "mlirrl_jax.validation.report",
    "summarize": "mlirrl_jax.validation.summary",
    "Validation": "mlirrl_jax.validation.job",
    "validation_methods": "mlirrl_jax.validation.plan",
    "ValidationConfig": "mlirrl_jax.validation.config",
    "ValidationError": "mlirrl_jax.validation.config",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
