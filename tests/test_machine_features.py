"""One surrogate for many machines: profiles, machine and thread features, multi-machine
datasets and fits, the ensemble's spread. Real data: a slice of the shipped seed (machine
63f92bffe2fc) beside rows measured here."""

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pyarrow.parquet as pq
import pytest

from mlirrl_jax import integrity
from mlirrl_jax.cli import main
from mlirrl_jax.env.features import MACHINE_FEATURES, STATIC_OP_FEATURES
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.measure.bandwidth import stream_bandwidth_gbs
from mlirrl_jax.measure.fingerprint import machine_fingerprint, vector_lanes
from mlirrl_jax.measure.profile import (
    CACHE_ENV,
    PROFILE_METHOD,
    MachineProfile,
    NoisyMachineError,
    UnknownMachineError,
    cached_profile_path,
    known_profiles,
    measured_profile,
    profile_of,
    this_machine_profile,
)
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.programs.ir import load_program
from mlirrl_jax.sampler import EpisodeSampler, random_policy
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store import MeasurementStore, StoreError
from mlirrl_jax.surrogate.api import CostModel, predict_dataset
from mlirrl_jax.surrogate.dataset import load_dataset, machine_table
from mlirrl_jax.surrogate.train import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
SEED = sorted((ROOT / "data" / "seed").glob("*.parquet"))[0]
SEED_MACHINE = "63f92bffe2fc"
# three train-split programs and one surrogate-validation program of the seed (about 60 rows
# each); the last two are also measured here, at one and two threads
SEED_PROGRAMS = [
    f"suite://dl-v0/{name}"
    for name in ("add_1x56x56x64", "relu_1x28x28x128", "add_1x14x14x256", "add_1x14x14x64")
]
MEASURED_HERE = SEED_PROGRAMS[2:]
TINY = TrainConfig(
    epochs=30, max_steps=40, programs_per_batch=4, rows_per_program=8, teacher="none"
)


def here() -> str:
    return machine_fingerprint()["machine_id"]


@pytest.fixture(scope="module")
def seed_slice(tmp_path_factory) -> Path:
    if here() == SEED_MACHINE:  # its rows would be this machine's own, not another's
        pytest.skip(f"this machine is the seed's ({SEED_MACHINE}): these tests mix in another's")
    path = tmp_path_factory.mktemp("seed") / "slice.parquet"
    pq.write_table(pq.read_table(SEED, filters=[("program_name", "in", SEED_PROGRAMS)]), path)
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory, seed_slice, runner) -> Path:
    """A store of two machines: the seed slice, and the baselines and a few random schedules
    of two of its programs measured here at one and two threads."""
    path = tmp_path_factory.mktemp("store") / "m.db"
    method = TimingMethod(min_repeats=3, min_time_s=0.01)
    programs = [load_program(name) for name in MEASURED_HERE]
    sampler = EpisodeSampler(programs, random_policy(0.25))
    schedules = []
    for i, program in enumerate(programs):
        drawn = {sampler.schedule(i, jax.random.PRNGKey(k))[0] for k in range(3)}
        schedules += [(program, s) for s in [Schedule(), *sorted(drawn, key=lambda s: s.hash)]]
    with MeasurementStore(path) as store:
        store.import_parquet(seed_slice, allow_other_machines=True)
        store.add_programs(programs)
        measured = [
            runner.measure(program, schedule, threads=threads, method=method)
            for program, schedule in schedules
            for threads in (1, 2)
        ]
        store.put(measured)
    ok = {(m.program_hash, m.schedule_hash, m.threads) for m in measured if m.status == "ok"}
    assert len([key for key in ok if key[2] == 1]) > len(programs)  # more than the baselines
    return path


@pytest.fixture(scope="module")
def both(store_path):
    with MeasurementStore(store_path) as store:
        return load_dataset(store, [here(), SEED_MACHINE], threads=[1, 2])


@pytest.fixture(scope="module")
def fit_run(store_path, tmp_path_factory) -> Path:
    """A three-network ensemble distilled from trees, fitted by the command line on every
    machine of the store at 1 and 2 threads (tiny: a few batches)."""
    out = tmp_path_factory.mktemp("fit") / "run"
    args = ["fit-cost-model", "--store", str(store_path), "--out", str(out)]
    args += ["--machines", "all", "--threads", "1,2", "--members", "3", "--epochs", "30"]
    args += ["--max-steps", "40", "--teacher", "trees", "--teacher-rounds", "20"]
    args += ["--teacher-leaves", "7", "--distill-states", "128", "--distill-max-steps", "40"]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def ensemble(fit_run) -> CostModel:
    return CostModel.load(fit_run / "model")


@pytest.fixture(scope="module")
def one_program(both):
    """The first table row's program, profile and thread count, and its rows' states (their
    program index 0: of a table of that program alone)."""
    row = int(both.program[0])
    states = jax.tree.map(lambda a: a[both.program == row], both.states)
    states = states.replace(program=np.zeros_like(states.program))
    return both.programs[row], both.profiles[both.machines[row]], both.threads[row], states


def test_bandwidth_is_plausible_and_a_profile_is_measured_once(tmp_path, monkeypatch):
    assert 0.5 < stream_bandwidth_gbs(buffer_mib=64, repeats=3) < 5000  # GB/s
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert measured_profile(measure=False) is None  # nothing cached: nothing measured
    cached = cached_profile_path()
    assert cached == tmp_path / "cache" / f"{here()}-m{PROFILE_METHOD}.json"
    try:
        first = measured_profile()
    except NoisyMachineError as noisy:  # other work runs beside the tests: refused, not cached
        assert "quiet machine" in str(noisy) and not cached.exists()
        pytest.skip(f"this machine is busy: {noisy}")
    assert cached.is_file() and first.measured
    assert "the best of 3 within 10% of each other" in first.sources["bandwidth_gbs"]
    assert first.machine_id == here() and first.vector_lanes == vector_lanes()
    assert first.fma_peak_gflops > 1 and 0.5 < first.bandwidth_gbs < 5000
    assert first.l1d_bytes > 0 and first.cores == machine_fingerprint()["cores"]
    # a second call reads the cache: measuring again would not give the same floats
    again = measured_profile()
    assert again == first and again.bandwidth_gbs == first.bandwidth_gbs
    assert json.loads(cached.read_text())["fma_peak_gflops"] == first.fma_peak_gflops


def test_the_seeds_machine_has_a_recorded_profile_marked_unmeasured():
    seed = known_profiles()[SEED_MACHINE]
    assert not seed.measured and seed.vector_lanes == 16 and seed.cores == 2
    assert (seed.l1d_bytes, seed.l2_bytes, seed.l3_bytes) == (32 << 10, 1 << 20, 32 << 20)
    assert seed.fma_peak_gflops == 114.9 and "BENCHMARKS.md" in seed.sources["fma_peak_gflops"]
    assert seed.sources["bandwidth_gbs"].startswith("estimate")
    assert profile_of(SEED_MACHINE) == seed
    with pytest.raises(UnknownMachineError, match="no profile of machine nowhere"):
        profile_of("nowhere")


def test_machine_and_threads_change_the_static_features_and_nothing_else(mm_bias_relu):
    machine = this_machine_profile()
    other = dataclasses.replace(machine, fma_peak_gflops=3 * machine.fma_peak_gflops)
    a = encode_programs([mm_bias_relu], machine=machine)
    tables = [
        encode_programs([mm_bias_relu], machine=other),
        encode_programs([mm_bias_relu], threads=2),
    ]
    valid = np.asarray(a.op_valid[0])
    columns = slice(STATIC_OP_FEATURES - MACHINE_FEATURES, STATIC_OP_FEATURES)
    for b in tables:
        assert np.array_equal(np.asarray(a.static_loop), np.asarray(b.static_loop))
        op_a, op_b = np.asarray(a.static_op[0]), np.asarray(b.static_op[0])
        assert np.array_equal(op_a[:, : columns.start], op_b[:, : columns.start])
        assert not np.allclose(op_a[valid, columns], op_b[valid, columns])
        assert not op_b[~valid].any()  # padding ops stay zero
    assert int(tables[1].threads[0]) == 2 and int(a.threads[0]) == 1


def test_a_store_refuses_another_machines_rows_unless_asked(store_path, seed_slice, tmp_path):
    with MeasurementStore(tmp_path / "fresh.db") as fresh:
        with pytest.raises(StoreError, match="do not mix"):
            fresh.import_parquet(seed_slice)
        assert fresh.count() == 0 and fresh.machine_profiles() == {}
    with MeasurementStore(store_path) as store:
        # the seed's export predates profiles: its machine got the shipped one on import;
        # this machine's was recorded with its first rows
        recorded = store.machine_profiles()
        assert recorded[SEED_MACHINE] == known_profiles()[SEED_MACHINE]
        assert recorded[here()] == this_machine_profile()
        one = load_dataset(store, here())  # one machine, one thread count: the default
        mine = [r for r in store.rows(machine_id=here(), status="ok") if r["threads"] == 1]
    assert set(one.machines) == {here()} and set(one.threads) == {1}
    assert len(one) + one.skipped == len(mine)


def test_a_multi_machine_load_gets_each_machines_rows_with_its_own_profile(store_path, both):
    groups = [(SEED_MACHINE, 1), (here(), 1), (here(), 2)]
    with MeasurementStore(store_path) as store:
        stored = {
            (m, t): sum(r["threads"] == t for r in store.rows(machine_id=m, status="ok"))
            for m, t in groups
        }
    assert len(both) + both.skipped == sum(stored.values())
    for machine, threads in groups:
        table_rows = [
            i for i, key in enumerate(zip(both.machines, both.threads)) if key == (machine, threads)
        ]
        assert 0 < np.isin(both.program, table_rows).sum() <= stored[machine, threads]
        profile = both.profiles[machine]
        figures = [profile.fma_peak_gflops, profile.bandwidth_gbs, profile.l1d_bytes]
        figures += [profile.l2_bytes, profile.l3_bytes, profile.cores]
        for i in table_rows:
            assert np.allclose(both.table.machine[i], figures)
            assert int(both.table.vector_lanes[i]) == profile.vector_lanes
            assert int(both.table.threads[i]) == threads
    assert both.profiles[SEED_MACHINE].vector_lanes == 16  # its own vectors, not this machine's
    # each (program, machine, threads) is a table row of its own
    keys = [(p.hash, m, t) for p, m, t in zip(both.programs, both.machines, both.threads)]
    assert len(set(keys)) == len(keys)
    assert len({p.hash for p in both.programs}) == len(SEED_PROGRAMS)


def test_the_fit_records_its_machines_and_thread_counts(fit_run, ensemble):
    meta = ensemble.meta  # as saved and loaded again
    assert meta["feature_version"] == 5 and meta["thread_counts"] == [1, 2]
    assert set(meta["machines"]) == {here(), SEED_MACHINE}
    assert meta["machines"][SEED_MACHINE] == known_profiles()[SEED_MACHINE].to_json()
    assert meta["machines"][here()] == this_machine_profile().to_json()
    # an ensemble distilled from the trees: every member learnt from the teacher's labels
    assert jax.tree.leaves(ensemble.params)[0].shape[0] == 3
    history = json.loads((fit_run / "metrics.json").read_text())["history"]
    assert {h["phase"] for h in history} == {"teacher", "labels", "student"}


def test_machine_features_change_the_prediction(ensemble, one_program):
    program, machine, threads, states = one_program
    base = ensemble.predict(machine_table([program], machine, threads), states)
    faster = dataclasses.replace(machine, fma_peak_gflops=4 * machine.fma_peak_gflops)
    for table in (
        machine_table([program], faster, threads),
        machine_table([program], machine, 3 - threads),  # 1 thread against 2
    ):
        assert not np.allclose(ensemble.predict(table, states), base)


def test_a_machine_left_out_is_predicted_from_its_profile(store_path, both):
    is_seed = np.array([m == SEED_MACHINE for m in both.machines])
    seed_only = both.subset(np.flatnonzero(is_seed[both.program]))
    mine = both.subset(np.flatnonzero(~is_seed[both.program]))
    model, _ = CostModel.fit(seed_only, TINY)
    assert model.meta["machine_id"] == SEED_MACHINE
    assert set(model.meta["machines"]) == {SEED_MACHINE} and model.meta["thread_counts"] == [1]
    # this machine's programs, encoded with its profile, as the helper encodes them
    rows = [i for i, (m, t) in enumerate(zip(both.machines, both.threads)) if (m, t) == (here(), 1)]
    with MeasurementStore(store_path) as store:
        table = machine_table([both.programs[i] for i in rows], here(), 1, store)
    assert np.array_equal(np.asarray(table.static_op), np.asarray(both.table.static_op)[rows])
    predicted = predict_dataset(model, mine)
    assert predicted.shape == (len(mine),) and np.all(np.isfinite(predicted))
    # one network: no spread
    _, spread = model.predict_with_spread(mine.table, mine.states)
    assert np.all(np.asarray(spread) == 0)


def test_an_ensembles_spread_is_its_uncertainty_and_its_mean_the_prediction(ensemble, one_program):
    program, machine, threads, states = one_program
    table = machine_table([program], machine, threads)
    mean, spread = ensemble.predict_with_spread(table, states)
    assert np.all(np.asarray(spread) > 0)
    assert np.allclose(mean, ensemble.predict(table, states), atol=1e-5)
    # the pure form the environment can call
    surrogate = ensemble.log_time_model
    context = surrogate.prepare(ensemble.params, table)
    pure_mean, pure_spread = jax.jit(surrogate.log_time_with_spread)(context, table, states)
    assert np.allclose(pure_mean, mean, atol=1e-5) and np.allclose(pure_spread, spread, atol=1e-5)


def test_the_pessimistic_reward_counts_an_unsure_schedule_as_slower(ensemble, one_program):
    from mlirrl_jax.agent.config import AgentConfig
    from mlirrl_jax.agent.train import make_env
    from mlirrl_jax.env.reward import AnalyticLogTime, PessimisticLogTime

    program, machine, threads, states = one_program
    table = machine_table([program], machine, threads)
    mean, spread = ensemble.predict_with_spread(table, states)
    config = AgentConfig(uncertainty_penalty=1.5)
    env = make_env(config, ensemble.log_time_model)
    pessimistic = env.reward.model
    assert isinstance(pessimistic, PessimisticLogTime) and pessimistic.beta == 1.5
    context = pessimistic.prepare(ensemble.params, table)
    got = np.asarray(jax.jit(pessimistic.log_time)(context, table, states))
    assert np.allclose(got, np.asarray(mean) + 1.5 * np.asarray(spread), atol=1e-5)
    assert np.all(got > np.asarray(mean))  # every state here has a spread
    # beta 0 is the mean itself; a model without a spread, or a negative beta, is refused
    plain = make_env(AgentConfig(), ensemble.log_time_model).reward.model
    assert not isinstance(plain, PessimisticLogTime)
    with pytest.raises(ValueError, match="gives no spread"):
        make_env(config, AnalyticLogTime())
    with pytest.raises(ValueError, match="uncertainty_penalty"):
        AgentConfig(uncertainty_penalty=-1.0)


def test_a_checkpoint_of_unknown_features_is_refused(ensemble, tmp_path):
    folder = ensemble.save(tmp_path / "old")
    meta = json.loads((folder / "model.json").read_text())
    (folder / "model.json").write_text(json.dumps({**meta, "feature_version": 3}))
    integrity.seal(folder)  # a whole checkpoint of the older version, not a damaged one
    with pytest.raises(ValueError, match="features version 3, this code computes version 5"):
        CostModel.load(folder)


def test_a_version_4_network_loads_and_reads_no_machine(one_program):
    """The shipped surrogate predates machine inputs: it loads, and its predictions do not
    move with the machine or the threads, while a network with machine inputs does."""
    from mlirrl_jax import shipped

    old = CostModel.load(shipped.SINGLE_MACHINE_SURROGATE)
    assert old.meta["feature_version"] == 4
    assert old.meta["train"]["model"]["machine_inputs"] is False
    program, machine, threads, states = one_program
    other = {**machine.to_json(), "bandwidth_gbs": 3.0 * machine.bandwidth_gbs}
    a = old.predict(machine_table([program], machine, 1), states)
    b = old.predict(machine_table([program], MachineProfile.from_json(other), 2), states)
    assert np.allclose(a, b, atol=1e-6)


def test_the_uncertain_source_picks_what_the_ensemble_is_least_sure_of(fit_run, tmp_path):
    from mlirrl_jax.collect import CollectConfig, CollectionJob, SpreadChooser
    from mlirrl_jax.shipped import SINGLE_MACHINE_SURROGATE
    from mlirrl_jax.surrogate.dataset import featurize, padded_actions

    programs = [load_program(u) for u in MEASURED_HERE]
    chooser = SpreadChooser(fit_run / "model", programs, threads=2)
    sampler = EpisodeSampler(programs, random_policy(0.25))
    drawn = [sampler.schedule(1, k) for k in jax.random.split(jax.random.PRNGKey(3), 8)]
    spreads = chooser.spreads(1, drawn)
    assert np.all(spreads > 0) and np.ptp(spreads) > 0
    assert chooser.most_uncertain(1, drawn) == int(np.argmax(spreads))
    # the same spreads from the schedules alone, replayed into states as a dataset is
    lanes = vector_lanes()
    actions = np.stack([padded_actions(programs[1], s, lanes) for s, _ in drawn])
    states, _ = featurize(chooser.table, np.full(len(drawn), 1, np.int32), actions)
    _, again = chooser.model.predict_with_spread(chooser.table, states)
    assert np.allclose(spreads, again, atol=1e-5)
    # a job of that source alone measures such picks
    config = CollectConfig(
        store=tmp_path / "u.db",
        budget=1,
        programs=tuple(MEASURED_HERE),
        baselines_of=("train",),
        mix=(("uncertain", 1.0),),
        surrogate=fit_run / "model",
        candidates=4,
        threads=2,
    )
    job = CollectionJob(config)
    try:
        tasks = job.tasks()
        for _ in job.programs:
            assert next(tasks).schedule.is_empty
        picks = [next(tasks) for _ in range(3)]
        assert all(not t.schedule.is_empty for t in picks)
    finally:
        job.store.close()
    for surrogate, words in [
        (None, "needs a surrogate ensemble"),
        (SINGLE_MACHINE_SURROGATE, "no spread"),
    ]:
        with pytest.raises(ValueError, match=words):
            SpreadChooser(surrogate, programs, threads=1)
