"""Training the surrogate with optax: regression on log time plus within-program pair losses.

Batches hold a few rows of each of several programs, so that every batch has many pairs of
schedules of the same program: the pair losses train differences of predicted log time (the
predicted speedups the reward uses) and their order.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mlirrl_jax.env.state import slot_sizes
from mlirrl_jax.surrogate.config import TrainConfig
from mlirrl_jax.surrogate.dataset import Dataset, map_in_chunks, random_states
from mlirrl_jax.surrogate.model import apply, build
from mlirrl_jax.surrogate.teacher import fit_tree_teacher
from mlirrl_jax.util.progress import progress_bar

STEPS_PER_CALL = 50  # training steps per jitted call (a scan): fewer dispatches and copies
# batches are drawn this many at a time and grouped by the op slots they need (see
# `_slot_ordered`); their order within a window hardly matters to the learning rate schedule
ORDER_WINDOW = 1000
HEAD_LAYERS = ("out_hidden", "out")  # the layers a "head" fit changes


def _trainable_labels(params, trainable: str):
    """Per parameter leaf: "train" or "freeze" (optax.multi_transform's labels)."""

    def label(path, _):
        # the module's own attribute, the path's first key (an attention layer has an "out" too)
        layer = str(getattr(path[0], "key", getattr(path[0], "name", path[0])))
        return "train" if trainable == "all" or layer in HEAD_LAYERS else "freeze"

    return jax.tree_util.tree_map_with_path(label, params)


def loss_fn(graphdef, params, features, target, program, config: TrainConfig):
    """Squared error + within-program difference and ranking losses (log seconds), summed over
    ensemble members; every array has a leading member axis: each member its own batch."""

    def member(p, f, t, prog):
        return _member_loss(nnx.merge(graphdef, p)(f), t, prog, config)

    total, parts = jax.vmap(member)(params, features, target, program)
    return total.sum(), jax.tree.map(jnp.mean, parts)


def _member_loss(predicted, target, program, config: TrainConfig):
    mse = jnp.mean((predicted - target) ** 2)
    same = (program[:, None] == program[None, :]) & ~jnp.eye(program.shape[0], dtype=bool)
    diff_pred = predicted[:, None] - predicted[None, :]
    diff_true = target[:, None] - target[None, :]
    pairs = jnp.maximum(same.sum(), 1)
    difference = jnp.sum(jnp.where(same, (diff_pred - diff_true) ** 2, 0.0)) / pairs
    ordered = same & (jnp.abs(diff_true) > 0.02)
    rank = jnp.sum(jnp.where(ordered, jax.nn.softplus(-jnp.sign(diff_true) * diff_pred), 0.0))
    rank = rank / jnp.maximum(ordered.sum(), 1)
    total = mse + config.difference_weight * difference + config.rank_weight * rank
    parts = {"mse": mse, "difference": difference, "rank": rank}
    if config.listwise_weight:
        parts["listwise"] = _listwise(predicted, target, program, config.listwise_temperature)
        total = total + config.listwise_weight * parts["listwise"]
    return total, parts


def _listwise(predicted, target, program, temperature: float):
    """ListNet over each row's program: the cross-entropy of the softmax over -predicted log
    times against the softmax over -measured ones, averaged over rows (zero entropy term left
    in: a constant of the data)."""
    group = program[:, None] == program[None, :]
    scores = lambda x: jnp.where(group, -x[None, :] / temperature, -jnp.inf)  # noqa: E731
    truth = jax.nn.softmax(scores(target), axis=1)
    log_predicted = jax.nn.log_softmax(scores(predicted), axis=1)
    return -jnp.mean(jnp.sum(jnp.where(group, truth * log_predicted, 0.0), axis=1))


NOISE_BANK = 4096  # noise draws kept on the device; each training row picks one at random


def _noise_bank(features, key, std: float):
    """`NOISE_BANK` Gaussian draws shaped like one row's op and loop features. Drawing fresh
    noise for every row of every batch cost more than the network's own step on CPU; picking
    a random draw from a bank per row regularizes alike for a few integers per row."""
    k_op, k_loop = jax.random.split(key)
    op_shape = features.op_features.shape[1:]
    loop_shape = features.loop_features.shape[1:]
    return (
        std * jax.random.normal(k_op, (NOISE_BANK, *op_shape)),
        std * jax.random.normal(k_loop, (NOISE_BANK, *loop_shape)),
    )


def _with_noise(features, key, bank):
    """Features with a bank draw added to the valid ops' and loops' entries (a regularizer)."""
    slots = features.op_valid.shape[-1]  # the batch's op slots (the bank has all)
    op_bank, loop_bank = bank[0][:, :slots], bank[1][:, :slots]
    k_op, k_loop = jax.random.split(key)
    rows = features.op_valid.shape[:-1]
    op = op_bank[jax.random.randint(k_op, rows, 0, NOISE_BANK)]
    loop = loop_bank[jax.random.randint(k_loop, rows, 0, NOISE_BANK)]
    return features.replace(
        op_features=features.op_features + op * features.op_valid[..., None],
        loop_features=features.loop_features + loop * features.loop_valid[..., None],
    )


def _batches(
    data: Dataset, config: TrainConfig, rng: np.random.Generator, steps: int, bootstrap: bool
):
    """`steps` batches of row indices: `programs_per_batch` programs, `rows_per_program` rows
    of each; with `bootstrap`, the programs are drawn from a resample (with replacement) of
    the data's programs, drawn first."""
    by_program = [np.flatnonzero(data.program == p) for p in np.unique(data.program)]
    pool = np.arange(len(by_program))
    if bootstrap:
        pool = rng.choice(pool, size=len(pool))
    for _ in range(steps):
        chosen = rng.choice(
            pool,
            size=config.programs_per_batch,
            replace=len(pool) < config.programs_per_batch,
        )
        yield np.concatenate(
            [rng.choice(by_program[c], size=config.rows_per_program) for c in chosen]
        )


def _slot_ordered(batches, needed, sizes: list[int], count: int, rng: np.random.Generator):
    """`count` steps of `batches` as (rows, step ids, op slots) chunks of up to
    `STEPS_PER_CALL` steps, each over only as many op slots as its batches' programs have.
    Each window of `ORDER_WINDOW` batches is grouped by the op slots its batches need (the
    smallest of `sizes` that holds every program of the batch), cut into chunks, and the
    chunks run in random order. Most programs have one to three ops: most chunks skip most of
    the padding slots."""
    for start in range(0, count, ORDER_WINDOW):
        window = [next(batches) for _ in range(min(ORDER_WINDOW, count - start))]
        slots = np.array([sizes[np.searchsorted(sizes, needed(b))] for b in window])
        order = np.argsort(slots, kind="stable")
        cuts = [order[i : i + STEPS_PER_CALL] for i in range(0, len(order), STEPS_PER_CALL)]
        for c in rng.permutation(len(cuts)):
            take = cuts[c]
            yield np.stack([window[i] for i in take]), start + take, int(slots[take].max())


def fit(data: Dataset, config: TrainConfig, init=None):
    """Train on `data`; `init` = (graphdef, params) continues from those weights (fine-tuning,
    never distilled). Returns (graphdef, params, history)."""
    if init is not None or config.teacher == "none":
        return _fit(data, config, init)
    started = time.perf_counter()
    if config.teacher == "trees":
        trees, history = fit_tree_teacher(
            data, config.teacher_rounds, config.teacher_leaves, config.seed
        )
        label = trees.predict
    else:
        teacher = replace(
            config.model, members=config.teacher_members, op_width=config.teacher_op_width
        )
        t_graphdef, t_params, history = _fit(
            data, replace(config, model=teacher, bootstrap=False), None
        )
        jitted = jax.jit(lambda feats: apply(t_graphdef, t_params, feats))
        label = lambda feats: map_in_chunks(jitted, feats, size=4096)  # noqa: E731
    extra = random_states(data, config.distill_states, config.seed)
    extra.log_time = np.asarray(label(extra.features), np.float32)
    teacher_seconds = time.perf_counter() - started
    student = replace(config, epochs=config.distill_epochs, max_steps=config.distill_max_steps)
    graphdef, params, student_history = _fit(data.concat(extra), student, None)
    history = [{**h, "phase": "teacher"} for h in history]
    history.append({"phase": "labels", "states": len(extra), "seconds": teacher_seconds})
    return graphdef, params, history + [{**h, "phase": "student"} for h in student_history]


def _fit(data: Dataset, config: TrainConfig, init):
    graphdef, params = init if init is not None else build(config.model)
    batch = config.programs_per_batch * config.rows_per_program
    steps = max(10, config.epochs * len(data) // batch)
    if config.max_steps:
        steps = min(steps, config.max_steps)
    warmup = min(200, steps // 10)
    schedule = optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, warmup, steps)
    optimizer = optax.adamw(schedule, weight_decay=config.weight_decay)
    if config.trainable != "all":
        optimizer = optax.multi_transform(
            {"train": optimizer, "freeze": optax.set_to_zero()},
            _trainable_labels(params, config.trainable),
        )
    opt_state = optimizer.init(params)
    bank_key, noise_key = jax.random.split(jax.random.PRNGKey(config.seed))

    def train_step(carry, batch, features, target_all, program_all, bank, slots):
        params, opt_state = carry
        rows, step = batch  # rows: (members, batch) indices into the training rows
        # every `Features` array has the op slots on the axis after the rows: the slots past
        # `slots` are padding for these rows' programs
        feats = jax.tree.map(lambda a: a[rows][:, :, :slots], features)
        if config.feature_noise:
            feats = _with_noise(feats, jax.random.fold_in(noise_key, step), bank)
        (loss, parts), grads = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)(
            graphdef, params, feats, target_all[rows], program_all[rows], config
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), (loss, parts)

    @partial(jax.jit, static_argnames="slots")
    def train_chunk(
        params, opt_state, rows, step_ids, features, target_all, program_all, bank, slots
    ):
        """Several steps in one call: the rows stay on the device, only indices travel."""
        (params, opt_state), (loss, parts) = jax.lax.scan(
            lambda c, b: train_step(c, b, features, target_all, program_all, bank, slots),
            (params, opt_state),
            (rows, step_ids),
        )
        return params, opt_state, loss, parts

    members = jax.tree.leaves(params)[0].shape[0]
    bootstrap = config.bootstrap and members > 1
    streams = [
        _batches(data, config, np.random.default_rng([config.seed, m]), steps, bootstrap)
        for m in range(members)
    ]
    batches = map(np.stack, zip(*streams))  # (members, batch) per step
    n_ops = np.asarray(data.table.n_ops)[data.program]
    sizes = slot_sizes(data.table.op_slots)
    order_rng = np.random.default_rng([config.seed, members])  # not a member's stream
    chunks = _slot_ordered(batches, lambda rows: n_ops[rows].max(), sizes, steps, order_rng)
    features = jax.device_put(data.features)
    target_all, program_all = jax.device_put((data.log_time, data.program))
    bank = (
        _noise_bank(data.features, bank_key, config.feature_noise) if config.feature_noise else None
    )
    history = []
    started = time.perf_counter()
    bar = progress_bar(total=steps, unit="step", mininterval=1.0, desc="fit", leave=False)
    first = 0
    for rows, step_ids, slots in chunks:
        count = len(rows)
        params, opt_state, loss, parts = train_chunk(
            params,
            opt_state,
            jnp.asarray(rows, jnp.int32),
            jnp.asarray(step_ids, jnp.int32),
            features,
            target_all,
            program_all,
            bank,
            slots=slots,
        )
        logged = [i for i in range(count) if (first + i) % 100 == 0 or first + i == steps - 1]
        if logged:
            loss, parts = np.asarray(loss), {k: np.asarray(v) for k, v in parts.items()}
            seconds = time.perf_counter() - started
            for i in logged:
                history.append(
                    {
                        "step": first + i,
                        "loss": float(loss[i]),
                        **{k: float(v[i]) for k, v in parts.items()},
                        "seconds": seconds,
                    }
                )
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", refresh=False)
        bar.update(count)
        first += count
    bar.close()
    return graphdef, params, history
