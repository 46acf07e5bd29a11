"""The PPO agent: GAE, masked heads, per-kind log-probabilities, learning, resuming, loading."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mlirrl_jax.actions import (
    INTERCHANGE,
    MAX_LOOPS,
    N_TILE_CHOICES,
    NEXT,
    TILE,
    USES_POINTER,
    USES_TILES,
)
from mlirrl_jax.agent import checkpoint
from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.agent.config import AgentConfig, NetworkConfig
from mlirrl_jax.agent.losses import compute_gae
from mlirrl_jax.agent.networks import act, build, distribution, log_prob_entropy
from mlirrl_jax.agent.train import budget_share, make_train
from mlirrl_jax.cli import main
from mlirrl_jax.env.jax_env import JaxEnv, sample_action, tile_mask_of
from mlirrl_jax.env.reward import AnalyticLogTime
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.splits import TRAIN

SMALL = AgentConfig(envs=32, steps=8, epochs=2, minibatches=2, devices=1, surrogate="analytic")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def programs(kernel_programs):
    return kernel_programs


@pytest.fixture(scope="module")
def table(kernel_table):
    return kernel_table


def test_gae_matches_a_plain_python_loop():
    rng = np.random.default_rng(0)
    steps, envs, gamma, lam = 12, 5, 0.97, 0.9
    rewards = rng.normal(size=(steps, envs)).astype(np.float32)
    values = rng.normal(size=(steps, envs)).astype(np.float32)
    terminated = rng.random((steps, envs)) < 0.2
    truncated = (rng.random((steps, envs)) < 0.1) & ~terminated
    bootstrap = rng.normal(size=envs).astype(np.float32)
    expected = np.zeros((steps, envs))
    for e in range(envs):
        following = 0.0
        for t in reversed(range(steps)):
            if truncated[t, e]:  # a cut step teaches nothing and stops the estimate
                following = 0.0
                continue
            next_value = bootstrap[e] if t == steps - 1 else values[t + 1, e]
            alive = 0.0 if terminated[t, e] else 1.0
            delta = rewards[t, e] + gamma * alive * next_value - values[t, e]
            following = delta + gamma * lam * alive * following
            expected[t, e] = following
    advantages, targets = compute_gae(
        jnp.asarray(rewards),
        jnp.asarray(values),
        jnp.asarray(np.where(terminated, 0.0, 1.0), jnp.float32),
        jnp.asarray(truncated),
        jnp.asarray(bootstrap),
        gamma,
        lam,
    )
    assert np.allclose(advantages, expected, atol=1e-5)
    assert np.allclose(targets, expected + values, atol=1e-5)


@pytest.fixture(scope="module")
def observations(table):
    """Observations of 384 states that random masked episodes reach (every kind of op)."""
    env = JaxEnv()
    params = env.reward.prepare(None, table)
    pool = jnp.arange(table.n_programs)
    count = 32

    @jax.jit
    def collect(key):
        states, timestep = env.reset(params, table, pool, jax.random.split(key, count))

        def body(carry, step_key):
            states, timestep = carry
            actions = jax.vmap(lambda k, m: sample_action(k, m, 0.3))(
                jax.random.split(step_key, count), timestep.observation.mask
            )
            states, timestep = env.step(params, table, pool, states, actions)
            return (states, timestep), timestep.observation

        return jax.lax.scan(body, (states, timestep), jax.random.split(key, 12))[1]

    stacked = collect(jax.random.PRNGKey(3))  # (12, count)
    return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), stacked)


@jax.jit
def _distribution(params, observations, kind):
    network = nnx.merge(GRAPHDEF, params)
    return distribution(network, network.encode(observations), observations, kind)


GRAPHDEF = build(NetworkConfig())[0]


def test_masked_choices_have_probability_zero_and_are_never_sampled(observations):
    graphdef, params = build(NetworkConfig(), seed=1)
    # large weights: sharp logits, so that masking (not small logits) keeps choices out
    params = jax.tree.map(lambda a: a * 8.0, params)
    sample = jax.jit(lambda key: act(graphdef, params, observations, key)[0])
    mask = observations.mask
    seen_kinds = set()
    for draw in range(10):
        actions = np.asarray(sample(jax.random.PRNGKey(draw)))
        kind, pointer, tiles = actions[:, 0], actions[:, 1], actions[:, 2:]
        rows = np.arange(len(kind))
        assert np.asarray(mask.kind)[rows, kind].all()
        tile_mask = np.asarray(tile_mask_of(mask, jnp.asarray(kind)))
        legal_tiles = np.take_along_axis(tile_mask, tiles[..., None], axis=-1)[..., 0]
        assert legal_tiles.all()
        pointer_ok = np.asarray(mask.pointer)[rows, pointer]
        uses_pointer = USES_POINTER[kind]
        assert pointer_ok[uses_pointer].all()
        seen_kinds |= set(kind.tolist())
    assert {NEXT, TILE, INTERCHANGE} <= seen_kinds and len(seen_kinds) >= 4  # not only `next`
    # every masked choice's probability is exactly zero
    dist = _distribution(params, observations, jnp.full(len(kind), TILE))
    kinds = jax.nn.softmax(dist.kind, axis=-1)
    assert float(jnp.where(mask.kind, 0.0, kinds).max()) == 0.0
    tiles = jax.nn.softmax(dist.tiles, axis=-1)
    assert float(jnp.where(mask.tile, 0.0, tiles).max()) == 0.0


def test_an_actions_log_probability_counts_only_the_heads_its_kind_uses(observations):
    _, params = build(NetworkConfig(), seed=2)
    rows = observations.cursor.shape[0]
    rng = np.random.default_rng(0)
    for kind in (NEXT, TILE, INTERCHANGE):
        dist = _distribution(params, observations, jnp.full(rows, kind))
        base = np.zeros((rows, 2 + MAX_LOOPS), np.int32)
        base[:, 0] = kind
        other = base.copy()
        other[:, 1] = rng.integers(0, MAX_LOOPS, rows)
        other[:, 2:] = rng.integers(0, N_TILE_CHOICES, (rows, MAX_LOOPS))
        lp_base, _ = log_prob_entropy(dist, jnp.asarray(base))
        lp_other, _ = log_prob_entropy(dist, jnp.asarray(other))
        # by hand: the kind's log-probability plus those of the heads it uses
        log_kind = jax.nn.log_softmax(dist.kind, -1)[:, kind]
        log_tiles = jax.nn.log_softmax(dist.tiles, -1)
        log_pointer = jax.nn.log_softmax(dist.pointer, -1)
        expected = np.asarray(log_kind).copy()
        if USES_TILES[kind]:
            taken = jnp.take_along_axis(log_tiles, jnp.asarray(other[:, 2:])[..., None], -1)
            expected += np.asarray(taken[..., 0].sum(-1))
        if USES_POINTER[kind]:
            expected += np.asarray(log_pointer[np.arange(rows), other[:, 1]])
        assert np.allclose(lp_other, expected, atol=1e-4)
        changed = ~np.isclose(np.asarray(lp_base), np.asarray(lp_other), atol=1e-6)
        if kind == NEXT:
            assert not changed.any()  # neither tiles nor pointer count
        else:
            assert changed.any()  # its own head counts


# One run's config for the tests below: a straight run in this process, and the same run
# killed in another process and resumed here. dl-v0's train split, the analytic reward.
RUN = replace(
    SMALL,
    envs=64,
    steps=16,
    iterations=16,
    checkpoint_seconds=0.0,
    eval_every=0,  # no evaluation on the test programs: this is about resuming
    suites=("dl-v0",),
)


@pytest.fixture(scope="module")
def straight_run():
    """The run without interruption: its metrics per iteration and its final state."""
    from mlirrl_jax.agent.run import load_programs

    table = encode_programs(load_programs(TRAIN, RUN.suites))
    trainer = make_train(RUN, AnalyticLogTime(), table, np.arange(table.n_programs))
    iteration = jax.jit(chex.assert_max_traces(trainer.iteration, n=1))  # traced once
    state = trainer.init(jax.random.PRNGKey(RUN.seed), ())
    reward_params = trainer.prepare(())
    history = []
    for i in range(RUN.iterations):  # as `run_training` calls it
        state, metrics = iteration(state, reward_params, budget_share(i, RUN.iterations))
        history.append({k: float(v) for k, v in metrics.items()})
    return history, jax.device_get(state), (trainer, iteration, reward_params)


@pytest.mark.trains
def test_training_on_the_analytic_reward_raises_the_return(straight_run):
    history, _, _ = straight_run
    returns = [m["mean_log_speedup"] for m in history]
    assert all(m["invalid_actions"] == 0.0 and m["episodes"] > 0 for m in history)
    assert np.mean(returns[-3:]) > np.mean(returns[:3]) + 0.5, returns


@pytest.mark.trains
def test_a_killed_run_resumes_exactly_where_it_would_have_gone(straight_run, tmp_path, capsys):
    from mlirrl_jax.agent.run import run_training

    config_path = tmp_path / "config.json"
    config_path.write_text(RUN.dumps())
    run = tmp_path / "run"
    command = [sys.executable, "-m", "mlirrl_jax.cli", "train", "--out", str(run)]
    process = subprocess.Popen(
        [*command, "--config", str(config_path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline and (checkpoint.latest_step(run) or 0) < 3:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # mid-run, at any moment
    process.wait()
    stopped_at = checkpoint.latest_step(run)
    assert stopped_at is not None and 3 <= stopped_at < RUN.iterations
    summary = run_training(run, resume=True)
    assert summary["iterations"] == RUN.iterations
    _, expected, _ = straight_run
    restored, _ = checkpoint.restore(run, expected)
    pairs = zip(
        jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree_util.tree_leaves(restored)
    )
    for (path, leaf), again in pairs:  # parameters, optimizer state, RNG key, environments
        assert np.array_equal(np.asarray(again), np.asarray(leaf)), jax.tree_util.keystr(path)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == list(range(1, RUN.iterations + 1))
    assert (run / "learning_curve.png").is_file()
    # the trained agent: schedules of a program, distinct, best first, as real Schedules
    agent = Agent.load(run)
    program = "suite://dl-v0/add_1x56x56x64"
    chosen = agent.scored_schedules([program], n=3)[0]
    assert 1 <= len(chosen) <= 3 and all(isinstance(s.schedule, Schedule) for s in chosen)
    assert len({s.schedule.hash for s in chosen}) == len(chosen)
    speedups = [s.predicted_speedup for s in chosen]
    assert speedups == sorted(speedups, reverse=True)
    assert agent.schedules(program) == agent.schedules(program)  # greedy: deterministic
    # measured for real beside the unscheduled program and the heuristic, verified
    from mlirrl_jax.measure.runner import Runner
    from mlirrl_jax.measure.timing import TimingMethod
    from mlirrl_jax.programs.ir import load_program

    with Runner(timeout_s=60) as runner:
        method = TimingMethod(min_repeats=3, min_time_s=0.01)
        base = runner.measure(load_program(program), None, method=method)
        tuned = runner.measure(load_program(program), chosen[0].schedule, method=method)
    assert base.verified and tuned.ok and tuned.verified and tuned.median_s > 0
    # and shown on the command line, with its transform script
    assert main(["show", program, "--agent", str(run), "-n", "2"]) == 0
    shown = capsys.readouterr().out
    assert "agent schedule 1/" in shown and "transform.named_sequence" in shown


@pytest.mark.trains
def test_train_runs_the_same_iterations_in_one_scan(straight_run):
    _, _, (trainer, iteration, reward_params) = straight_run
    trainer = replace(trainer, config=replace(trainer.config, iterations=3))
    key = jax.random.PRNGKey(4)
    scanned, metrics = jax.jit(trainer.train)(key, ())
    assert metrics["loss"].shape == (3,)
    state = trainer.init(key, ())
    for i in range(3):  # the straight run's compiled iteration, called one at a time
        state, _ = iteration(state, reward_params, budget_share(i, 3))
    for a, b in zip(jax.tree.leaves(scanned.params), jax.tree.leaves(state.params)):
        assert np.allclose(a, b, atol=1e-5)


def test_a_machine_or_thread_count_the_surrogate_was_not_fitted_on_is_warned_of(
    tmp_path, monkeypatch
):
    import logging

    from mlirrl_jax.agent.surrogate import Surrogate, check_this_machine, load_surrogate
    from mlirrl_jax.host_devices import available_cores
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.shipped import SHIPPED_SURROGATE

    class Lines(logging.Handler):
        """The check's own log lines, whatever other tests in this process did to the
        loggers above it (the CLI's handlers, a level set by -q)."""

        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    checking = logging.getLogger("mlirrl_jax.agent.surrogate")
    lines = Lines()
    monkeypatch.setattr(checking, "handlers", [lines])
    monkeypatch.setattr(checking, "propagate", False)
    monkeypatch.setattr(checking, "level", logging.WARNING)

    def warnings(surrogate, threads) -> list[str]:
        lines.lines.clear()
        check_this_machine(surrogate, threads)
        return list(lines.lines)

    # the check reads what names the surrogate and its fit's metrics, not its weights
    shipped = Surrogate(None, None, {"kind": "surrogate"}, (), str(SHIPPED_SURROGATE), (1, 2))
    here = machine_fingerprint()["machine_id"]
    held_out = json.loads((Path(shipped.path) / "metrics.json").read_text())["surrogate"]
    [line] = warnings(replace(shipped, fitted_machines=("elsewhere", "yonder")), [1])
    assert f"this machine ({here}) is not among" in line and "(elsewhere, yonder)" in line
    assert "no score of it on a machine left out of its fit is recorded" in line
    assert f"held-out Spearman {held_out['spearman']:.2f}" in line
    assert "`make demo`" in line and "train --out RUN --rounds N" in line
    # a score the fit recorded of a machine left out of it is given instead
    left_out = {"leave_one_machine_out": {"spearman": 0.702, "mape_speedup": 0.723}}
    (tmp_path / "metrics.json").write_text(json.dumps(left_out))
    [line] = warnings(replace(shipped, path=str(tmp_path), fitted_machines=("elsewhere",)), [1])
    assert "left out of its fit it scored Spearman 0.70, MAPE 72% there" in line
    known = replace(shipped, fitted_machines=(here, "elsewhere"), fitted_threads=(1, 2))
    assert warnings(known, [1, 2][: available_cores()]) == []
    beyond = available_cores() + 1
    more, extrapolated = warnings(replace(known, fitted_threads=(1,)), [beyond])
    assert f"--threads {beyond} is more than the {available_cores()} cores" in more
    assert f"fitted at 1 thread(s) only, so its predictions at {beyond}" in extrapolated
    assert warnings(load_surrogate("analytic"), [1]) == []  # fitted on nothing


TWO_DEVICES = """
import jax, numpy as np
from mlirrl_jax.host_devices import use_host_devices
assert use_host_devices(2) == 2
from pathlib import Path
from mlirrl_jax.agent import checkpoint
from mlirrl_jax.agent.config import AgentConfig
from mlirrl_jax.agent.train import make_train
from mlirrl_jax.env.reward import AnalyticLogTime
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program
programs = [load_program(e.uri) for e in suites.split("dl-v0", "train")[:12]]
table = encode_programs(programs)
config = AgentConfig(envs=16, steps=4, minibatches=2, surrogate="analytic", iterations=4)
trainer = make_train(config, AnalyticLogTime(), table, np.arange(len(programs)))
assert trainer.devices == 2
state, reward_params = trainer.init(jax.random.PRNGKey(0), ()), trainer.prepare(())
assert len(state.env_states.program.sharding.device_set) == 2
iteration = jax.jit(trainer.iteration)
for i in range(2):
    state, metrics = iteration(state, reward_params, i / 4)
assert np.isfinite(float(metrics["loss"])) and float(metrics["episodes"]) > 0
# the parameters stay the same on both devices (gradients averaged across them)
shards = [np.asarray(s.data) for s in jax.tree.leaves(state.params)[0].addressable_shards]
assert len(shards) == 2 and np.array_equal(shards[0], shards[1])
run = Path(__import__("sys").argv[1])
checkpoint.save(run, state, {"config": config.to_json()})
back, _ = checkpoint.restore(run, jax.eval_shape(lambda: state))
back = trainer.place(back)
again, _ = iteration(back, reward_params, 0.5)
ahead, _ = iteration(state, reward_params, 0.5)
for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(ahead)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
print("ok")
"""


@pytest.mark.trains
def test_two_devices_split_the_environments_and_share_the_parameters(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(TWO_DEVICES)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_a_checkpoint_of_another_observation_version_refuses_to_load(tmp_path, table, monkeypatch):
    trainer = make_train(SMALL, AnalyticLogTime(), table, np.arange(table.n_programs))
    state = trainer.init(jax.random.PRNGKey(0), ())
    checkpoint.save(tmp_path, state, {"config": SMALL.to_json()})
    assert checkpoint.load_meta(tmp_path)["iteration"] == 0
    monkeypatch.setattr(checkpoint, "OBSERVATION_VERSION", checkpoint.OBSERVATION_VERSION + 1)
    with pytest.raises(checkpoint.CheckpointError, match="observation version"):
        checkpoint.load_meta(tmp_path)
    monkeypatch.undo()
    monkeypatch.setattr(checkpoint, "ACTION_SPACE_VERSION", checkpoint.ACTION_SPACE_VERSION + 1)
    with pytest.raises(checkpoint.CheckpointError, match="action space version"):
        checkpoint.load_meta(tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint"):
        checkpoint.load_meta(tmp_path / "elsewhere")


def test_configs_refuse_bad_values_and_unknown_keys():
    with pytest.raises(ValueError, match="reward"):
        AgentConfig(reward="dense")
    with pytest.raises(ValueError, match="unknown config keys"):
        AgentConfig.from_json({"envs": 8, "learning_rat": 0.1})
    with pytest.raises(ValueError, match="minibatches"):
        AgentConfig(envs=10, steps=3, minibatches=4)
    config = AgentConfig.from_json({"envs": 8, "network": {"width": 16}})
    assert AgentConfig.from_json(json.loads(config.dumps())) == config


@pytest.mark.trains
def test_a_run_can_start_from_the_shipped_agents_policy(tmp_path):
    from mlirrl_jax.agent.networks import abstract
    from mlirrl_jax.agent.run import RunError, run_training
    from mlirrl_jax.shipped import SHIPPED_AGENT

    if not (SHIPPED_AGENT / "checkpoints").is_dir():
        pytest.skip("no shipped agent in data/agent")
    shipped = AgentConfig.from_json(checkpoint.load_meta(SHIPPED_AGENT)["config"])
    config = replace(
        SMALL, network=shipped.network, iterations=1, eval_every=0, checkpoint_seconds=0.0
    )
    run = tmp_path / "from-shipped"
    run_training(run, config, init_agent=SHIPPED_AGENT)
    like = abstract(shipped.network)[1]
    theirs = checkpoint.restore_params(SHIPPED_AGENT, like)
    start = checkpoint.restore_params(
        run, abstract(shipped.network)[1], checkpoint.load_meta(run, 0)
    )
    same = jax.tree.map(
        lambda a, b: bool(np.array_equal(a, b)), nnx.to_pure_dict(theirs), nnx.to_pure_dict(start)
    )
    assert all(jax.tree.leaves(same))  # the run's first checkpoint holds the shipped policy
    other = replace(config, network=replace(shipped.network, width=shipped.network.width * 2))
    with pytest.raises(RunError, match="network"):
        run_training(tmp_path / "other", other, init_agent=SHIPPED_AGENT)


def test_the_thread_count_in_the_observation_changes_the_parallel_tile_choice(programs):
    """The same states at one and two threads per kernel: the observation carries the count
    (and, per parallel tile, the share of the threads its chunks keep busy), so the policy's
    parallel-tile head answers differently."""
    from mlirrl_jax.actions import TILE_PARALLEL
    from mlirrl_jax.env.observation import CANDIDATE_OBS

    env = JaxEnv()
    keys = jax.random.split(jax.random.PRNGKey(0), 16)
    seen = {}
    for threads in (1, 2):
        table = encode_programs(programs, threads=threads)
        params = env.reward.prepare(None, table)
        _, timestep = env.reset(params, table, jnp.arange(table.n_programs), keys)
        seen[threads] = timestep.observation
    one, two = seen[1], seen[2]
    legal = np.asarray(one.mask.kind[:, TILE_PARALLEL])
    assert legal.any()
    # the masks and every feature but the thread count's own are the same states' features
    assert np.array_equal(np.asarray(one.mask.parallel_tile), np.asarray(two.mask.parallel_tile))
    assert np.array_equal(np.asarray(one.loops), np.asarray(two.loops))
    assert not np.array_equal(np.asarray(one.ops), np.asarray(two.ops))
    busy = CANDIDATE_OBS - 1
    offered = np.asarray(one.candidates[..., 1]) > 0
    assert np.all(np.asarray(one.candidates[..., busy])[offered] == 1.0)  # one thread: always busy
    assert np.any(np.asarray(two.candidates[..., busy])[offered] < 1.0)  # an odd chunk count
    graphdef, net = build(NetworkConfig(), seed=1)
    kind = jnp.full(len(legal), TILE_PARALLEL)

    def parallel_tile_probabilities(obs):
        network = nnx.merge(graphdef, net)
        dist = distribution(network, network.encode(obs), obs, kind)
        return np.asarray(jax.nn.softmax(dist.tiles, axis=-1))[legal]

    p1, p2 = parallel_tile_probabilities(one), parallel_tile_probabilities(two)
    assert np.allclose(p1.sum(-1), 1.0) and np.allclose(p2.sum(-1), 1.0)
    assert np.abs(p1 - p2).max() > 1e-3
