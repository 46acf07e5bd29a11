"""A roofline-style estimate of a schedule's run time, in JAX: the stand-in reward.

Not a model of any machine in particular: compute time from the FLOPs at a scalar or vector
rate, memory time from the operands' bytes with a penalty for untiled ops whose data do not fit
in cache, divided by the threads a parallel tiling can use. It ranks schedules the way the real
pipeline mostly does (vectorized and tiled beats scalar and untiled), which is what a stand-in
needs; the surrogate trained on measurements replaces it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mlirrl_jax.env.state import EnvState, ProgramTable

SCALAR_FLOPS = 1.5e9  # per second, naive loops
VECTOR_FLOPS = 100e9  # per second, a good register tile
BANDWIDTH = 20e9  # bytes per second from memory
CACHE_BYTES = 1 << 20


def analytic_log_time(table: ProgramTable, state: EnvState, threads: int = 0) -> jax.Array:
    """Predicted natural-log run time (seconds) of the program under the state's schedule, on
    `threads` (0: the program's own count in the table)."""
    p = state.program
    threads = jnp.where(threads > 0, threads, table.threads[p]).astype(jnp.float32)
    valid = table.loop_valid[p]
    points = jnp.prod(jnp.where(valid, table.extents[p], 1).astype(jnp.float32), axis=1)
    flops = points * jnp.maximum(table.arith[p].sum(axis=1), 1.0)
    vector_points = jnp.prod(jnp.where(state.alive, state.extents, 1).astype(jnp.float32), axis=1)
    # a register tile of ~256 points keeps the FMA units busy; smaller ones pay overheads
    efficiency = jnp.clip(vector_points / 256.0, 1.0 / 16.0, 1.0)
    rate = jnp.where(state.vectorized, VECTOR_FLOPS * efficiency, SCALAR_FLOPS)
    tiled = (state.tile_sizes.max(axis=(1, 2)) > 0) | (state.parallel_sizes.max(axis=1) > 0)
    footprint = table.operand_bytes[p].sum(axis=1)
    locality = jnp.where(tiled | (footprint < CACHE_BYTES), 1.0, 4.0)
    # a fused producer's result never goes to memory
    memory = jnp.where(state.fused_into >= 0, 0.5, 1.0) * footprint * locality / BANDWIDTH
    chunks = jnp.prod(
        jnp.where(
            state.parallel_sizes > 0, table.extents[p] // jnp.maximum(state.parallel_sizes, 1), 1
        ),
        axis=1,
    )
    owner = jnp.where(
        state.fused_into >= 0, state.fused_into, jnp.arange(state.fused_into.shape[0])
    )
    speedup = jnp.minimum(threads, chunks[owner].astype(jnp.float32))
    time = (flops / rate + memory) / speedup
    total = jnp.sum(jnp.where(table.op_valid[p], time, 0.0))
    return jnp.log(total + 1e-9)
