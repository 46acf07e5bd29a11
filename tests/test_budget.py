"""The time budget a job plans to: deadlines as shares of it, what is left, and the cuts a
report shows."""

import json
import time

import pytest

from mlirrl_jax.budget import TimeBudget


def test_a_budget_gives_deadlines_and_records_its_cuts_in_order(tmp_path):
    budget = TimeBudget(120.0, started=time.time() - 30.0)
    assert budget.elapsed() == pytest.approx(30.0, abs=1.0)
    assert budget.left() == pytest.approx(90.0, abs=1.0)
    assert budget.at(0.5) == pytest.approx(budget.started + 60.0)
    assert budget.left(budget.at(0.5)) == pytest.approx(30.0, abs=1.0)
    assert budget.left(time.time() - 5.0) == 0.0  # a passed deadline leaves nothing
    assert "Nothing was cut for time." in budget.summary()
    budget.mark("adapted")
    budget.cut("re-grounding", "round 2 of 2", "20 s left, a round needs about 70 s")
    budget.cut("validation", "1 of 6 programs: relu (1t)", "30 s each, 10 s left")
    text = budget.summary()
    assert "Time budget 2.0 min" in text and "adapted at 30 s" in text
    assert text.index("round 2 of 2") < text.index("relu (1t)")
    budget.save(tmp_path / "budget.json")
    saved = json.loads((tmp_path / "budget.json").read_text())
    assert saved["seconds"] == 120.0 and saved["marks"] == {"adapted": 30.0}
    assert [c["phase"] for c in saved["cuts"]] == ["re-grounding", "validation"]


def test_a_budget_refuses_what_is_not_a_budget():
    with pytest.raises(ValueError, match="positive"):
        TimeBudget(0.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        TimeBudget(60.0).at(1.5)
