"""The reports' arithmetic, on rows written by hand: the sample efficiency of the searches."""

from mlirrl_jax.records import ValidationRow
from mlirrl_jax.validation.report import (
    budget_to_match,
    format_sample_efficiency,
    running_best,
    sample_efficiency,
    save_sample_efficiency_plot,
)


def _row(program: str, agent_ms: float, trials: list) -> ValidationRow:
    def method(ms, spent, **more) -> dict:
        return {"ms": ms, "spent": spent, "status": "ok", **more}

    return ValidationRow.from_json(
        {
            "program": program,
            "kind": "matmul",
            "threads": 1,
            "flops": 10**6,
            "kernel_measurements": 6,
            "failed": [],
            "failed_counts": {},
            "unverified": 0,
            "methods": {
                "unscheduled": method(10.0, 0),
                "agent_topk": method(agent_ms, 1),
                "random_8k": method(min(t for t in trials if t), 4, trials_ms=trials),
            },
        }
    )


def test_a_search_is_credited_the_budget_at_which_it_equals_the_agent(tmp_path):
    assert running_best([None, 5.0, 6.0, 2.0]) == [None, 5.0, 5.0, 2.0]
    assert budget_to_match([None, 5.0, 6.0, 2.0], 5.0) == 2  # a failed trial still costs
    assert budget_to_match([4.0, 3.0], 2.5) is None  # never within its budget
    rows = [
        _row("a", 2.0, [4.0, 2.0, 1.0, 3.0]),  # matched at 2
        _row("b", 1.0, [5.0, 4.0, 2.0, 2.0]),  # never matched
        _row("c", 5.0, [5.0, 9.0, 9.0, 9.0]),  # matched at once
    ]
    found = sample_efficiency(rows, (1, 2))
    assert list(found) == ["1"]  # no row at two threads
    e = found["1"]["random_8k"]
    assert e["budget"] == 4 and e["matched"] == 2
    assert e["budget_to_match"] == {"a": 2, "b": None, "c": 1}
    assert e["median_budget_to_match"] == 2  # of 1, 2 and beyond the budget (5)
    # best-of-n speedups: a 10/4 -> 10/2 -> 10/1, b 10/5 -> 10/4 -> 10/2, c 10/5 throughout
    assert abs(e["curve"][0] - (2.5 * 2.0 * 2.0) ** (1 / 3)) < 1e-9
    assert abs(e["curve"][2] - (10.0 * 5.0 * 2.0) ** (1 / 3)) < 1e-9
    assert abs(e["agent_topk"] - (5.0 * 10.0 * 2.0) ** (1 / 3)) < 1e-9
    table = "\n".join(format_sample_efficiency(found, 8))
    assert "| 1 | random 8k | 3 | 4 | 2 | 2 |" in table
    assert save_sample_efficiency_plot(found, tmp_path).is_file()
    assert sample_efficiency([], (1,)) == {} and format_sample_efficiency({}, 8) == []
