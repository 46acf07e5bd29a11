"""Windowed reductions in JAX: a convolution (the windowed input times a filter) as
`lax.conv_general_dilated`, a pooling as `lax.reduce_window`, from the maps `stride * p +
dilation * r` of the op's operands."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax.numpy as jnp
from jax import lax

from mlirrl_jax.measure.jax_body import (
    WINDOW_REDUCERS,
    cast_to,
    combine_values,
    computable,
    evaluate_body,
    loop_labels_of,
    needed_values,
    product_of,
    sliced_view,
    view_labels,
)
from mlirrl_jax.programs.ir import BodyOp, LinalgOp


def windows_of(op: LinalgOp, labels: list) -> list[tuple[int, int, int, int]] | None:
    """Per window dimension (output loop p, stride, window loop r, dilation), if each is
    `stride * p + dilation * r` with p parallel and r a reduction, and all are distinct."""
    windows = []
    for label in labels:
        if isinstance(label, int):
            continue
        kinds = {op.loops[loop].iterator: (loop, c) for loop, c in label}
        if set(kinds) != {"parallel", "reduction"}:
            return None
        windows.append((*kinds["parallel"], *kinds["reduction"]))
    used = [w[0] for w in windows] + [w[2] for w in windows]
    return windows if windows and len(set(used)) == len(used) else None


def windowed_reduction(
    op: LinalgOp, j: int, combiner: BodyOp, value: int, views, loops
) -> Callable | None:
    """A reduction reading an operand through window dimensions: a convolution (a product of
    the windowed input and a filter) or a pooling (a function of the windowed input alone)."""
    windowed = [
        k
        for k in needed_values(op, [value])
        if k < len(op.inputs) and any(row[0] == "sum" for row in views[k])
    ]
    if len(windowed) != 1:
        return None
    product = product_of(op, value)
    if product is not None and combiner.name in ("arith.addf", "arith.addi"):
        return convolution_op(op, j, combiner, product, windowed[0], views, loops)
    return pooling_op(op, j, combiner, value, windowed[0], views, loops)


def grouped(array, roles: list, parts: list, name: str):
    """`array` with the dimensions of `parts` (in that order) merged into one called `name`,
    placed where the first of them is; a size-1 dimension at the end if none is there."""
    present = [p for p in parts if p in roles]
    if not present:
        return jnp.expand_dims(array, -1), [*roles, name]
    first = min(roles.index(p) for p in present)
    others = [i for i, r in enumerate(roles) if r not in present]
    before = sum(1 for i in others if i < first)
    order = others[:before] + [roles.index(p) for p in present] + others[before:]
    array = jnp.transpose(array, order)
    size = math.prod(array.shape[before : before + len(present)])
    shape = (*array.shape[:before], size, *array.shape[before + len(present) :])
    names = [roles[i] for i in order]
    names[before : before + len(present)] = [name]
    return jnp.reshape(array, shape), names


def convolution_op(op, j, combiner, product, image, views, loops) -> Callable | None:
    """out += conv(image, filter): batch, (group, input channel), output feature and window
    loops read off the maps, given to `lax.conv_general_dilated` in the operands' own layouts."""
    ((ka, casts_a), (kb, casts_b)), dtype = product
    (ki, casts_i), (kf, casts_f) = (
        ((ka, casts_a), (kb, casts_b)) if ka == image else ((kb, casts_b), (ka, casts_a))
    )
    image_labels, filter_labels = view_labels(views[ki]), loop_labels_of(views[kf])
    windows = windows_of(op, image_labels)
    if ki == kf or filter_labels is None or windows is None:
        return None
    if not computable(op, {ki, kf}, index=False):
        return None
    singles = [label for label in image_labels if isinstance(label, int)]
    image_set, filter_set, out_set = set(singles), set(filter_labels), set(loops)
    roles = {
        "N": image_set & out_set - filter_set,
        "C": image_set & filter_set - out_set,
        "F": filter_set & out_set - image_set,
        "G": image_set & filter_set & out_set,
    }
    for i, (p, _, r, _) in enumerate(windows):
        roles[("S", i)] = {p, r}
    outputs, inside = {w[0] for w in windows}, {w[2] for w in windows}
    if (
        len(singles) != len(image_set)
        or any(len(roles[name]) > 1 for name in ("N", "C", "F", "G"))
        or set().union(*roles.values()) != set(range(op.n_loops))
        or (outputs | inside) & image_set
        or not inside <= filter_set - out_set
        or not outputs <= out_set - filter_set
        or any(op.loops[loop].iterator != "parallel" for n in "NFG" for loop in roles[n])
        or any(op.loops[loop].iterator != "reduction" for loop in roles["C"])
    ):
        return None
    role_of = {}
    for name, members in roles.items():
        if isinstance(name, str):
            role_of.update({loop: name for loop in members})
    for i, (p, _, r, _) in enumerate(windows):
        role_of[p] = role_of[r] = ("S", i)
    spatial = [("S", i) for i in range(len(windows))]
    image_roles = [
        role_of[label if isinstance(label, int) else label[0][0]] for label in image_labels
    ]
    filter_roles = [role_of[loop] for loop in filter_labels]
    out_roles = [role_of[loop] for loop in loops]
    # the result's layout follows the output's; a split (group, feature) pair is split after
    result_roles = list(dict.fromkeys("O" if r in ("G", "F") else r for r in out_roles))
    result_roles += [r for r in ("N", "O") if r not in result_roles]
    out_spec = tuple(result_roles.index(r) for r in ["N", "O", *spatial])
    strides, dilations = [w[1] for w in windows], [w[3] for w in windows]
    groups = op.extents[next(iter(roles["G"]))] if roles["G"] else 1
    features = op.extents[next(iter(roles["F"]))] if roles["F"] else 1
    out = len(op.inputs) + j

    def run(values: list):
        x = cast_to(sliced_view(values[ki], views[ki], op.extents), casts_i)
        w = cast_to(sliced_view(values[kf], views[kf], op.extents), casts_f)
        x, x_roles = grouped(x, image_roles, ["N"], "N")
        x, x_roles = grouped(x, x_roles, ["G", "C"], "CF")
        w, w_roles = grouped(w, filter_roles, ["G", "F"], "O")
        w, w_roles = grouped(w, w_roles, ["C"], "I")
        # the specs name the operands' own dimensions, so XLA sees them in their layouts
        specs = lax.ConvDimensionNumbers(
            lhs_spec=tuple(x_roles.index(r) for r in ["N", "CF", *spatial]),
            rhs_spec=tuple(w_roles.index(r) for r in ["O", "I", *spatial]),
            out_spec=out_spec,
        )
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=strides,
            padding=[(0, 0)] * len(windows),
            rhs_dilation=dilations,
            dimension_numbers=specs,
            feature_group_count=groups,
            preferred_element_type=dtype,
        )
        shape, names = [], []
        for role, size in zip(result_roles, y.shape):
            if role == "O":
                split = [("G", groups), ("F", features)]
                shape += [s for r, s in split if r in out_roles]
                names += [r for r, _ in split if r in out_roles]
            elif role in out_roles:
                shape.append(size)
                names.append(role)
        y = jnp.transpose(jnp.reshape(y, shape), [names.index(r) for r in out_roles])
        return combine_values(combiner, values[out], y)

    return run


def pooling_op(op, j, combiner, value, image, views, loops) -> Callable | None:
    """out = combine(out, reduce_window(f(image))): a windowed reduction of one input."""
    needed = needed_values(op, [value])
    labels = view_labels(views[image])
    windows = windows_of(op, labels)
    if (
        combiner.name not in WINDOW_REDUCERS
        or windows is None
        or {v for v in needed if v < len(op.operands)} != {image}
        or not computable(op, needed, index=False)
    ):
        return None
    singles = [label for label in labels if isinstance(label, int)]
    parallel = {i for i, lp in enumerate(op.loops) if lp.iterator == "parallel"}
    reduction = set(range(op.n_loops)) - parallel
    if (
        len(set(singles)) != len(singles)
        or set(singles) | {w[0] for w in windows} != parallel
        or set(singles) & {w[0] for w in windows}
        or {w[2] for w in windows} != reduction
    ):
        return None
    by_label = {
        label: w for label, w in zip([lb for lb in labels if not isinstance(lb, int)], windows)
    }
    window = [1 if isinstance(lb, int) else op.extents[by_label[lb][2]] for lb in labels]
    strides = [1 if isinstance(lb, int) else by_label[lb][1] for lb in labels]
    dilation = [1 if isinstance(lb, int) else by_label[lb][3] for lb in labels]
    result_loops = [lb if isinstance(lb, int) else by_label[lb][0] for lb in labels]
    order = [result_loops.index(loop) for loop in loops]
    out = len(op.inputs) + j

    def run(values: list):
        x = sliced_view(values[image], views[image], op.extents)
        f = evaluate_body(op, needed, {image: x})[value]
        pooled = lax.reduce_window(
            f,
            identity_of(combiner.name, f.dtype),
            WINDOW_REDUCERS[combiner.name],
            window,
            strides,
            "VALID",
            window_dilation=dilation,
        )
        return combine_values(combiner, values[out], jnp.transpose(pooled, order))

    return run


def identity_of(combiner: str, dtype):
    """The start value of a window reduction with `combiner`."""
    if combiner in ("arith.addf", "arith.addi"):
        return jnp.asarray(0, dtype)
    if combiner in ("arith.mulf", "arith.muli"):
        return jnp.asarray(1, dtype)
    floating = jnp.issubdtype(dtype, jnp.floating)
    if combiner in ("arith.maximumf", "arith.maxsi"):
        return jnp.asarray(-jnp.inf if floating else jnp.iinfo(dtype).min, dtype)
    return jnp.asarray(jnp.inf if floating else jnp.iinfo(dtype).max, dtype)


# ----------------------------------------------------------------------------- programs
