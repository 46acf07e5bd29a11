"""Schedules as data: JSON round trip, stable hash, clear errors."""

import json

import pytest

from mlirrl_jax.schedule import Schedule, ScheduleError, Transform
from mlirrl_jax.transform import transform_script

SCHEDULE = Schedule.of(
    [
        (2, [Transform("tile_fuse", (32, 0))]),
        (
            1,
            [
                Transform("interchange", permutation=(1, 0, 2)),
                Transform("tile", (8, 32, 1)),
                Transform("vectorize"),
            ],
        ),
    ]
)


def test_json_round_trip_and_stable_hash(tmp_path):
    path = tmp_path / "s.json"
    SCHEDULE.save(path)
    again = Schedule.load(path)
    assert again == SCHEDULE and again.hash == SCHEDULE.hash
    # the hash is of canonical JSON: it does not depend on formatting or key order
    data = json.loads(path.read_text())
    assert Schedule.loads(json.dumps(data, indent=4, sort_keys=False)).hash == SCHEDULE.hash
    assert SCHEDULE.hash == "9e8e390ec6330857"  # pinned: stored measurements are keyed by it


def test_hash_changes_with_content():
    other = Schedule.of([(2, [Transform("tile_fuse", (16, 0))])])
    assert other.hash != SCHEDULE.hash
    assert Schedule().hash == Schedule.of([]).hash


@pytest.mark.parametrize(
    "text, words",
    [
        ("not json", "not valid JSON"),
        ('{"ops": [{"op": 1, "transforms": [{"kind": "unroll"}]}]}', "unknown transformation kind"),
        ('{"ops": [{"op": 1, "transforms": [{"kind": "tile"}]}]}', "needs tile sizes"),
        ('{"ops": [{"op": 1, "transforms": [{"kind": "tile", "sizes": [-1]}]}]}', "negative"),
        ('{"ops": [{"op": 1}]}', "missing or wrong field"),
        ('{"format": 9, "ops": []}', "format 9"),
        ('{"ops": [{"op": 1, "transforms": []}, {"op": 1, "transforms": []}]}', "appears twice"),
        (
            '{"ops": [{"op": 1, "transforms": [{"kind": "interchange", "permutation": [0, 0]}]}]}',
            "not a permutation",
        ),
    ],
)
def test_malformed_schedules_are_refused(text, words):
    with pytest.raises(ScheduleError, match=words):
        Schedule.loads(text)


def test_script_tiles_in_original_loop_order_after_interchange(matmul):
    # matmul loops (i=64, j=96, k=128); after interchange (k, i, j) the tile sizes given per
    # original loop must land on the permuted loops
    schedule = Schedule.of(
        {1: [Transform("interchange", permutation=(2, 0, 1)), Transform("tile", (8, 32, 4))]}
    )
    script = transform_script(matmul, schedule)
    assert "iterator_interchange = [2, 0, 1]" in script
    assert "tile_sizes [4, 8, 32]" in script


def test_full_extent_tiles_make_no_loop(matmul):
    script = transform_script(matmul, Schedule.of({1: [Transform("tile", (64, 32, 128))]}))
    assert "tile_sizes [0, 32, 0]" in script


def test_a_forall_that_splits_no_loop_is_refused(matmul):
    # the sizes reach the loops' extents (64, 96): nothing to run in parallel; MLIR crashed
    with pytest.raises(ScheduleError, match="splits no loop"):
        transform_script(matmul, Schedule.of({1: [Transform("tile_parallel", (64, 96, 0))]}))


def test_each_kind_is_named_once_and_keeps_its_action_index():
    # trained policies read the kind head by index (ACTION_SPACE_VERSION 3): a new kind is
    # appended, and the names are what schedules' JSON holds
    from mlirrl_jax.actions import GRAMMAR, KIND_NAMES, NEXT
    from mlirrl_jax.schedule import KINDS, Kind

    assert KIND_NAMES == (
        "next",
        "tile_parallel",
        "tile_fuse",
        "interchange",
        "tile",
        "decompose",
        "vectorize",
        "pack",
    )
    assert [k.action for k in Kind] == list(range(1, len(KIND_NAMES))) and NEXT == 0
    assert KINDS == KIND_NAMES[1:] and sorted(GRAMMAR) == list(range(len(KIND_NAMES)))
    assert Transform("tile", (4,)).to_json() == {"kind": "tile", "sizes": [4]}
