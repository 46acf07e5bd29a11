"""The agent starting from what is known: forced actions in the jitted episodes, refinements of
the heuristic's schedule, and the proposals that mix them with the agent's own."""

import jax
import numpy as np
import pytest

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.agent.refine import CHANGES, forced_refinements, refinement
from mlirrl_jax.env.replay import schedule_to_actions
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.shipped import SHIPPED_AGENT


@pytest.fixture(scope="module")
def agent():
    if not (SHIPPED_AGENT / "checkpoints").is_dir():
        pytest.skip("no shipped agent in data/agent")
    return Agent.load(SHIPPED_AGENT)


@pytest.fixture(scope="module")
def evaluator(agent, kernel_programs):
    return agent.evaluator(kernel_programs[:4], threads=1)


def test_every_change_keeps_the_reference_elsewhere():
    reference = [np.full(10, i, np.int32) for i in range(1, 6)]
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(200):
        forced, free_at = refinement(reference, rng)
        if free_at >= 0:  # replace: the reference, one step left to the policy
            assert [a[0] for a in forced] == [1, 2, 3, 4, 5]
            seen.add("replace")
        elif len(forced) == 4 and [a[0] for a in forced] != [1, 2, 3, 4]:
            seen.add("drop")  # one action left out, the others in order
            assert sorted(a[0] for a in forced) == [a[0] for a in forced]
        elif len(forced) == 5:
            changed = [i for i in range(5) if not np.array_equal(forced[i], reference[i])]
            assert len(changed) == 1  # shift: one tile choice of one action
            assert np.sum(forced[changed[0]] != reference[changed[0]]) == 1
            seen.add("shift")
        else:
            assert all(np.array_equal(a, b) for a, b in zip(forced, reference))  # truncate
            seen.add("truncate")
    assert seen == set(CHANGES)
    assert refinement([], rng) == ([], -1)


def test_forced_actions_replace_the_policys_and_the_rest_is_sampled(agent, evaluator):
    """Episodes forced along the greedy episodes' legal actions end on exactly the greedy
    schedules, whatever the sampling policy would have chosen; forced along their first
    action only, they go on with the policy's own choices."""
    size = 256  # the batch of `proposals` on these four programs: one compiled runner for both
    rows = np.resize(np.arange(len(evaluator.programs), dtype=np.int32), size)
    reward_params = evaluator.prepare(agent.surrogate.params)
    greedy = evaluator.episodes(agent.params, reward_params, rows, jax.random.PRNGKey(0), True)
    steps = np.asarray(greedy.steps)
    references = [list(np.asarray(greedy.actions)[i, : steps[i]]) for i in range(size)]
    forced = forced_refinements([[]] * size, 1, size)
    actions = np.asarray(forced.actions).copy()
    for i, r in enumerate(references):
        actions[i, : len(r)] = np.stack(r)
    whole = forced.replace(actions=actions, length=steps.astype(np.int32))
    first = forced.replace(actions=actions, length=np.ones(size, np.int32))
    hot = 4.0  # a flat policy: unforced, it would wander off the greedy episodes
    got = evaluator.guided_episodes(
        agent.params, reward_params, rows, whole, jax.random.PRNGKey(3), hot
    )
    assert np.array_equal(np.asarray(got.steps), steps)
    assert np.array_equal(np.asarray(got.actions), np.asarray(greedy.actions))
    loose = evaluator.guided_episodes(
        agent.params, reward_params, rows, first, jax.random.PRNGKey(3), hot
    )
    assert np.array_equal(np.asarray(loose.actions)[:, 0], np.asarray(greedy.actions)[:, 0])
    assert not np.array_equal(np.asarray(loose.actions), np.asarray(greedy.actions))


def test_proposals_start_from_the_heuristics_schedule_and_its_refinements(agent, evaluator):
    n = 8
    own = agent.scored_schedules(None, n=n, evaluator=evaluator)
    known = agent.proposals(None, n, "known", evaluator=evaluator, own=own)
    scratch = agent.proposals(None, n, "scratch", evaluator=evaluator, own=own)
    assert scratch == own
    for program, mixed, mine in zip(evaluator.programs, known, own):
        hashes = [s.schedule.hash for s in mixed]
        assert len(hashes) == len(set(hashes)) == n
        origins = [s.origin for s in mixed]
        heuristic = heuristic_schedule(program, 1)
        assert origins.count("heuristic") == 1
        assert next(s for s in mixed if s.origin == "heuristic").schedule.hash == heuristic.hash
        assert origins.count("refined") >= 1 and origins.count("agent") >= 1
        assert {s.schedule.hash for s in mixed if s.origin == "agent"} <= {
            s.schedule.hash for s in mine
        }
        for s in mixed:
            if s.origin == "refined":  # in the action space: its sizes are offered ones
                assert schedule_to_actions(program, s.schedule)
                assert s.schedule.hash != heuristic.hash
        predicted = [s.predicted_speedup for s in mixed]
        assert predicted == sorted(predicted, reverse=True)
    with pytest.raises(ValueError, match="start 'both'"):
        agent.proposals(None, n, "both", evaluator=evaluator)
