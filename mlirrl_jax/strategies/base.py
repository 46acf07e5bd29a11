"""What a search strategy is, and the one loop that measures what strategies choose.

A strategy is known by its `Method` (the name its results carry in every report). It either
proposes candidates before any measurement (`propose`, for a batch of programs at once: the
agent's and the surrogate's work is batched), or measures as it goes (`search`, one program,
each measurement chosen from the ones before). `measure_candidates` measures each distinct
schedule of one program once, credits every method with its own trials and runs the searches
last, each starting from what the others measured.

This module imports neither JAX nor MLIR: configs check method names against `Method` before
anything starts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from mlirrl_jax.errors import ConfigError


class Method(enum.StrEnum):
    """Every strategy's name, as reports and `validation.jsonl` write it; the order is the
    reports' order. A new strategy adds a member here and a module in this package."""

    HEURISTIC = "heuristic"
    AGENT_GREEDY = "agent_greedy"
    AGENT_TOPK = "agent_topk"
    AGENT_SCRATCH_TOPK = "agent_scratch_topk"
    RANDOM_K = "random_k"
    RANDOM_8K = "random_8k"
    SURROGATE_TOPK = "surrogate_topk"
    EVOLUTIONARY = "evolutionary"
    REFINED_TOPK = "refined_topk"


def parse_methods(text: str) -> tuple[Method, ...]:
    """Comma-separated method names (`--also`), each checked against `Method`."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in Method.__members__.values()]
    if unknown:
        raise ConfigError(
            f"unknown method(s) {', '.join(unknown)}: expected some of "
            f"{', '.join(m.value for m in Method)}"
        )
    return tuple(Method(n) for n in names)


@dataclass(frozen=True)
class Candidate:
    """A schedule a strategy chose, with the surrogate's predicted speedup over the
    unscheduled program where it has one, and where it came from within the strategy
    ("refined": a refinement of the heuristic's schedule among the agent's proposals)."""

    schedule: Any  # mlirrl_jax.schedule.Schedule
    predicted: float | None = None
    origin: str = ""


@dataclass(frozen=True)
class Trial:
    """A candidate measured for a method; `rank` counts from 1 in the method's order."""

    method: Method
    rank: int
    candidate: Candidate
    measurement: Any  # mlirrl_jax.measure.timing.Measurement

    @property
    def schedule(self):
        return self.candidate.schedule

    @property
    def seconds(self) -> float | None:
        """The verified median, else None (a failure, a wrong output or no time)."""
        m = self.measurement
        return m.median_s if m.ok and m.verified and m.median_s else None

    @property
    def source(self) -> str:
        """How a report names it: "heuristic", "agent 3, refined", "evolutionary 12"."""
        return self.name()

    def name(self, total: int | None = None) -> str:
        """`source`, with "/total" after the rank where given."""
        strategy = registry()[self.method]
        if strategy.single:
            return strategy.noun
        origin = self.candidate.origin
        shown = "" if origin in ("", strategy.noun) else f", {origin}"
        of = "" if total is None else f"/{total}"
        return f"{strategy.noun} {self.rank}{of}{shown}"


@dataclass
class Proposing:
    """What strategies propose from, for a batch of programs at one thread count, before any
    measurement: the agent (and its surrogate) where there is one, the budget k, and work the
    strategies share (`once`: the agent's evaluator, its own episodes, random draws)."""

    programs: list
    threads: int
    budget: int
    seed: int = 0
    agent: Any = None  # mlirrl_jax.agent.agent.Agent
    start: str = "known"  # the agent's top-k: "known" or "scratch" (Agent.proposals)
    random_factor: int = 8
    guided_samples: int = 256
    shared: dict = field(default_factory=dict)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]

    def needs_agent(self, method: Method):
        if self.agent is None:
            raise ConfigError(f"{method.value} needs an agent")
        return self.agent


@dataclass
class Searching:
    """What a strategy that measures as it goes is given, for one program: its budget of
    measurements, the unscheduled run, the cost model it starts from (None: none loaded)."""

    program: Any
    threads: int
    budget: int
    seed: int = 0
    base: Any = None  # the unscheduled program's Measurement
    surrogate: Any = None  # mlirrl_jax.surrogate.api.CostModel
    say: Callable[[str], None] | None = None


@runtime_checkable
class Strategy(Protocol):
    """A way to choose schedules. `spends`: its measurements are credited to it (False: it
    chooses with none, and is measured only to be scored); `curve`: its trials in order make
    a sample-efficiency curve; `single`: it has one schedule (its trial is named `noun` alone);
    `default`: validation measures it unless told otherwise; `baseline`: what a user could have
    had without the agent (the reports compare the agent with these); `searches`: it measures as it goes
    (`search`), else it proposes before any measurement (`propose`)."""

    method: ClassVar[Method]
    label: ClassVar[str]
    noun: ClassVar[str]
    spends: ClassVar[bool]
    curve: ClassVar[bool]
    single: ClassVar[bool]
    default: ClassVar[bool]
    baseline: ClassVar[bool]
    searches: ClassVar[bool]

    def propose(self, ctx: Proposing) -> list[list[Candidate]]: ...

    def search(
        self, ctx: Searching, measure: Callable, known: list[Trial]
    ) -> list[tuple[Candidate, Any]]: ...


class Proposer:
    """A strategy that chooses before any measurement: override `propose`."""

    spends, curve, single, default, searches = True, False, False, True, False
    baseline = False

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        raise NotImplementedError

    def search(self, ctx: Searching, measure: Callable, known: list[Trial]) -> list:
        return []


class Searcher:
    """A strategy that measures as it goes: override `search`, which returns its (candidate,
    measurement) pairs in the order measured, through `measure` (each distinct schedule of
    the program measured once: a known one is not measured again)."""

    spends, curve, single, default, searches = True, True, False, True, True
    baseline = False

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        return [[] for _ in ctx.programs]

    def search(self, ctx: Searching, measure: Callable, known: list[Trial]) -> list:
        raise NotImplementedError


_REGISTRY: dict[Method, Strategy] = {}


def register(cls):
    """Class decorator: the strategy of its `method` (one per method)."""
    if cls.method in _REGISTRY:
        raise ConfigError(f"two strategies for {cls.method.value}")
    _REGISTRY[cls.method] = cls()
    return cls


def registry() -> dict[Method, Strategy]:
    """Every strategy, in `Method`'s order (the package's modules are imported on first use)."""
    if len(_REGISTRY) < len(Method):
        import importlib
        import pkgutil

        import mlirrl_jax.strategies as package

        for info in pkgutil.iter_modules(package.__path__):
            if info.name != "base":
                importlib.import_module(f"{package.__name__}.{info.name}")
        missing = [m.value for m in Method if m not in _REGISTRY]
        if missing:
            raise ConfigError(f"no strategy module for method(s) {', '.join(missing)}")
    return {m: _REGISTRY[m] for m in Method}


class Measured:
    """One program's measurements at one thread count, each distinct schedule once: calling it
    measures a schedule (or returns the measurement it already has)."""

    def __init__(self, measure_one: Callable):
        self._measure_one = measure_one
        self.by_hash: dict[str, Any] = {}

    @classmethod
    def on(cls, runner, program, threads: int, method, **limits) -> Measured:
        """`runner`'s measurements of `program`'s schedules at `threads` (`limits`: e.g.
        `timeout_s`) with the timing method `method`."""
        return cls(lambda s: runner.measure(program, s, threads=threads, method=method, **limits))

    def know(self, schedule, measurement):
        """A measurement made before (read back from a file): not measured again. Returns
        the schedule."""
        self.by_hash[schedule.hash] = measurement
        return schedule

    def __call__(self, schedule):
        if schedule.hash not in self.by_hash:
            self.by_hash[schedule.hash] = self._measure_one(schedule)
        return self.by_hash[schedule.hash]


def measure_candidates(
    measured: Measured,
    proposals: dict[Method, list[Candidate]],
    searches: Iterable[Method] = (),
    ctx: Searching | None = None,
    known_from: Iterable[Method] | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[Method, list[Trial]]:
    """Every method's trials on one program: each method's candidates measured in its order
    (a schedule another method measured is not measured again), then each search in `searches`
    given the trials of `known_from` (None: all before it) as its first parents. `say`: a line
    per measurement."""
    strategies = registry()
    trials: dict[Method, list[Trial]] = {}
    for method, candidates in proposals.items():
        trials[method] = []
        for rank, candidate in enumerate(candidates, 1):
            trial = Trial(method, rank, candidate, measured(candidate.schedule))
            trials[method].append(trial)
            if say:
                say(_line(trial, len(candidates)))
    for method in searches:
        if ctx is None:
            raise ConfigError(f"{method.value} searches: it needs a search context")
        sources = list(trials) if known_from is None else list(known_from)
        known = [t for m in sources for t in trials.get(m, [])]
        found = strategies[method].search(ctx, measured, known)
        trials[method] = [Trial(method, i, c, m) for i, (c, m) in enumerate(found, 1)]
    return trials


def _line(trial: Trial, total: int) -> str:
    m, c = trial.measurement, trial.candidate
    predicted = "" if c.predicted is None else f" (predicted {c.predicted:.2f}x)"
    note = "" if m.verified or not m.ok else " NOT VERIFIED"
    return f"  {trial.name(total)}{predicted}: {m.summary()}{note}"


def best_trial(trials: Iterable[Trial]) -> Trial | None:
    """The fastest verified trial, else None."""
    good = [t for t in trials if t.seconds is not None]
    return min(good, key=lambda t: t.seconds) if good else None
