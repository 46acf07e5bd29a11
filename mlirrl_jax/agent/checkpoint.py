"""Checkpoints of a training run (orbax): the whole `TrainingState` (network parameters,
optimizer state, environments mid-episode, RNG key, iteration) plus JSON metadata (the
config, the surrogate's identity, the observation and action-space versions, the time
trained).

Orbax writes each checkpoint to a temporary folder and renames it when complete, so a kill at
any moment leaves the previous checkpoint intact; the last three are kept. A checkpoint made
for another observation or action-space version refuses to load, naming both versions.

Each step folder carries a manifest of its files' sha256 (`mlirrl_jax.integrity`), written
once orbax has renamed the folder into place, and loading checks it before orbax reads a
byte: a damaged or missing file is one line naming it. A kill between orbax's rename and the
manifest leaves a step without one, which loads unverified, as checkpoints saved before
manifests do. A finished run's own files are sealed (`seal_run`, at the end of
`run.run_training`); saving a new step breaks that seal, so `save` removes the run's manifest.
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from mlirrl_jax import integrity
from mlirrl_jax.actions import ACTION_SPACE_VERSION
from mlirrl_jax.env.observation import OBSERVATION_VERSION
from mlirrl_jax.errors import Error

KEEP = 3
REDO = "retrain it (`mlirrl-jax train`)"


class CheckpointError(Error, ValueError):
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
    (Path(run_dir) / integrity.MANIFEST).unlink(missing_ok=True)  # the run changes
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
    integrity.seal(step_dir(run_dir, step))  # orbax has renamed the step folder into place
    return step


# a run's own files; other jobs write beside them (re-grounding's `regrounding/`, a
# validation's report, the lock) and may rewrite theirs later without breaking the seal
RUN_FILES = (
    "config.json",
    "summary.json",
    "baselines.json",
    "metrics.jsonl",
    "learning_curve.png",
    "README.md",
)


def seal_run(run_dir: Path) -> Path:
    """Seal a finished run: a manifest of its own files and checkpoints (`RUN_FILES`,
    `checkpoints/`), all of which `Agent.load` then checks; returns the manifest's path."""
    return integrity.seal(
        run_dir, only=lambda name: name in RUN_FILES or name.startswith("checkpoints/")
    )


def step_dir(run_dir: Path, step: int) -> Path:
    """The folder of a checkpoint step."""
    return Path(run_dir) / "checkpoints" / str(step)


def verify(run_dir: Path, step: int) -> None:
    """Check a step's files against its manifest, and the whole run's if it is the shipped
    agent's (which must be sealed); one line naming a damaged or missing file."""
    if integrity.must_be_sealed(run_dir):
        integrity.verify(run_dir, REDO)
    integrity.verify(step_dir(run_dir, step), REDO)


def _reading(run_dir: Path, step: int):
    """Orbax's errors on a damaged step without a manifest (saved before manifests, or cut
    off before its manifest) as one line naming the step folder."""
    return integrity.reading(step_dir(run_dir, step), REDO)


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
    verify(run_dir, step)
    with _reading(run_dir, step), _manager(run_dir) as manager:
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
    with _reading(run_dir, meta["iteration"]), _manager(run_dir) as manager:
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
    with _reading(run_dir, meta["iteration"]), _manager(run_dir) as manager:
        restored = manager.restore(
            meta["iteration"], args=ocp.args.Composite(state=ocp.args.StandardRestore())
        )
    nnx.replace_by_pure_dict(like, _pure(restored["state"]["params"]))
    return like
