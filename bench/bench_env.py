"""Jitted rollout throughput of the JAX environment with random masked actions.

256 environments (each on its own program from the dl-v0 train split) x 64 steps, one batched
step at a time, scanned under one jit; the analytic stand-in as the terminal reward. Compile
time is reported separately; steps/s is the median over repeats of the compiled rollout
(block_until_ready).

    python bench/bench_env.py [--envs 256] [--steps 64] [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp

from mlirrl_jax.env.jax_env import JaxEnv, sample_action
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program


def make_rollout(env: JaxEnv, table, pool, n_envs: int, n_steps: int):
    def rollout(key):
        params = env.reward.prepare((), table)
        states, timesteps = env.reset(params, table, pool, jax.random.split(key, n_envs))

        def one_step(carry, step_key):
            states, timesteps = carry
            keys = jax.random.split(step_key, n_envs)
            actions = jax.vmap(sample_action)(keys, timesteps.observation.mask)
            states, timesteps = env.step(params, table, pool, states, actions)
            return (states, timesteps), (timesteps.reward, timesteps.done, timesteps.invalid_action)

        _, (rewards, dones, invalid) = jax.lax.scan(
            one_step, (states, timesteps), jax.random.split(key, n_steps)
        )
        return rewards.sum(), dones.sum(), invalid.sum()

    return jax.jit(rollout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    programs = [load_program(e.uri) for e in suites.split("dl-v0", "train")]
    table = encode_programs(programs)
    pool = jnp.arange(len(programs))
    rollout = make_rollout(JaxEnv(), table, pool, args.envs, args.steps)
    key = jax.random.PRNGKey(0)
    start = time.perf_counter()
    compiled = rollout.lower(key).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(key))
    times = []
    episodes = invalid = 0
    for i in range(args.repeats):
        start = time.perf_counter()
        _, done, bad = jax.block_until_ready(compiled(jax.random.PRNGKey(i + 1)))
        times.append(time.perf_counter() - start)
        episodes += int(done)
        invalid += int(bad)
    steps = args.envs * args.steps
    median = statistics.median(times)
    print(
        f"date {time.strftime('%Y-%m-%d')}  machine {machine_fingerprint()['cpu_model']} "
        f"({os.cpu_count()} cores)  jax {jax.__version__} on {jax.devices()[0].platform}"
    )
    print(
        f"{len(programs)} programs in the table; {args.envs} envs x {args.steps} steps = {steps} steps"
    )
    print(f"jit compile: {compile_s:.2f} s")
    print(
        f"rollout: median {median * 1e3:.1f} ms over {args.repeats} repeats "
        f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})"
    )
    print(
        f"throughput: {steps / median:,.0f} env steps/s (median); episodes finished per "
        f"rollout: {episodes / args.repeats:.0f}; invalid actions: {invalid}"
    )


if __name__ == "__main__":
    main()
