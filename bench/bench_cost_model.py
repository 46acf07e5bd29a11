"""Surrogate inference throughput under jit: states -> features -> predicted log time.

    python bench/bench_cost_model.py [--model data/cost_model] [--batch 4096] [--repeats 30]

Batched prediction from environment states (features included, as the reward computes it),
median over repeats with block_until_ready; without --model, a freshly initialized network of
the default configuration (the same computation).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp

from cost_model.api import CostModel
from cost_model.model import ModelConfig, build
from mlirrl_jax.env.state import encode_programs, initial_state
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if args.model:
        model = CostModel.load(args.model)
    else:
        graphdef, params = build(ModelConfig())
        model = CostModel(graphdef, params, 0.0, 1.0, {})
    programs = [load_program(e.uri) for e in suites.split("dl-v0", "train")]
    table = encode_programs(programs)
    ids = jnp.arange(args.batch) % len(programs)
    states = jax.vmap(lambda i: initial_state(table, i, jax.random.PRNGKey(0)))(ids)
    predict = jax.jit(model.predict)
    start = time.perf_counter()
    jax.block_until_ready(predict(table, states))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(predict(table, states))
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    params = sum(x.size for x in jax.tree.leaves(model.params))
    print(
        f"date {time.strftime('%Y-%m-%d')}  machine {machine_fingerprint()['cpu_model']} "
        f"({os.cpu_count()} cores)  jax {jax.__version__}; model {args.model or 'fresh'} "
        f"({params} parameters)"
    )
    print(
        f"batch {args.batch}: median {median * 1e3:.1f} ms over {args.repeats} repeats; "
        f"{args.batch / median:,.0f} predictions/s (features included); compile {compile_s:.1f} s"
    )


if __name__ == "__main__":
    main()
