"""Surrogate inference throughput under jit: states -> features -> predicted log time.

    python bench/bench_cost_model.py [--model data/cost_model] [--members N] [--op-width W]
                                     [--batch 4096] [--repeats 30] [--devices N] [--chunk 256]

Batched prediction from environment states (features included, as the reward computes it),
median over repeats with block_until_ready; without --model, a freshly initialized network of
the default configuration, of --members networks or of --op-width tokens (the same
computation). The main figure is `CostModel.predictor`: the batch split over the devices, each
predicting its rows `--chunk` at a time; also printed: the whole batch in one `jit(predict)`,
and the features alone. `--devices N` splits the host CPU into N XLA devices
(`mlirrl_jax.host_devices`), the way a vectorized environment runs its batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp

from mlirrl_jax.env.features import features
from mlirrl_jax.env.state import initial_state
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.host_devices import replicate, shard_rows, use_host_devices
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program
from mlirrl_jax.surrogate.api import PREDICT_CHUNK, CostModel
from mlirrl_jax.surrogate.model import ModelConfig, build


def _timed(fn, table, states, repeats: int) -> tuple[float, float]:
    """(median seconds of a call, seconds of the first call: compilation included)."""
    start = time.perf_counter()
    jax.block_until_ready(fn(table, states))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(table, states))
        times.append(time.perf_counter() - start)
    return statistics.median(times), compile_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--members", type=int, help="without --model: ensemble size to time")
    parser.add_argument("--op-width", type=int, help="without --model: op token width to time")
    parser.add_argument("--devices", type=int, default=1, help="host devices to shard over")
    parser.add_argument("--chunk", type=int, default=PREDICT_CHUNK, help="rows per predictor step")
    args = parser.parse_args()
    use_host_devices(args.devices)  # before any JAX computation
    if args.model:
        model = CostModel.load(args.model)
    else:
        given = {"members": args.members, "op_width": args.op_width}
        config = ModelConfig(**{k: v for k, v in given.items() if v is not None})
        graphdef, params = build(config)
        model = CostModel(graphdef, params, {})
    programs = [load_program(e.uri) for e in suites.split("dl-v0", "train")]
    table = encode_programs(programs)
    ids = jnp.arange(args.batch) % len(programs)
    states = jax.vmap(lambda i: initial_state(table, i, jax.random.PRNGKey(0)))(ids)
    states, table = shard_rows(states), replicate(table)
    median, compile_s = _timed(model.predictor(args.chunk), table, states, args.repeats)
    whole, _ = _timed(jax.jit(model.predict), table, states, args.repeats)
    features_only, _ = _timed(
        jax.jit(jax.vmap(features, in_axes=(None, 0))), table, states, args.repeats
    )
    params = sum(x.size for x in jax.tree.leaves(model.params))
    print(
        f"date {time.strftime('%Y-%m-%d')}  machine {machine_fingerprint()['cpu_model']} "
        f"({os.cpu_count()} cores, {args.devices} XLA devices)  jax {jax.__version__}; "
        f"model {args.model or 'fresh'} "
        f"({params} parameters)"
    )
    print(
        f"batch {args.batch}: median {median * 1e3:.1f} ms over {args.repeats} repeats; "
        f"{args.batch / median:,.0f} predictions/s (features included; `predictor`, chunks of "
        f"{args.chunk} on each device); compile {compile_s:.1f} s"
    )
    print(f"the whole batch in one jit(predict): {args.batch / whole:,.0f} predictions/s")
    print(
        f"features alone: median {features_only * 1e3:.1f} ms, "
        f"{args.batch / features_only:,.0f} states/s"
    )


if __name__ == "__main__":
    main()
