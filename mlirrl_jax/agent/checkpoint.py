"""Checkpoints of a training run (orbax): the whole `TrainingState` (network parameters,
optimizer state, environments mid-episode, RNG key, iteration) plus JSON metadata (the
config, the surrogate's identity, the observation version, the time trained).

Orbax writes each checkpoint to a temporary folder and renames it when complete, so a kill at
any moment leaves the previous checkpoint intact; the last three are kept. A checkpoint made
for another observation version refuses to load, naming both versions.
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from mlirrl_jax.env.observation import OBSERVATION_VERSION

KEEP = 3


class CheckpointError(ValueError):
    """A checkpoint that is missing or does not fit this code."""


def _manager(run_dir: Path) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        Path(run_dir).resolve() / "checkpoints",  # orbax needs an absolute path
        options=ocp.CheckpointManagerOptions(max_to_keep=KEEP, create=True),
    )


def save(run_dir: Path, state, meta: dict) -> int:
    """Write `state` (a TrainingState) with `meta` as the checkpoint of its iteration."""
    step = int(state.iteration)
    state = jax.device_get(state)  # host arrays: the checkpoint restores on any device layout
    meta = {**meta, "observation_version": OBSERVATION_VERSION, "iteration": step}
    with _manager(run_dir) as manager:
        if step in manager.all_steps():  # already saved (orbax would skip it silently)
            return step
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
        )
        manager.wait_until_finished()
    return step


def latest_step(run_dir: Path) -> int | None:
    """The iteration of the newest complete checkpoint, or None."""
    if not (Path(run_dir) / "checkpoints").is_dir():
        return None
    with _manager(run_dir) as manager:
        return manager.latest_step()


def load_meta(run_dir: Path, step: int | None = None) -> dict:
    """The metadata of a checkpoint (default: the newest), its observation version checked."""
    step = latest_step(run_dir) if step is None else step
    if step is None:
        raise CheckpointError(f"{run_dir}: no checkpoint here (checkpoints/ is missing or empty)")
    with _manager(run_dir) as manager:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    version = meta.get("observation_version")
    if version != OBSERVATION_VERSION:
        raise CheckpointError(
            f"{run_dir}: the policy was trained on observation version {version}; this code "
            f"observes version {OBSERVATION_VERSION}. Train a new agent on this version."
        )
    return meta


def restore(run_dir: Path, like, step: int | None = None):
    """(state, meta) of a checkpoint (default: the newest); `like` is a TrainingState (or
    its `jax.eval_shape`) giving the structure, shapes and dtypes to restore into."""
    meta = load_meta(run_dir, step)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    with _manager(run_dir) as manager:
        restored = manager.restore(
            meta["iteration"], args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
        )
    return restored["state"], meta


def _pure(tree):
    """A restored nnx.State (nested dicts with {"value": array} leaves) as a pure dict."""
    if isinstance(tree, dict):
        if set(tree) == {"value"}:
            return tree["value"]
        return {k: _pure(v) for k, v in tree.items()}
    return tree


def restore_params(run_dir: Path, like, step: int | None = None):
    """The policy parameters alone of a checkpoint (default: the newest), restored into the
    nnx.State `like` (a freshly built network's parameters: the structure and shapes)."""
    from flax import nnx

    meta = load_meta(run_dir, step)
    with _manager(run_dir) as manager:
        restored = manager.restore(
            meta["iteration"], args=ocp.args.Composite(state=ocp.args.StandardRestore())
        )
    nnx.replace_by_pure_dict(like, _pure(restored["state"]["params"]))
    return like
