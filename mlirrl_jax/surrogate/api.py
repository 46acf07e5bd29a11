"""`CostModel`: load / save / predict / update, the interface the reward and re-grounding use.

`predict(table, states)` maps a batch of environment states to predicted log run times;
`predict_with_spread` adds their uncertainty, the spread of an ensemble's members.
`log_time_model` hands the environment the same network as pure functions of `params`
(`SurrogateLogTime`), so the reward is a function of the weights, passed as an argument. The
machine (its profile) and the kernel's thread count are inputs, read from the table
(`encode_programs`): one model serves every machine it was fitted on, and predicts for others.
Its metadata names the machines (ids and profiles) and thread counts it was fitted on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from mlirrl_jax import integrity
from mlirrl_jax.env.features import (
    FEATURE_VERSION,
)
from mlirrl_jax.env.reward import AnalyticLogTime
from mlirrl_jax.env.state import EnvState, ProgramTable, slot_sizes, trim_ops, trim_table
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.host_devices import on_each_device
from mlirrl_jax.surrogate.dataset import Dataset, map_in_chunks
from mlirrl_jax.surrogate.model import (
    ModelConfig,
    apply,
    build,
)
from mlirrl_jax.surrogate.predict import (
    SurrogateLogTime,
    mean_and_spread,
    predict_log_time,
    predict_member_log_times,
    table_embeddings,
    uses_loop_tokens,
)
from mlirrl_jax.surrogate.train import TrainConfig, fit

# older feature versions a checkpoint may carry, and the network settings that read them:
# version 4 is version 5 less the machine's columns
READABLE_VERSIONS = {4: {"machine_inputs": False}, FEATURE_VERSION: {}}
PREDICT_CHUNK = 256  # rows per step of `CostModel.predictor`
REDO = "refit it (`mlirrl-jax fit-cost-model`)"


# jitted once per network structure: models of the same structure (a model and its updates)
# share the compiled functions
@functools.partial(jax.jit, static_argnums=0)
def _predict_features(graphdef, params, feats):
    return apply(graphdef, params, feats)


@functools.partial(jax.jit, static_argnums=0)
def _predict_states(graphdef, params, table: ProgramTable, states: EnvState):
    return predict_log_time(graphdef, params, *trim_ops(table, states))


@functools.partial(jax.jit, static_argnums=0)
def _predict_states_with_spread(graphdef, params, table: ProgramTable, states: EnvState):
    return mean_and_spread(predict_member_log_times(graphdef, params, *trim_ops(table, states)))


class CostModel:
    """The trained surrogate."""

    def __init__(self, graphdef, params, meta: dict):
        self.graphdef = graphdef
        self.params = params
        self.meta = meta

    # -- what `meta` says, typed (a checkpoint written before a key existed gives the default)
    @property
    def machine_id(self) -> str:
        """The machine the weights were last fitted or updated on (ids joined by commas for
        a fit on several)."""
        return self.meta.get("machine_id", "")

    @property
    def threads(self) -> int:
        """The thread count of the last fit or update."""
        return int(self.meta.get("threads", 1))

    @property
    def thread_counts(self) -> tuple[int, ...]:
        """Every thread count of the rows the weights learnt from."""
        return tuple(sorted(int(t) for t in self.meta.get("thread_counts") or ()))

    @property
    def machines(self) -> tuple[str, ...]:
        """Every machine whose rows the weights learnt from (a checkpoint of feature version 4
        names only its one machine's id)."""
        named = self.meta.get("machines")
        return tuple(sorted(named)) if named else tuple(self.machine_id.split(","))

    @property
    def suites(self) -> tuple[str, ...]:
        """The suites the fit's programs came from (empty: not recorded)."""
        return tuple(self.meta.get("suites") or ())

    @property
    def members(self) -> int:
        """Networks in the ensemble (1: a single network, no spread)."""
        return int(self.meta["train"]["model"].get("members", 1))

    @property
    def loop_tokens(self) -> bool:
        """Whether the network reads loop tokens (`uses_loop_tokens`)."""
        return uses_loop_tokens(self.params)

    @property
    def log_time_model(self) -> SurrogateLogTime:
        """The model as pure functions; its parameters are `self.params`."""
        return SurrogateLogTime(self.graphdef)

    @property
    def identity(self) -> dict:
        """What names these weights: the machine, the fit, the updates, a parameter hash."""
        digest = hashlib.sha256()
        for leaf in jax.tree.leaves(self.params):
            digest.update(np.asarray(leaf).tobytes())
        return {
            "machine_id": self.machine_id,
            "threads": self.threads,
            "feature_version": self.meta.get("feature_version"),
            "updates": self.meta.get("updates", 0),
            "params_sha256": digest.hexdigest()[:16],
        }

    # -- prediction
    def predict_features(self, feats) -> jax.Array:
        """Log times for a batch of `Features`."""
        return _predict_features(self.graphdef, self.params, feats)

    def predict(self, table: ProgramTable, states: EnvState) -> jax.Array:
        """Predicted log times of a batch of states (the network runs on the whole batch, over
        the table's op slots only: `trim_ops`)."""
        return _predict_states(self.graphdef, self.params, table, states)

    def predict_with_spread(
        self, table: ProgramTable, states: EnvState
    ) -> tuple[jax.Array, jax.Array]:
        """Predicted log times of a batch of states, as `predict`, and their uncertainty: the
        standard deviation of the ensemble members' log times (0 for a single network)."""
        return _predict_states_with_spread(self.graphdef, self.params, table, states)

    def _predict(self, table: ProgramTable, states: EnvState, embeddings=None) -> jax.Array:
        return predict_log_time(self.graphdef, self.params, table, states, embeddings)

    def _static_embeddings(self, table: ProgramTable):
        return table_embeddings(self.graphdef, self.params, table)

    def predictor(self, chunk: int = PREDICT_CHUNK, devices: list | None = None):
        """A jitted `(table, states) -> log times` (the same as `predict`) for large batches.

        The rows are split over `devices` (default: all host devices; call
        `use_host_devices` first; the table replicated, `host_devices.replicate`). Each device
        orders its rows by their programs' op counts and predicts them `chunk` at a time, each
        chunk over only as many op slots as its largest program has: the work follows the
        ops the states have, not the table's widest program, and a chunk's features and
        activations stay in cache. The rows must be a multiple of devices x chunk."""
        count = len(devices or jax.devices())

        def local(table: ProgramTable, states: EnvState) -> jax.Array:
            rows = states.program.shape[0]
            n_ops = table.n_ops[states.program]
            order = jnp.argsort(n_ops)  # fewest ops first
            chunks = jax.tree.map(
                lambda a: a[order].reshape(rows // chunk, chunk, *a.shape[1:]), states
            )
            embeddings = self._static_embeddings(table)  # once for all the chunks
            sizes = slot_sizes(table.op_slots)

            def branch(slots: int):
                cut_table = trim_table(table, slots)
                cut_embeddings = None if embeddings is None else embeddings[:, :, :slots]

                def run(part: EnvState) -> jax.Array:
                    return self._predict(cut_table, trim_ops(table, part, slots)[1], cut_embeddings)

                return run

            def one(part: EnvState) -> jax.Array:
                need = jnp.max(table.n_ops[part.program])
                which = jnp.searchsorted(jnp.asarray(sizes), need)
                return jax.lax.switch(which, [branch(s) for s in sizes], part)

            predicted = jax.lax.map(one, chunks).reshape(rows)
            return jnp.zeros_like(predicted).at[order].set(predicted)

        spread = on_each_device(local, devices)

        @jax.jit
        def predict(table: ProgramTable, states: EnvState) -> jax.Array:
            rows = states.program.shape[0]
            if rows % (count * chunk):
                raise ValueError(f"{rows} rows: the predictor takes multiples of {count * chunk}")
            return spread(table, states)

        return predict

    # -- training
    @classmethod
    def fit(
        cls,
        data: Dataset,
        config: TrainConfig | None = None,
        machine_id: str = "",
    ) -> tuple[CostModel, list]:
        """Fit on `data`; the meta records its machines (ids and profiles) and thread counts.
        `machine_id` names the machine in the meta (default: the data's, joined by commas
        when several)."""
        config = config or TrainConfig()
        graphdef, params, history = fit(data, config)
        machines, thread_counts = data.machines_and_threads()
        machine_id = machine_id or ",".join(machines)
        programs = len({p.hash for p in data.programs})
        meta = {
            "feature_version": FEATURE_VERSION,
            "machine_id": machine_id,
            # what callers that take one thread count read (the agent, validation's
            # heuristic): the smallest fitted
            "threads": thread_counts[0] if thread_counts else 1,
            "thread_counts": thread_counts,
            "machines": {m: data.profiles[m].to_json() for m in machines},
            "train": config.to_json(),
            "rows": len(data),
            "programs": programs,
            "lineage": [
                {
                    "step": "fit",
                    "machine_id": machine_id,
                    "machines": machines,
                    "thread_counts": thread_counts,
                    "rows": len(data),
                    "programs": programs,
                }
            ],
        }
        return cls(graphdef, params, meta), history

    def update(
        self,
        data: Dataset,
        epochs: int = 20,
        machine_id: str | None = None,
        anchor: Dataset | None = None,
        note: str = "",
        threads: int | None = None,
        trainable: str = "all",
    ) -> CostModel:
        """Fine-tune from the current weights on `data` (measurements of `machine_id` at
        `threads` per kernel; by default the model's own machine and thread count) and, if
        given, `anchor`: unmeasured states labeled by
        a frozen model (see `regrounding`), which keep what the weights knew where the new
        rows say nothing. `trainable="head"` changes the output layers only (at the fit's
        learning rate; all weights: a quarter of it). Returns the new model; its meta's
        `lineage` gains a step naming the machine, the rows and the prior weights."""
        config = TrainConfig(
            **{**self.meta["train"], "model": ModelConfig(**self.meta["train"]["model"])}
        )
        rate = config.learning_rate if trainable == "head" else config.learning_rate / 4
        config = replace(config, epochs=epochs, learning_rate=rate, trainable=trainable)
        train_on = data if anchor is None else data.concat(anchor)
        graphdef, params, _ = fit(train_on, config, init=(self.graphdef, self.params))
        machine = machine_id or self.machine_id
        threads = threads or self.threads
        step = {
            "step": "update",
            "machine_id": machine,
            "threads": threads,
            "rows": len(data),
            "programs": len({p.hash for p in data.programs}),
            "anchor_states": 0 if anchor is None else len(anchor),
            "epochs": epochs,
            **({"trainable": trainable} if trainable != "all" else {}),
            "from": self.identity,
            **({"note": note} if note else {}),
        }
        machines, thread_counts = data.machines_and_threads()
        profiles = {m: data.profiles[m].to_json() for m in machines}
        meta = {
            **self.meta,
            "machine_id": machine,
            "threads": threads,
            "thread_counts": sorted({*self.meta.get("thread_counts", []), *thread_counts}),
            "machines": {**self.meta.get("machines", {}), **profiles},
            "updates": self.meta.get("updates", 0) + 1,
            "rows": self.meta["rows"] + len(data),
            "prior": self.meta.get("prior") or self.identity,
            "lineage": [*self.lineage, step],
        }
        return CostModel(graphdef, params, meta)

    @property
    def lineage(self) -> list[dict]:
        """How these weights came to be: the fit (machine, rows) and each update since."""
        if "lineage" in self.meta:
            return list(self.meta["lineage"])
        fitted = {
            "step": "fit",
            "machine_id": self.meta.get("machine_id", ""),
            "rows": self.meta.get("rows", 0),
            "programs": self.meta.get("programs", 0),
        }
        return [fitted]

    # -- persistence
    def save(self, directory: str | os.PathLike) -> Path:
        """An orbax checkpoint (parameters) plus JSON metadata, in `directory`, sealed with a
        manifest of every file there (`mlirrl_jax.integrity`: files written beside the model
        before saving are covered too)."""
        directory = Path(directory).resolve()  # orbax needs absolute paths
        directory.mkdir(parents=True, exist_ok=True)
        meta = dict(self.meta)
        with ocp.CheckpointManager(
            directory / "checkpoint", options=ocp.CheckpointManagerOptions(max_to_keep=1)
        ) as manager:
            step = (manager.latest_step() or 0) + 1
            manager.save(
                step,
                args=ocp.args.Composite(
                    params=ocp.args.StandardSave(nnx.to_pure_dict(self.params)),
                    meta=ocp.args.JsonSave(meta),
                ),
            )
            manager.wait_until_finished()
        (directory / "model.json").write_text(json.dumps(meta, indent=1))
        integrity.seal(directory)
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CostModel:
        """The model saved in `directory`, its files checked against its manifest first."""
        directory = Path(directory).resolve()
        integrity.verify(directory, REDO)
        meta_path = directory / "model.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{directory}: no cost model here (model.json missing)")
        meta = integrity.read_json(meta_path, REDO)
        if not isinstance(meta, dict) or not isinstance(meta.get("train"), dict):
            raise integrity.damaged(meta_path, "damaged (no training config in it)", REDO)
        version = meta.get("feature_version")
        if version not in READABLE_VERSIONS:
            raise ConfigError(
                f"{directory}: features version {version}, this code computes version "
                f"{FEATURE_VERSION} and reads {sorted(READABLE_VERSIONS)}; retrain the model"
            )
        model_config = {**meta["train"]["model"], **READABLE_VERSIONS[version]}
        meta = {**meta, "train": {**meta["train"], "model": model_config}}
        graphdef, params = build(ModelConfig(**model_config))
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(params))
        checkpoint = directory / "checkpoint"
        with integrity.reading(checkpoint, REDO), ocp.CheckpointManager(checkpoint) as manager:
            restored = manager.restore(
                manager.latest_step(),
                args=ocp.args.Composite(params=ocp.args.StandardRestore(target)),
            )
        nnx.replace_by_pure_dict(params, restored["params"])
        model = cls(graphdef, params, meta)
        check_weights(model, directory)
        return model


def check_weights(model: CostModel, directory: Path) -> None:
    """Refuse weights holding NaN or infinity, damage that checksums sealed over them do not
    show: every prediction made with them, and so every reward and ranking, is NaN. Finite
    weights predict finite log times of finite features, so the weights are checked rather
    than predictions of probe states, whose features take seconds to compile at every start."""
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(model.params))[0]
    bad = {
        "/".join(str(getattr(k, "key", k)) for k in path): int(np.size(leaf))
        - int(np.isfinite(leaf).sum())
        for path, leaf in flat
    }
    bad = {name: count for name, count in bad.items() if count}
    if bad:
        raise integrity.damaged(
            directory,
            f"damaged (its weights hold {sum(bad.values())} NaN or infinite values, in "
            f"{integrity.listing(sorted(bad), 4)})",
            REDO,
        )


class AnalyticModel:
    """The roofline-style estimate behind the same interface: for comparison and tests."""

    meta = {"kind": "analytic"}
    params = ()
    log_time_model = AnalyticLogTime()
    identity = {"kind": "analytic"}

    @staticmethod
    @jax.jit
    def predict(table: ProgramTable, states: EnvState) -> jax.Array:
        return AnalyticLogTime().log_time((), table, states)

    def update(self, data: Dataset, epochs: int = 0, **_) -> AnalyticModel:
        return self  # nothing to learn

    def save(self, directory: str | os.PathLike) -> Path:
        directory = Path(directory).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "model.json").write_text(json.dumps(self.meta))
        integrity.seal(directory)
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> AnalyticModel:
        integrity.verify(directory, REDO)  # nothing to read, but a damaged folder says so
        return cls()


def predict_dataset(model, data: Dataset, chunk: int = 4096) -> np.ndarray:
    """Predicted log times of a dataset's rows, from the states their schedules reach."""
    return map_in_chunks(lambda states: model.predict(data.table, states), data.states, size=chunk)
