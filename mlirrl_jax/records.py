"""Typed records of the jobs' results, each with `to_json` / `from_json`: what `optimize`
writes as `summary.json` (`OptimizeSummary`), what a surrogate's fit reports (`FitResult`),
the validation's rows (`ValidationRow`, one `MethodResult` per method) and the
re-grounding rounds (`RoundRow`). Reading a file written before a field existed leaves it at its default;
a field this code does not know is refused, naming it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from mlirrl_jax.errors import ConfigError


class Record:
    """`to_json` / `from_json` for a dataclass of JSON values (and lists of records, named
    in `_NESTED`, or dicts of them, named in `_NESTED_DICTS`)."""

    _NESTED: dict = {}
    _NESTED_DICTS: dict = {}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown fields {unknown}")
        values = dict(data)
        for name, kind in cls._NESTED.items():
            if values.get(name) is not None:
                values[name] = [kind.from_json(item) for item in values[name]]
        for name, kind in cls._NESTED_DICTS.items():
            if values.get(name) is not None:
                values[name] = {k: kind.from_json(item) for k, item in values[name].items()}
        return cls(**values)


@dataclass(frozen=True)
class Ranked(Record):
    """One verified schedule of an `optimize` run, by its time."""

    source: str  # "heuristic", "agent 3", "evolutionary 12"
    ms: float
    over_best: float  # its time over the best's: 1 for the best
    speedup: float | None  # over the unscheduled program (None: that one ran over the limit)


@dataclass(frozen=True)
class OptimizeSummary(Record):
    """`optimize`'s `summary.json`: the best verified schedule of a kernel and how it ranks."""

    program: str
    verified: bool  # False: no schedule verified (the fields of the best are then None)
    measurements: int  # kernels measured, the unscheduled one included
    baseline_ms: float | None  # None: the unscheduled run failed or ran over the limit
    baseline_note: str | None
    heuristic_ms: float | None
    best_ms: float | None = None
    best_source: str | None = None
    speedup: float | None = None  # over the unscheduled program
    over_heuristic: float | None = None
    gflops: float | None = None
    max_error: float | None = None
    schedule: str | None = None  # the best schedule, described
    ranking: list[Ranked] = field(default_factory=list)
    replay: str | None = None  # the command that measures the best schedule again
    machine_id: str | None = None
    agent: str | None = None
    threads: int = 1

    _NESTED = {"ranking": Ranked}


@dataclass(frozen=True)
class HeldOutScores(Record):
    """A surrogate scored on the held-out (surrogate-validation) programs of a store: each
    score a `mlirrl_jax.surrogate.metrics.evaluate` dict (MAPE of speedup, Spearman, pairwise accuracy,
    top-1, top-5, counts)."""

    machine_id: str | list[str]
    held_out_programs: int
    held_out_rows: int
    surrogate: dict
    analytic_baseline: dict  # the analytic model's scores on the same rows
    surrogate_by_family: dict = field(default_factory=dict)  # per model family of programs


@dataclass(frozen=True)
class FitResult(HeldOutScores):
    """`fit-cost-model`'s `metrics.json`: the held-out scores and how the fit went."""

    command: str = ""
    store: str = ""
    machines: list[str] = field(default_factory=list)
    thread_counts: list[int] = field(default_factory=list)
    rows: int = 0
    train_rows: int = 0
    test_rows_left_out: int = 0  # test-split rows of the store, in neither set
    splits_version: int = 0
    fit_seconds: float = 0.0
    total_seconds: float = 0.0
    surrogate_on_training_programs: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # per epoch or step block: losses


@dataclass
class MethodResult(Record):
    """One method's result on one program at one thread count in a validation: its best
    verified time, or why it has none."""

    ms: float | None  # None: no verified result (`status` says why)
    spent: int  # real measurements of schedules it used
    status: str  # "ok", "no verified schedule", "unverified", a failure, ...
    predicted: float | None = None  # the surrogate's predicted speedup of its best schedule
    schedule: dict | None = None  # its best schedule
    trials_ms: list | None = None  # a search's trials, verified times in the order measured


@dataclass
class ValidationRow(Record):
    """`validate`'s result on one program at one thread count: a line of `validation.jsonl`."""

    program: str
    kind: str  # the op kind (`programs.select.program_kind`)
    threads: int
    flops: int
    kernel_measurements: int  # kernels measured for this row (the unscheduled one included once)
    failed: list[str]  # the statuses of the candidates that failed
    failed_counts: dict  # status -> candidates
    unverified: int  # candidates that ran but were not verified
    methods: dict[str, MethodResult]  # "unscheduled", the methods measured, "xla", "numpy"
    machine_id: str = ""
    program_hash: str = ""  # what a rerun resumes by: the program's content, not its name

    _NESTED_DICTS = {"methods": MethodResult}


@dataclass
class RoundRow(Record):
    """One re-grounding round: a line of `rounds.jsonl`. Each `*_before`, `*_after`,
    `*_prior`, `*_scratch` and `validation*` field is a `surrogate.metrics.evaluate` dict (the
    surrogate, the prior not fine-tuned, or trees fitted from scratch, on the same rows), None
    where the round had no rows to score it on."""

    round: int
    spent: int = 0  # the run's measurements so far
    measured_now: int = 0  # this round's new measurements
    machine_id: str = ""
    programs: int = 0  # training programs the round learned from
    held_back_programs: int = 0
    held_back: list = field(default_factory=list)  # by name: the update never saw their rows
    selection: str = ""
    update: str = ""
    on_policy_before: dict | None = None  # the schedules just measured, before the update
    on_policy_prior: dict | None = None
    on_policy_scratch: dict | None = None
    update_seconds: float | None = None
    update_rows: int | None = None
    held_back_before: dict | None = None
    held_back_after: dict | None = None
    held_back_prior: dict | None = None
    held_back_scratch: dict | None = None
    update_refused: bool = False  # the held-back error grew: the previous weights kept
    refusal: str | None = None  # why
    validation: dict | None = None  # this machine's surrogate-validation programs
    validation_prior: dict | None = None
    validation_scratch: dict | None = None
    real_track_geomean: float | None = None  # real speedups of the agent's greedy schedules
    real_track_programs: int | None = None
    real_heldout_geomean: float | None = None
    real_heldout_programs: int | None = None
    real_heuristic_geomean: float | None = None
    real_heuristic_programs: int | None = None
    heldout_over_heuristic: float | None = None
    allowance: int | None = None  # the round's plan within the run's real budget
    wanted: int | None = None
    planned: int | None = None
    cut: dict | None = None
    time_cut: int | None = None  # planned measurements left out at the job's deadline
