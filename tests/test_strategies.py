"""The strategy layer: one `Method` per strategy, typed trials, each distinct schedule of a
program measured once however many methods propose it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.strategies import (
    Candidate,
    Measured,
    Method,
    Strategy,
    best_trial,
    measure_candidates,
    parse_methods,
    registry,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_method_has_one_strategy_with_its_own_label():
    strategies = registry()
    assert list(strategies) == list(Method)
    for method, strategy in strategies.items():
        assert isinstance(strategy, Strategy) and strategy.method is method
    labels = [s.label for s in strategies.values()]
    assert len(set(labels)) == len(labels)
    # the searches compared with the agent, and those whose trials make a curve
    assert {m for m, s in strategies.items() if s.baseline} == {
        Method.HEURISTIC,
        Method.RANDOM_8K,
        Method.EVOLUTIONARY,
    }
    assert [m for m, s in strategies.items() if s.searches] == [Method.EVOLUTIONARY]


def test_a_strategy_is_one_module_and_one_method():
    """No strategy module is named outside the package (`base`, JAX-free, is the layer's
    interface): registering `refined` is all it takes for validation to measure it (`also`)
    and for the reports to label it."""
    named = []
    for path in (ROOT / "mlirrl_jax").rglob("*.py"):
        if path.parent.name == "strategies":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            module = getattr(node, "module", None) or ""
            if (
                module.startswith("mlirrl_jax.strategies.")
                and module != "mlirrl_jax.strategies.base"
            ):
                named.append((path.name, node.module))
    assert named == []
    assert not registry()[Method.REFINED_TOPK].default


def test_method_names_are_checked_before_anything_runs():
    from mlirrl_jax.validation.config import ValidationConfig

    assert parse_methods("refined_topk, random_k") == (Method.REFINED_TOPK, Method.RANDOM_K)
    assert parse_methods("") == ()
    with pytest.raises(ConfigError, match="unknown method.*nope.*expected some of"):
        parse_methods("random_k,nope")
    with pytest.raises(ValueError, match="nope"):
        ValidationConfig(also="nope")


@pytest.mark.measures
def test_each_distinct_schedule_is_measured_once_and_credited_to_every_method(matmul, runner):
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.measure.timing import TimingMethod
    from mlirrl_jax.schedule import Schedule

    heuristic = heuristic_schedule(matmul, 1)
    other = Schedule.from_json({**heuristic.to_json(), "ops": heuristic.to_json()["ops"][:0]})
    calls = []
    measured = Measured.on(runner, matmul, 1, TimingMethod(seed=0))
    counted = Measured(lambda s: calls.append(s.hash) or measured(s))
    lines = []
    trials = measure_candidates(
        counted,
        {
            Method.HEURISTIC: [Candidate(heuristic, 2.0, "heuristic")],
            Method.AGENT_TOPK: [Candidate(other, 1.0), Candidate(heuristic, 3.0, "heuristic")],
        },
        say=lines.append,
    )
    assert sorted(calls) == sorted({heuristic.hash, other.hash})  # each once
    top = trials[Method.AGENT_TOPK]
    assert [t.rank for t in top] == [1, 2] and top[1].measurement is trials[Method.HEURISTIC][
        0
    ].measurement
    assert [t.source for t in top] == ["agent 1", "agent 2, heuristic"]
    assert trials[Method.HEURISTIC][0].source == "heuristic"
    assert best_trial(top).seconds == min(t.seconds for t in top if t.seconds)
    assert len(lines) == 3 and lines[0].startswith("  heuristic (predicted 2.00x): ")
    assert lines[1].startswith("  agent 1/2 (predicted 1.00x): ")
    with pytest.raises(ConfigError, match="search context"):
        measure_candidates(counted, {}, [Method.EVOLUTIONARY])
