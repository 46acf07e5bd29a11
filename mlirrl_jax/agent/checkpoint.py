"""Checkpoints of a training run (orbax): the whole `TrainingState` (network parameters,
optimizer state, environments mid-episode, RNG key, iteration) plus JSON metadata (the
config, the surrogate's identity, the observation and action-space versions, the time
trained).

Orbax writes each checkpoint to a temporary folder and renames it when complete, so a kill at
any moment leaves the previous checkpoint intact; the last three are kept. A checkpoint made
for another observation or action-space version refuses to load, naming both versions.
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from mlirrl_jax.actions import ACTION_SPACE_VERSION
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
    meta = {
        **meta,
        "observation_version": OBSERVATION_VERSION,
        "action_space_version": ACTION_SPACE_VERSION,
        "iteration": step,
    }
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
    """The iteration of the newest complete checkpoint, or None.

    Read from the folder names, not through a CheckpointManager: a reader may look while the
    training process writes a checkpoint and deletes the oldest, and a manager opened then
    fails on the folder that vanished under it. Orbax writes under a temporary name and
    renames when complete, so a folder named by its step alone holds a whole checkpoint.
    """
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    steps = []
    for entry in folder.iterdir():
        if entry.name.isdigit() and (entry / "_CHECKPOINT_METADATA").exists():
            steps.append(int(entry.name))
    return max(steps, default=None)


def load_meta(run_dir: Path, step: int | None = None) -> dict:
    """The metadata of a checkpoint (default: the newest), its observation version checked."""
    step = latest_step(run_dir) if step is None else step
    if step is None:
        raise CheckpointError(f"{run_dir}: no checkpoint here (checkpoints/ is missing or empty)")
    with _manager(run_dir) as manager:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    for what, current in (
        ("observation", OBSERVATION_VERSION),
        ("action_space", ACTION_SPACE_VERSION),
    ):
        version = meta.get(f"{what}_version")
        if version != current:
            raise CheckpointError(
                f"{run_dir}: the policy was trained on {what.replace('_', ' ')} version "
                f"{version}; this code has version {current}. Train a new agent on this version."
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


def restore_params(run_dir: Path, like, meta: dict | None = None):
    """The policy parameters alone of a checkpoint (of `meta`, from `load_meta`; default:
    the newest), restored into the nnx.State `like` (the network's parameters or their
    shapes, `networks.abstract`)."""
    from flax import nnx

    meta = meta or load_meta(run_dir)
    with _manager(run_dir) as manager:
        restored = manager.restore(
            meta["iteration"], args=ocp.args.Composite(state=ocp.args.StandardRestore())
        )
    nnx.replace_by_pure_dict(like, _pure(restored["state"]["params"]))
    return like
