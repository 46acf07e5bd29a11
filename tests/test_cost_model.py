"""The surrogate: features identical to the env's, training, checkpoints, interface, metrics."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlirrl_jax.actions import MAX_OPS
from mlirrl_jax.collect import CollectConfig, CollectionJob
from mlirrl_jax.env.features import features
from mlirrl_jax.env.jax_env import JaxEnv, sample_action, transition
from mlirrl_jax.env.replay import schedule_to_actions
from mlirrl_jax.env.reward import TerminalReward
from mlirrl_jax.env.state import initial_state, trim_ops
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.api import AnalyticModel, CostModel, predict_dataset
from mlirrl_jax.surrogate.dataset import load_dataset
from mlirrl_jax.surrogate.metrics import evaluate
from mlirrl_jax.surrogate.train import TrainConfig

# cheap dl-v0 programs: six of the train split, two of the surrogate-validation split
CHEAP_PROGRAMS = tuple(
    f"suite://dl-v0/{name}"
    for name in (
        "add_1x56x56x64",
        "relu_1x56x56x64",
        "add_1x28x28x128",
        "relu_1x28x28x128",
        "add_1x14x14x256",
        "relu_1x14x14x256",
        "add_1x14x14x64",
        "softmax_sum_r768_c64",
    )
)
SMALL = TrainConfig(epochs=30, programs_per_batch=4, rows_per_program=8, teacher="none")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    # a real store: real measurements of cheap train programs
    path = tmp_path_factory.mktemp("store") / "m.db"
    CollectionJob(
        CollectConfig(
            store=path,
            budget=48,
            workers=2,
            programs=CHEAP_PROGRAMS,
            baselines_of=("train",),
            method=TimingMethod(min_repeats=3, min_time_s=0.01),
        )
    ).run()
    return path


@pytest.fixture(scope="module")
def dataset(store_path):
    with MeasurementStore(store_path) as store:
        return load_dataset(store, machine_fingerprint()["machine_id"])


@pytest.fixture(scope="module")
def model(dataset):
    return CostModel.fit(dataset, SMALL)


def test_training_examples_are_featurized_as_the_env_does(dataset):
    row = int(np.flatnonzero(~dataset.is_baseline)[0])
    program = int(dataset.program[row])
    state = initial_state(dataset.table, jnp.int32(program), jax.random.PRNGKey(0))
    step = jax.jit(transition)
    for action in schedule_to_actions(dataset.programs[program], _schedule_of_row(dataset, row)):
        state = step(dataset.table, state, jnp.asarray(action))[0]
    stepped = features(dataset.table, state)
    # the same function; batched and single-state compilations may round differently
    for name in ("op_features", "loop_features", "log_points"):
        a, b = np.asarray(getattr(stepped, name)), getattr(dataset.features, name)[row]
        assert np.abs(a - b).max() < 1e-6, (name, np.abs(a - b).max())


def _schedule_of_row(dataset, row):
    from mlirrl_jax.env.replay import HostState, schedule_of

    state = jax.tree.map(lambda a: a[row], dataset.states)
    return schedule_of(dataset.programs[int(dataset.program[row])], HostState.from_env_state(state))


def test_fit_lowers_the_loss_and_beats_the_analytic_model_on_training_data(dataset, model):
    trained, history = model
    assert history[-1]["loss"] < history[0]["loss"]
    ours = evaluate(
        predict_dataset(trained, dataset), dataset.log_time, dataset.program, dataset.is_baseline
    )
    theirs = evaluate(
        predict_dataset(AnalyticModel(), dataset),
        dataset.log_time,
        dataset.program,
        dataset.is_baseline,
    )
    assert ours["mape_speedup"] < theirs["mape_speedup"]


def test_checkpoint_round_trip(model, dataset, tmp_path):
    trained, _ = model
    trained.save(tmp_path / "m")
    loaded = CostModel.load(tmp_path / "m")
    assert np.allclose(
        predict_dataset(loaded, dataset), predict_dataset(trained, dataset), atol=1e-5
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="model.json"):
        CostModel.load(tmp_path / "empty")


def test_update_fine_tunes_from_current_weights(model, dataset):
    trained, _ = model
    updated = trained.update(dataset, epochs=5)
    assert updated.meta["updates"] == 1 and trained.meta.get("updates", 0) == 0
    before, after = predict_dataset(trained, dataset), predict_dataset(updated, dataset)
    assert not np.allclose(before, after)
    assert np.corrcoef(before, after)[0, 1] > 0.5  # continued, not restarted


def test_a_head_update_changes_the_output_layers_only(model, dataset):
    trained, _ = model
    updated = trained.update(dataset, epochs=5, trainable="head")
    assert updated.meta["lineage"][-1]["trainable"] == "head"
    old, _ = jax.tree_util.tree_flatten_with_path(trained.params)
    new, _ = jax.tree_util.tree_flatten_with_path(updated.params)
    changed = {
        jax.tree_util.keystr(path): not np.array_equal(np.asarray(a), np.asarray(b))
        for (path, a), (_, b) in zip(old, new, strict=True)
    }
    head = {p: c for p, c in changed.items() if p.startswith(("['out']", "['out_hidden']"))}
    assert head and all(head.values())
    assert not any(c for p, c in changed.items() if p not in head), changed
    assert not np.allclose(predict_dataset(trained, dataset), predict_dataset(updated, dataset))


def test_predictions_run_over_the_tables_op_slots_only(model, dataset):
    trained, _ = model
    table = dataset.table
    assert table.op_slots == max(len(p.ops) for p in dataset.programs) < MAX_OPS
    states = jax.tree.map(lambda a: a[:48], dataset.states)
    cut_table, cut = trim_ops(table, states)
    assert cut.extents.shape[1] == cut_table.extents.shape[1] == table.op_slots
    # the cut slots were padding: the features of the kept ones are the same
    whole = jax.vmap(features, in_axes=(None, 0))(table, states)
    part = jax.vmap(features, in_axes=(None, 0))(cut_table, cut)
    for name in ("op_features", "loop_features", "op_valid"):
        kept = np.asarray(getattr(whole, name))[:, : table.op_slots]
        assert np.allclose(kept, np.asarray(getattr(part, name)), atol=1e-6), name
        assert not np.asarray(getattr(whole, name))[:, table.op_slots :].any()
    untrimmed = trained.predict(table.replace(op_slots=MAX_OPS), states)
    assert np.allclose(trained.predict(table, states), untrimmed, atol=1e-5)
    # the chunked predictor computes the same; its rows come in whole chunks
    predictor = trained.predictor(chunk=16)
    assert np.allclose(predictor(table, states), untrimmed, atol=1e-5)
    with pytest.raises(ValueError, match="multiples of 16"):
        predictor(table, jax.tree.map(lambda a: a[:40], states))


@pytest.mark.parametrize("which", ["surrogate", "analytic"])
def test_models_are_the_environment_reward(model, dataset, which):
    reward_model = model[0] if which == "surrogate" else AnalyticModel()
    table = dataset.table
    chex.clear_trace_counter()  # the other parameter traced the same function
    env = JaxEnv(reward=TerminalReward(reward_model.log_time_model, chunk=4), auto_reset=False)
    step = jax.jit(chex.assert_max_traces(env.step, n=1))
    prepare = jax.jit(env.reward.prepare)
    programs = jnp.arange(min(8, table.n_programs), dtype=jnp.int32)

    def returns(model_params):
        params = prepare(model_params, table)
        keys = jax.random.split(jax.random.PRNGKey(0), programs.shape[0])
        states, timestep = env.reset_to(params, table, programs, keys)
        total, key = np.zeros(programs.shape[0]), jax.random.PRNGKey(1)
        while not bool(states.done.all()):
            key, sub = jax.random.split(key)
            masks = timestep.observation.mask
            actions = jax.vmap(sample_action)(jax.random.split(sub, programs.shape[0]), masks)
            states, timestep = step(params, table, programs, states, actions)
            total += np.asarray(timestep.reward)
        return total, states, params

    total, final, params = returns(reward_model.params)
    # the episode's return is the model's predicted log-speedup of its schedule
    base = reward_model.predict(table, env.initial(params, table, programs, final.key))
    expected = np.asarray(base) - np.asarray(reward_model.predict(table, final))
    assert np.allclose(total, expected, atol=1e-4)
    if which == "surrogate":  # new weights are a new argument: no retrace, other rewards
        shifted = jax.tree.map(lambda a: a * 1.05, reward_model.params)
        again, _, _ = returns(shifted)
        assert not np.allclose(again, total)


def test_metrics_on_known_values():
    measured = np.log(np.array([1.0, 0.5, 0.25, 2.0, 1.0, 4.0]))
    program = np.array([0, 0, 0, 1, 1, 1])
    baseline = np.array([True, False, False, True, False, False])
    perfect = evaluate(measured, measured, program, baseline)
    assert perfect["mape_speedup"] == 0 and perfect["spearman"] == pytest.approx(1.0)
    assert perfect["pairwise_accuracy"] == 1.0 and perfect["top1"] == 1.0
    # program 1 predicted upside down: its top pick (true 4.0) is 4x slower than its best (1.0)
    flipped = measured.copy()
    flipped[3:] = -measured[3:]
    m = evaluate(flipped, measured, program, baseline)
    assert m["spearman"] == pytest.approx(0.0)  # +1 and -1
    assert m["pairwise_accuracy"] == pytest.approx(0.5)
    assert m["top1"] == pytest.approx((1.0 + 0.25) / 2)
    assert m["top5"] == 1.0
    assert perfect["top1_hit"] == 1.0 and m["top1_hit"] == 0.5  # program 0 hit, 1 missed
    # a pick within the noise gap (5% in log) of the best counts as a hit
    tie = np.log(np.array([1.0, 0.26, 0.25, 2.0, 1.0, 4.0]))
    picks_second = tie.copy()
    picks_second[1] = np.log(0.1)  # predicted fastest: true 0.26, within 5% of the best 0.25
    assert evaluate(picks_second, tie, program, baseline)["top1_hit"] == 1.0
    # a program with a lone schedule (only its baseline) has nothing to rank: left out of top-k
    lone = evaluate(
        np.append(flipped, 0.0),
        np.append(measured, 0.0),
        np.append(program, 2),
        np.append(baseline, True),
    )
    assert lone["programs"] == 3
    assert lone["top1"] == m["top1"] and lone["top5"] == m["top5"]
    # predicted speedups twice the true ones on program 0: 100% error there
    doubled = measured.copy()
    doubled[1:3] -= np.log(2)
    assert evaluate(doubled, measured, program, baseline)["mape_speedup"] == pytest.approx(0.5)


def test_every_collected_schedule_is_featurized_with_its_baseline(dataset):
    assert dataset.skipped == 0  # every sampled schedule is expressible as actions
    with_baseline = set(dataset.program[dataset.is_baseline].tolist())
    assert with_baseline == set(dataset.program.tolist())


def test_an_ensemble_averages_members_trained_on_their_own_batches(dataset):
    from dataclasses import replace

    from mlirrl_jax.surrogate.model import ModelConfig, apply, apply_members

    config = replace(SMALL, epochs=10, model=ModelConfig(members=3))
    ensemble, _ = CostModel.fit(dataset, config)
    feats = jax.tree.map(jnp.asarray, dataset.features)
    each = np.asarray(apply_members(ensemble.graphdef, ensemble.params, feats))
    assert each.shape == (3, len(dataset))
    assert np.all(np.std(each, axis=0) > 0)  # members differ
    mean = np.asarray(apply(ensemble.graphdef, ensemble.params, feats))
    assert np.allclose(mean, each.mean(axis=0), atol=1e-5)
    assert np.allclose(predict_dataset(ensemble, dataset), mean, atol=1e-4)


def test_random_states_are_finished_legal_episodes_of_the_datasets_programs(dataset):
    from mlirrl_jax.surrogate.dataset import random_states

    extra = random_states(dataset, 300, seed=1)
    assert len(extra) == 300 and set(extra.program.tolist()) <= set(dataset.program.tolist())
    assert np.all(extra.states.done)
    assert np.all(np.isfinite(extra.features.op_features))
    # the same seed gives the same states; schedules differ between states
    again = random_states(dataset, 300, seed=1)
    assert np.array_equal(again.states.tile_sizes, extra.states.tile_sizes)
    assert len({s.tobytes() for s in extra.states.tile_sizes}) > 30


def test_distillation_gives_one_network_close_to_its_teacher(dataset, tmp_path):
    from dataclasses import replace

    from mlirrl_jax.surrogate.dataset import random_states
    from mlirrl_jax.surrogate.model import ModelConfig

    config = replace(
        SMALL,
        model=ModelConfig(members=1),
        teacher="networks",
        teacher_members=3,
        distill_states=512,
        distill_epochs=30,
    )
    student, history = CostModel.fit(dataset, config)
    assert jax.tree.leaves(student.params)[0].shape[0] == 1
    assert {h["phase"] for h in history} == {"teacher", "labels", "student"}
    teacher, _ = CostModel.fit(
        dataset,
        replace(SMALL, model=ModelConfig(members=3, op_width=config.teacher_op_width)),
    )
    # on states neither saw, the student follows the ensemble it learned from
    unseen = random_states(dataset, 256, seed=7)
    s, t = predict_dataset(student, unseen), predict_dataset(teacher, unseen)
    assert np.corrcoef(s, t)[0, 1] > 0.8
    reloaded = CostModel.load(student.save(tmp_path / "student"))
    assert np.allclose(predict_dataset(reloaded, unseen), s, atol=1e-5)


def test_tree_teacher_labels_follow_the_measurements_and_the_student_follows_the_trees(dataset):
    from dataclasses import replace

    from mlirrl_jax.surrogate.dataset import random_states
    from mlirrl_jax.surrogate.metrics import evaluate
    from mlirrl_jax.surrogate.teacher import fit_tree_teacher

    trees, curve = fit_tree_teacher(dataset, rounds=60, leaves=15, seed=0)
    fitted = trees.predict(dataset.features)
    assert curve[-1]["l2"] < curve[0]["l2"]
    # on the rows it was fitted on: close to the measured times, better than the analytic model
    assert np.corrcoef(fitted, dataset.log_time)[0, 1] > 0.9
    ours = evaluate(fitted, dataset.log_time, dataset.program, dataset.is_baseline)
    analytic = predict_dataset(AnalyticModel(), dataset)
    theirs = evaluate(analytic, dataset.log_time, dataset.program, dataset.is_baseline)
    assert ours["mape_speedup"] < theirs["mape_speedup"]
    # the full pipeline: trees label random states, one network learns from them
    config = replace(SMALL, teacher="trees", teacher_rounds=60, teacher_leaves=15)
    config = replace(config, distill_states=512, distill_epochs=30)
    student, history = CostModel.fit(dataset, config)
    assert {h["phase"] for h in history} == {"teacher", "labels", "student"}
    unseen = random_states(dataset, 256, seed=7)
    s = predict_dataset(student, unseen)
    t = fit_tree_teacher(dataset, rounds=60, leaves=15, seed=0)[0].predict(unseen.features)
    assert np.corrcoef(s, t)[0, 1] > 0.8
    with pytest.raises(ValueError, match="teacher 'forest'"):
        replace(SMALL, teacher="forest")


def test_the_fit_job_writes_metrics_a_plot_and_a_model_that_reevaluates_the_same(
    store_path, tmp_path
):
    from mlirrl_jax.records import FitResult
    from mlirrl_jax.surrogate.report import evaluate_saved, fit_and_report, format_metrics

    machine = machine_fingerprint()["machine_id"]
    out = tmp_path / "run"
    result = fit_and_report(store_path, out, machine, SMALL)
    assert (out / "metrics.json").is_file() and (out / "predicted_vs_measured.png").is_file()
    # fitted on the train split, evaluated on the surrogate-validation split
    assert result.held_out_programs == 2 and result.train_rows > 0
    assert result.test_rows_left_out == 0
    for scores in (result.surrogate, result.analytic_baseline):
        assert 0.0 <= scores["pairwise_accuracy"] <= 1.0
        assert np.isfinite(scores["mape_speedup"])
    # per family: the held-out programs split by model family, each scored alone
    by_family = result.surrogate_by_family
    assert sum(m["programs"] for m in by_family.values()) == result.held_out_programs
    assert sum(m["schedules"] for m in by_family.values()) == result.held_out_rows
    if len(by_family) == 1:
        assert next(iter(by_family.values())) == result.surrogate
    training = result.surrogate_on_training_programs
    assert training["schedules"] == result.train_rows
    table = format_metrics(result)
    assert all(f"| {name} | {m['programs']} |" in table for name, m in by_family.items())
    saved = json.loads((out / "metrics.json").read_text())  # the file is the record, whole
    assert FitResult.from_json(saved).train_rows == result.train_rows
    again = evaluate_saved(out / "model", store_path)
    assert again.held_out_rows == result.held_out_rows
    for key in ("mape_speedup", "spearman", "pairwise_accuracy", "top1"):
        assert again.surrogate[key] == pytest.approx(result.surrogate[key], abs=1e-5)
    assert again.surrogate_by_family.keys() == by_family.keys()


def test_the_metrics_table_marks_a_family_with_only_baselines():
    from mlirrl_jax.surrogate.metrics import evaluate
    from mlirrl_jax.surrogate.report import format_metrics

    two = evaluate(
        np.array([0.0, 1.0, 2.0]), np.array([0.0, 2.0, 1.0]), np.zeros(3), np.eye(3)[0] > 0
    )
    lone = evaluate(np.zeros(1), np.zeros(1), np.zeros(1), np.ones(1, bool))
    from mlirrl_jax.records import HeldOutScores

    result = HeldOutScores("m", 2, 4, two, two, {"a": two, "b": lone})
    table = format_metrics(result)
    assert "| b | 1 | - | - | - | - | - |" in table and "nan" not in table
    assert "| a | 1 | 117.5% | 0.500 | 0.667 | 1.000 | 1.000 |" in table


@pytest.mark.parametrize("shipped", ["cost_model", "cost_model_multi"])
def test_the_shipped_model_predicts_its_reference_slice_as_recorded(shipped, tmp_path):
    # guards a shipped checkpoint against drift of the features or the network code, on a
    # small slice of the seed (every row of a few held-out programs, on each machine and
    # thread count the model was fitted on), re-predicted
    import json
    from pathlib import Path

    import pyarrow.parquet as pq

    from mlirrl_jax.env.replay import HostState, schedule_of

    root = Path(__file__).resolve().parent.parent
    folder = root / "data" / shipped
    reference = json.loads((folder / "reference_predictions.json").read_text())
    machines = sorted({r.get("machine_id") for r in reference["rows"]} - {None})
    threads = sorted({r.get("threads", 1) for r in reference["rows"]})
    model = CostModel.load(folder)
    with MeasurementStore(tmp_path / "slice.db") as store:
        for i, seed in enumerate(sorted((root / "data" / "seed").glob("*.parquet"))):
            rows = pq.read_table(seed, filters=[("program_name", "in", reference["programs"])])
            pq.write_table(rows, tmp_path / f"slice{i}.parquet")
            store.import_parquet(tmp_path / f"slice{i}.parquet", allow_other_machines=True)
        data = load_dataset(store, machines or model.meta["machine_id"], threads)
    predicted = predict_dataset(model, data)
    again = {}
    for i in range(len(data)):
        row = int(data.program[i])
        program = data.programs[row]
        state = HostState.from_env_state(jax.tree.map(lambda a, i=i: a[i], data.states))
        key = (
            program.name,
            data.machines[row],
            data.threads[row],
            schedule_of(program, state).hash,
        )
        again[key] = float(predicted[i])
    recorded = {
        (
            r["program"],
            r.get("machine_id", model.meta["machine_id"]),
            r.get("threads", 1),
            r["schedule_hash"],
        ): r["predicted_log_time"]
        for r in reference["rows"]
    }
    assert again.keys() == recorded.keys() and len(recorded) > 50
    for key, value in recorded.items():
        assert again[key] == pytest.approx(value, abs=1e-4), key


def test_step_caps_bound_the_batches_of_each_phase(dataset):
    from dataclasses import replace

    from mlirrl_jax.surrogate.train import fit

    capped = replace(
        SMALL,
        epochs=1000,
        max_steps=12,
        teacher="networks",
        teacher_members=2,
        distill_states=64,
        distill_epochs=1000,
        distill_max_steps=7,
    )
    _, _, history = fit(dataset, capped)
    last = {h["phase"]: h["step"] for h in history if "step" in h}
    assert last == {"teacher": 11, "student": 6}
    # uncapped, the same epochs would run many more batches
    assert 1000 * len(dataset) // (SMALL.programs_per_batch * SMALL.rows_per_program) > 12


def test_fits_repeat_exactly_and_feature_noise_changes_them(dataset):
    from dataclasses import replace

    from mlirrl_jax.surrogate.train import fit

    quiet = replace(SMALL, max_steps=60, feature_noise=0.0)
    leaves = lambda config: jax.tree.leaves(fit(dataset, config)[1])  # noqa: E731
    first, again, noisy = leaves(quiet), leaves(quiet), leaves(replace(quiet, feature_noise=0.1))
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.allclose(a, b) for a, b in zip(first, noisy))


def test_training_chunks_run_over_the_op_slots_their_programs_need(model, dataset):
    from mlirrl_jax.env.state import slot_sizes
    from mlirrl_jax.surrogate.model import apply
    from mlirrl_jax.surrogate.train import ORDER_WINDOW, STEPS_PER_CALL, _slot_ordered

    trained, _ = model
    n_ops = np.asarray(dataset.table.n_ops)[dataset.program]
    sizes = slot_sizes(dataset.table.op_slots)
    rng = np.random.default_rng(0)
    count = ORDER_WINDOW + 130  # a whole window and part of another
    batches = iter([rng.choice(len(dataset), size=(1, 3)) for _ in range(count)])
    chunks = list(_slot_ordered(batches, lambda r: n_ops[r].max(), sizes, count, rng))
    steps = np.concatenate([ids for _, ids, _ in chunks])
    assert sorted(steps) == list(range(count))  # every batch runs once
    for rows, ids, slots in chunks:
        assert len(rows) == len(ids) <= STEPS_PER_CALL and slots in sizes
        assert n_ops[rows].max() <= slots  # no op of these rows is cut off
    assert min(slots for *_, slots in chunks) < max(sizes)  # some chunks skip padding slots
    # over the slots its ops fill, the network predicts what it predicts over all of them
    for slots in sizes:
        rows = np.flatnonzero(n_ops <= slots)[:64]
        whole = jax.tree.map(lambda a, r=rows: a[r], dataset.features)
        cut = jax.tree.map(lambda a, s=slots: a[:, :s], whole)
        assert np.allclose(
            apply(trained.graphdef, trained.params, cut),
            apply(trained.graphdef, trained.params, whole),
            atol=1e-5,
        ), slots


def test_ensemble_members_draw_batches_from_their_own_bootstrap_of_the_programs(dataset):
    from mlirrl_jax.surrogate.train import _batches

    def programs_seen(member: int, bootstrap: bool) -> set[int]:
        rng = np.random.default_rng([SMALL.seed, member])
        batches = _batches(dataset, SMALL, rng, 200, bootstrap)
        return {int(p) for rows in batches for p in dataset.program[rows]}

    every = set(np.unique(dataset.program).tolist())
    assert programs_seen(0, bootstrap=False) == every  # a single network sees them all
    resampled = [programs_seen(m, bootstrap=True) for m in range(4)]
    assert all(seen <= every for seen in resampled)
    # a resample of n programs leaves about a third out: some member misses some program,
    # and the members do not all see the same ones
    assert any(seen < every for seen in resampled) and len({frozenset(s) for s in resampled}) > 1


def test_a_schedule_off_the_action_space_is_read_as_the_state_it_describes(tmp_path):
    """The heuristic's tile sizes are often no candidate of the action space (here a tile as
    large as its loop): its measured row is featurized from the state the whole schedule
    describes, not dropped."""
    from mlirrl_jax.env.replay import state_of_schedule
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.measure.runner import Runner
    from mlirrl_jax.programs.ir import load_program
    from mlirrl_jax.schedule import Schedule, ScheduleError

    program = load_program("suite://dl-v0/lqcd_su3_mul_l8x8")
    schedule = heuristic_schedule(program)
    with pytest.raises(ScheduleError):
        schedule_to_actions(program, schedule)
    with Runner() as runner, MeasurementStore(tmp_path / "s.db") as store:
        store.add_programs([program])
        store.put([runner.measure(program, Schedule()), runner.measure(program, schedule)])
        data = load_dataset(store, machine_fingerprint()["machine_id"])
    assert len(data) == 2 and data.skipped == 0
    row = int(np.flatnonzero(data.schedule_hash == schedule.hash)[0])
    expected = state_of_schedule(program, schedule).to_env_state(int(data.program[row]))
    for name in ("tile_sizes", "parallel_sizes", "vectorized", "order"):
        assert np.array_equal(getattr(data.states, name)[row], getattr(expected, name)), name
    assert np.all(np.isfinite(predict_dataset(AnalyticModel(), data)))
    assert not np.allclose(data.features.loop_features[0], data.features.loop_features[1])


def test_an_op_outside_every_parallel_loop_is_predicted_at_one_thread():
    """An op with no parallel loop (of its own or of the consumer it is fused into) runs on
    one thread whatever the threads per kernel: the surrogate reads it as at one thread, in
    the environment's form (per-program embeddings) and in the fit's (whole features) alike;
    a parallel op still reads the threads."""
    from mlirrl_jax.env.features import THREADS_COLUMN, ops_on_one_thread
    from mlirrl_jax.env.replay import state_of_schedule
    from mlirrl_jax.env.table import encode_programs
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.programs.ir import load_program
    from mlirrl_jax.schedule import Schedule
    from mlirrl_jax.shipped import SHIPPED_SURROGATE

    model = CostModel.load(SHIPPED_SURROGATE)
    program = load_program("suite://dl-v0/conv2d_nhwc_n1_h9_w9_c256_f512_k3_s1_d1")
    conv = {"op": 1, "transforms": [{"kind": "tile", "sizes": [0, 0, 0, 16, 1, 1, 16]}]}
    fill = {"op": 0, "transforms": [{"kind": "tile_parallel", "sizes": [0, 0, 0, 128]}]}
    schedules = [Schedule(), heuristic_schedule(program, threads=1)]
    schedules.append(heuristic_schedule(program, threads=2))  # the convolution parallel
    schedules.append(Schedule.from_json({"format": 1, "ops": [conv, fill]}))  # the fill alone
    states = jax.tree.map(
        lambda *a: np.stack(a),
        *[state_of_schedule(program, s).to_env_state(0) for s in schedules],
    )
    one_thread = np.asarray(jax.vmap(ops_on_one_thread)(states))[:, :2]
    # the heuristic leaves the fill (op 0) alone: it runs on one thread
    assert one_thread.tolist() == [[True, True], [True, True], [True, False], [False, True]]
    # a producer fused into a parallel consumer, or into one fused into it, runs in parallel
    chain = jax.tree.map(lambda a: jnp.asarray(a[0]), states)
    chain = chain.replace(
        parallel_sizes=chain.parallel_sizes.at[2, 0].set(4),
        fused_into=chain.fused_into.at[0].set(1).at[1].set(2),
    )
    assert np.asarray(ops_on_one_thread(chain))[:4].tolist() == [False, False, False, True]
    one, two = (encode_programs([program], threads=t) for t in (1, 2))
    whole = jax.vmap(features, in_axes=(None, 0))(two, states)
    threads = np.asarray(whole.op_features)[:, :2, THREADS_COLUMN]
    assert np.array_equal(threads == 0, one_thread) and threads.max() > 0
    at_one, at_two = (np.asarray(model.predict(t, states)) for t in (one, two))
    assert np.allclose(at_one[:2], at_two[:2], atol=1e-6)  # nothing parallel
    assert np.all(np.abs(at_one[2:] - at_two[2:]) > 1e-4)
    assert np.allclose(np.asarray(model.predict_features(whole)), at_two, atol=1e-4)
    surrogate = model.log_time_model
    pure = jax.jit(surrogate.log_time)(surrogate.prepare(model.params, two), two, states)
    assert np.allclose(np.asarray(pure), at_two, atol=1e-4)


def test_tokens_hold_the_steps_a_schedule_took_as_the_env_reaches_them(dataset):
    from mlirrl_jax.surrogate.tokens import STEP_NAMES, tokens, tokens_of_states

    toks = tokens_of_states(dataset.table, dataset.states)
    present = np.asarray(toks.present)
    valid = np.asarray(toks.op_valid)
    # an unscheduled program: only each op's own description and its loops
    base = np.flatnonzero(dataset.is_baseline)
    assert np.array_equal(present[base][:, :, :2], np.repeat(valid[base][..., None], 2, -1))
    assert not present[base][:, :, 2:].any()
    # a tiled op has a token for each level it took, with that level's log2 sizes
    tile0 = STEP_NAMES.index("tile0")
    tiled = np.asarray(dataset.states.tile_sizes)[:, :, 0].any(-1)  # (rows, ops)
    assert tiled.any()
    assert np.array_equal(present[:, :, tile0], tiled & valid)
    row, op = np.argwhere(tiled & valid)[0]
    sizes = np.asarray(dataset.states.tile_sizes)[row, op, 0]
    loop = int(np.flatnonzero(sizes)[0])
    assert toks.tiles[row, op, 0, loop] == pytest.approx((np.log2(sizes[loop]) + 1) / 16)
    # the function the jitted reward would call, one state at a time, gives the same tokens
    one = jax.jit(tokens)(dataset.table, jax.tree.map(lambda a: a[row], dataset.states))
    assert np.allclose(np.asarray(one.tiles), np.asarray(toks.tiles[row]))
    assert np.array_equal(np.asarray(one.present), present[row])


def test_the_token_model_learns_the_measurements_it_is_fitted_on(dataset):
    from dataclasses import replace

    from flax import nnx

    from mlirrl_jax.surrogate.tokens import TokenConfig, build_tokens, tokens_of_states
    from mlirrl_jax.surrogate.train import fit

    toks = tokens_of_states(dataset.table, dataset.states)
    init = build_tokens(TokenConfig(width=32))
    config = replace(SMALL, epochs=300)
    graphdef, params, history = fit(replace(dataset, features=toks), config, init=init)
    assert history[-1]["loss"] < history[0]["loss"] / 2

    def predict(p):
        return np.asarray(jax.vmap(lambda m: nnx.merge(graphdef, m)(toks))(p).mean(0))

    fitted = evaluate(predict(params), dataset.log_time, dataset.program, dataset.is_baseline)
    untrained = evaluate(predict(init[1]), dataset.log_time, dataset.program, dataset.is_baseline)
    assert fitted["spearman"] > 0.7 and fitted["spearman"] > untrained["spearman"] + 0.2


def test_the_listwise_loss_is_lowest_when_the_fastest_are_predicted_fastest():
    from mlirrl_jax.surrogate.train import _listwise

    target = jnp.log(jnp.array([1.0, 2.0, 4.0, 1.0, 3.0]))
    program = jnp.array([0, 0, 0, 1, 1])
    right = _listwise(target, target, program, 0.1)
    flipped = _listwise(-target, target, program, 0.1)
    # only the order within a program matters: shifting a program's times changes nothing
    shifted = _listwise(target + jnp.array([5.0, 5.0, 5.0, -2.0, -2.0]), target, program, 0.1)
    assert float(right) < float(flipped)
    assert float(shifted) == pytest.approx(float(right), rel=1e-5)
    # the slowest schedule of program 0 predicted fastest: raising its predicted log time
    # lowers the loss
    wrong = target.at[2].set(-1.0)
    grad = jax.grad(lambda p: _listwise(p, target, program, 0.1))(wrong)
    assert grad[2] < 0
