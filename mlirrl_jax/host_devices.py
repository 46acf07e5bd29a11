"""Every core of the host for batched JAX work (environment steps, surrogate predictions).

XLA's CPU backend runs most of one computation's elementwise work on one thread, so a batch
sharded over N host devices (one per core) runs up to N times as fast. The split must be made
before JAX's first computation: call `use_host_devices` first thing in a program.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlirrl_jax.shipped import user_cache_dir

FLAG = "--xla_force_host_platform_device_count"


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def use_host_devices(count: int | None = None) -> int:
    """Split the CPU into `count` XLA devices (default: the available cores); returns the
    device count. Raises if JAX already computed something with another device count."""
    count = count or available_cores()
    if count < 1:
        raise ValueError(f"host device count must be at least 1, got {count}")
    before = os.environ.get("XLA_FLAGS")
    flags = [f for f in (before or "").split() if not f.startswith(FLAG)]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{FLAG}={count}"])
    found = jax.local_device_count()  # initializes the backend with the flag
    if found != count:
        if before is None:
            del os.environ["XLA_FLAGS"]
        else:
            os.environ["XLA_FLAGS"] = before
        raise RuntimeError(
            f"JAX already runs on {found} device(s); call use_host_devices({count}) before "
            "the first JAX computation of the process"
        )
    return count


def compilation_cache_folder(directory: str | os.PathLike | None = None) -> str:
    """`directory`, else $JAX_COMPILATION_CACHE_DIR, else `xla` in the user's cache folder
    (`mlirrl_jax.shipped.user_cache_dir`: under $MLIRRL_HOME when it is set)."""
    chosen = directory or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return str(Path(chosen or user_cache_dir() / "xla").resolve())


def use_compilation_cache(directory: str | os.PathLike | None = None) -> str:
    """Keep XLA's compiled programs on disk, so that a rerun (a resumed training run, say)
    skips compiling them again, in `compilation_cache_folder(directory)`. Returns the folder."""
    chosen = compilation_cache_folder(directory)
    jax.config.update("jax_compilation_cache_dir", chosen)
    return chosen


def shard_rows(tree, devices: list | None = None):
    """The pytree with each array's leading axis split across `devices` (default: all); the
    row count must be a multiple of the device count."""
    devices = devices or jax.devices()
    rows = {a.shape[0] for a in jax.tree.leaves(tree)}
    if any(r % len(devices) for r in rows):
        raise ValueError(f"rows {sorted(rows)} do not split evenly over {len(devices)} devices")
    sharding = NamedSharding(Mesh(devices, ("rows",)), PartitionSpec("rows"))
    return jax.device_put(tree, sharding)


def replicate(tree, devices: list | None = None):
    """The pytree copied to every device (tables that every shard reads)."""
    devices = devices or jax.devices()
    return jax.device_put(tree, NamedSharding(Mesh(devices, ("rows",)), PartitionSpec()))


def on_each_device(fn, devices: list | None = None):
    """`fn(table, rows)` run by every device on its own rows: the rows' leading axis split over
    `devices` (default: all), the table replicated; the outputs' leading axes joined. Unlike
    jit over sharded inputs, each device runs `fn` as written for its part (a loop over chunks
    stays a loop per device instead of being partitioned)."""
    mesh = Mesh(devices or jax.devices(), ("rows",))
    return jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(PartitionSpec(), PartitionSpec("rows")),
        out_specs=PartitionSpec("rows"),
    )
