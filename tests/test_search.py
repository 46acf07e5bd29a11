"""The evolutionary search: it spends exactly its budget of real measurements, each of a
distinct schedule that the environment's masks allow, and refines its surrogate between
generations."""

import jax.numpy as jnp
import pytest

from mlirrl_jax.env.jax_env import transition
from mlirrl_jax.env.replay import schedule_to_actions
from mlirrl_jax.env.state import initial_state
from mlirrl_jax.search import EvolutionarySearch, EvolutionConfig, SearchError


@pytest.fixture(scope="module")
def surrogate():
    from mlirrl_jax.shipped import SHIPPED_SURROGATE
    from mlirrl_jax.surrogate.api import CostModel

    return CostModel.load(SHIPPED_SURROGATE)


def passes_the_masks(search: EvolutionarySearch, schedule) -> bool:
    """The schedule's exact action sequence, stepped through the environment: no action is
    one a mask forbids, and the episode ends."""
    lanes = search.profile.vector_lanes if search.profile is not None else None
    state = initial_state(search.table, jnp.int32(0), jnp.zeros(2, jnp.uint32))
    for action in schedule_to_actions(search.program, schedule, lanes):
        state, invalid, _ = transition(search.table, state, jnp.asarray(action, jnp.int32))
        if bool(invalid):
            return False
    return bool(state.done)


def test_the_search_spends_exactly_its_budget_on_distinct_legal_schedules(
    mm_bias_relu, runner, surrogate
):
    config = EvolutionConfig(budget=7, batch=3, candidates=12, parents=2, update_epochs=2)
    search = EvolutionarySearch(mm_bias_relu, surrogate, threads=1, config=config)
    calls = []

    def measure(schedule):
        calls.append(schedule)
        return runner.measure(mm_bias_relu, schedule)

    baseline = runner.measure(mm_bias_relu, None)
    result = search.run(measure, baseline=baseline)
    assert len(calls) == len(result.trials) == 7
    assert len({s.hash for s in calls}) == 7 and all(not s.is_empty for s in calls)
    assert result.trials[0].origin == "heuristic"
    assert {t.generation for t in result.trials} == {0, 1, 2}  # 1 + 3 + 3
    assert all(passes_the_masks(search, s) for s in calls)
    assert result.best is not None and result.best.measurement.verified
    assert all(t.predicted_speedup > 0 for t in result.trials)
    assert result.updates == 1  # between the two generations, never after the last one
    assert search.surrogate is not surrogate  # fine-tuned from the prior
    assert search.surrogate.lineage[-1]["rows"] == 1 + 4  # the baseline and the verified trials


def test_a_failed_measurement_is_spent_and_recorded(mm_bias_relu, runner, surrogate):
    """Every second measurement is replaced by a timeout (a fake that injects the fault): the
    budget counts it, the result keeps it, the best is among the real ones."""
    from dataclasses import replace

    count = []

    def measure(schedule):
        count.append(1)
        real = runner.measure(mm_bias_relu, schedule)
        if len(count) % 2:
            return real
        return replace(real, status="timeout", median_s=None, verified=False, error="injected")

    config = EvolutionConfig(budget=5, batch=2, candidates=8, update_epochs=0)
    result = EvolutionarySearch(mm_bias_relu, surrogate, config=config).run(measure)
    assert len(result.trials) == 5 and result.failed == 2
    assert [t.measurement.status for t in result.trials][1::2] == ["timeout", "timeout"]
    assert result.best in result.trials[0::2] and result.best.measurement.verified


@pytest.mark.parametrize(
    "bad", [{"budget": 0}, {"batch": 0}, {"candidates": 2, "batch": 4}, {"fresh_share": 1.5}]
)
def test_a_configuration_that_cannot_run_is_refused_by_name(bad):
    with pytest.raises(SearchError, match=next(iter(bad))):
        EvolutionConfig(**bad)


def test_known_schedules_are_parents_and_their_one_thread_ops_are_split(
    mm_bias_relu, runner, surrogate
):
    """Schedules measured before (the agent's) are not measured again nor counted; at two
    threads the search first measures them with each op left on one thread split over the
    threads (`split_schedule_over_threads`), a schedule the masks allow."""
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.search import split_schedule_over_threads

    one_thread = heuristic_schedule(mm_bias_relu, threads=1)
    assert all(t.kind != "tile_parallel" for entry in one_thread.ops for t in entry.transforms)
    split = split_schedule_over_threads(mm_bias_relu, one_thread, 2)
    assert split is not None and split_schedule_over_threads(mm_bias_relu, one_thread, 1) is None
    assert any(t.kind == "tile_parallel" for entry in split.ops for t in entry.transforms)
    known = [(one_thread, runner.measure(mm_bias_relu, one_thread, threads=2))]
    calls = []

    def measure(schedule):
        calls.append(schedule)
        return runner.measure(mm_bias_relu, schedule, threads=2)

    config = EvolutionConfig(budget=3, batch=2, candidates=8, update_epochs=0)
    search = EvolutionarySearch(mm_bias_relu, surrogate, threads=2, config=config)
    result = search.run(measure, known=known)
    assert len(calls) == len(result.trials) == 3
    assert one_thread.hash not in {s.hash for s in calls}  # known: not measured again
    assert result.trials[0].origin == "split" and calls[0].hash == split.hash
    assert result.trials[0].measurement.verified
    assert all(passes_the_masks(search, s) for s in calls)
