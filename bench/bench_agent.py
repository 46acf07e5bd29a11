"""Throughput of the agent's training, in environment steps per second on this machine.

    python bench/bench_agent.py [--repeats 15] [--config FILE] [--surrogate DIR|analytic]

Three figures on the train split of the surrogate's suites, with the default `AgentConfig`
(or `--config`), on all host devices:
- the whole training iteration: rollout with the surrogate as the terminal reward, GAE and
  the PPO update, one jitted call;
- the environment alone: the same batched steps and reward with random masked actions;
- the surrogate alone: predictions per second of finished random states of the train
  programs, in batches as large as the environments.
The three run interleaved, each timed `--repeats` times after compiling; the medians are
printed with the spread. New surrogate weights are passed to the compiled iteration once, and
the iteration's trace count printed: one, since they do not recompile it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from mlirrl_jax.host_devices import use_host_devices

use_host_devices()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

from mlirrl_jax.agent.config import AgentConfig  # noqa: E402
from mlirrl_jax.agent.rollout import batched  # noqa: E402
from mlirrl_jax.agent.run import load_programs, training_suites  # noqa: E402
from mlirrl_jax.agent.surrogate import load_surrogate  # noqa: E402
from mlirrl_jax.agent.train import AXIS, make_train  # noqa: E402
from mlirrl_jax.env.jax_env import action_mask, sample_action, transition  # noqa: E402
from mlirrl_jax.env.state import initial_state  # noqa: E402
from mlirrl_jax.env.table import encode_programs  # noqa: E402
from mlirrl_jax.measure.fingerprint import machine_fingerprint  # noqa: E402
from mlirrl_jax.sampler import random_policy  # noqa: E402
from mlirrl_jax.splits import TRAIN  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--config", help="JSON file of AgentConfig fields")
    parser.add_argument("--surrogate", default="", help="cost model folder or 'analytic'")
    args = parser.parse_args()
    config = AgentConfig.from_json(json.loads(Path(args.config).read_text()) if args.config else {})
    surrogate = load_surrogate(args.surrogate or config.surrogate)
    programs = load_programs(TRAIN, training_suites(config, surrogate))
    table = encode_programs(programs)
    trainer = make_train(config, surrogate.model, table, np.arange(len(programs)))
    steps = config.envs * config.steps
    state = trainer.init(jax.random.PRNGKey(0), surrogate.params)
    reward_params = trainer.prepare(surrogate.params)
    traces = []

    def counted(*args):  # runs once per trace: new weights must not add one
        traces.append(1)
        return trainer.iteration(*args)

    iteration = jax.jit(counted)
    env, mesh = trainer.env, trainer.mesh()
    policy = batched(random_policy())

    def env_rollout(env_states, observation, reward_params, key):
        def step(carry, step_key):
            states, observation = carry
            actions = policy(step_key, observation)
            states, timestep = env.step(reward_params, table, trainer.pool, states, actions)
            return (states, timestep.observation), timestep.reward

        if trainer.devices > 1:
            key = jax.random.fold_in(key, jax.lax.axis_index(AXIS))
        return jax.lax.scan(step, (env_states, observation), jax.random.split(key, config.steps))

    split, whole = PartitionSpec(AXIS), PartitionSpec()
    env_only = jax.jit(
        jax.shard_map(
            env_rollout,
            mesh=mesh,
            in_specs=(split, split, whole, whole),
            out_specs=((split, split), PartitionSpec(None, AXIS)),
            check_vma=False,
        )
    )

    # finished random states of the train programs, predicted in batches of `envs`
    @jax.jit
    def random_finished(ids, key):
        def episode(program, key):
            def body(carry):
                state, k = carry
                k, sub = jax.random.split(k)
                return transition(table, state, sample_action(sub, action_mask(table, state)))[0], k

            start = (initial_state(table, program, key), key)
            return jax.lax.while_loop(lambda c: ~c[0].done, body, start)[0]

        return jax.vmap(episode)(ids, jax.random.split(key, ids.shape[0]))

    key = jax.random.PRNGKey(1)
    finished = random_finished(jax.random.randint(key, (config.envs,), 0, len(programs)), key)

    def surrogate_only(context, states):
        return env.reward.model.log_time(context, table, states)

    predict = jax.jit(
        jax.shard_map(
            surrogate_only, mesh=mesh, in_specs=(whole, split), out_specs=split, check_vma=False
        )
    )
    holder = {"state": state, "env": (state.env_states, state.observation)}

    def run_iteration():
        holder["state"], metrics = iteration(holder["state"], reward_params, 0.5)
        return metrics

    def run_env():
        holder["env"], rewards = env_only(*holder["env"], reward_params, jax.random.PRNGKey(2))
        return rewards

    def run_surrogate():
        return predict(reward_params.context, finished)

    benches = {
        "whole iteration (rollout + GAE + update)": (run_iteration, steps),
        "environment alone (random actions, surrogate reward)": (run_env, steps),
        "surrogate alone (predictions)": (run_surrogate, config.envs),
    }
    times = {name: [] for name in benches}
    for fn, _ in benches.values():
        jax.block_until_ready(fn())  # compile
    shifted = trainer.prepare(jax.tree.map(lambda a: a * 1.01, surrogate.params))
    holder["state"], metrics = iteration(holder["state"], shifted, 0.5)
    jax.block_until_ready(metrics)
    for _ in range(args.repeats):
        for name, (fn, _) in benches.items():
            started = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - started)
    print(
        f"machine {machine_fingerprint()['machine_id']}, {trainer.devices} device(s), "
        f"{len(programs)} train programs, {config.envs} envs x {config.steps} steps, network "
        f"width {config.network.width} ({config.network.mixing}), {config.epochs} epoch(s) x "
        f"{config.minibatches} minibatches; reward {config.reward} from the surrogate of machine "
        f"{surrogate.machine_id or '-'}; {args.repeats} interleaved repeats"
    )
    print(f"traces of the iteration, new surrogate weights included: {len(traces)}")
    print("| what | per second (median) | min | max |")
    print("|---|---|---|---|")
    for name, (_, count) in benches.items():
        rates = sorted(count / t for t in times[name])
        unit = "predictions" if "surrogate alone" in name else "env steps"
        print(
            f"| {name} | {statistics.median(rates):,.0f} {unit} | {rates[0]:,.0f} "
            f"| {rates[-1]:,.0f} |"
        )


if __name__ == "__main__":
    main()
