"""XLA:CPU and NumPy/BLAS baselines: the same computation, verified and timed like a kernel.

`jax_function(program)` translates a Program op by op into JAX, from what each op computes:
multiply-accumulate contractions over projected permutations become `jnp.einsum`, windowed
multiply-accumulates (the maps hold `stride * p + dilation * r`) `lax.conv_general_dilated`,
windowed reductions `lax.reduce_window`, other reductions a jnp reduction of the body over the
reduction loops, and all-parallel ops (fills, element-wise, broadcasts) the body evaluated with
jnp on operands laid out over the loops. Body ops compute what `semantics` defines, as in
the reference. What it cannot translate exactly gives None.

`measure_xla` and `measure_numpy` (plain matmul and batch_matmul only) run in a child process
pinned to `threads` cores, with XLA's and BLAS's thread pools sized to them; the child verifies
the first run against the reference and times the rest with the project's `TimingMethod`, so
the records compare with `Runner.measure`'s through `timing.speedup`. As the project's kernels
write into a given buffer, the XLA call donates its output buffer and the next call reuses it.
The records carry `schedule={"baseline": library}`: they are not schedules, and do not belong
in the MeasurementStore.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.host_devices import FLAG as HOST_DEVICES_FLAG
from mlirrl_jax.measure import semantics
from mlirrl_jax.measure.fingerprint import fingerprint
from mlirrl_jax.measure.reference import (
    NUMPY_TYPES,
    ReferenceUnsupported,
)
from mlirrl_jax.measure.runner import DEFAULT_TIMEOUT_S, death_record
from mlirrl_jax.measure.timing import Measurement, TimingMethod, nan_filled
from mlirrl_jax.measure.worker import inject_test_fault, program_data, verify_and_time
from mlirrl_jax.programs.ir import BodyOp, LinalgOp, Operand, Program

# Test-only fault injection in the child (see worker.inject_test_fault); "oom" is left out: the child
# has no memory limit, so a memory hog would take the whole machine.
FAULTS = ("crash", "hang", "wrong_output")
# Python run in the child before anything else: the affinity must be set before NumPy loads
# BLAS and JAX starts its thread pools, as threads started earlier keep the old mask.
_BOOTSTRAP = (
    "import os, sys; os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]); "
    "from mlirrl_jax.measure.xla import _child_main; _child_main(int(sys.argv[2]), int(sys.argv[3]))"
)

OpFunction = Callable[[list], list]  # operand values (None: never read) -> the op's results

# ----------------------------------------------------------------------------- body ops
# Combiners of `out = combine(out, f(inputs))` reductions: the jnp reduction over loops.
_REDUCERS = {
    "arith.addf": jnp.sum,
    "arith.addi": jnp.sum,
    "arith.mulf": jnp.prod,
    "arith.muli": jnp.prod,
    "arith.maximumf": jnp.max,
    "arith.minimumf": jnp.min,
    "arith.maxsi": jnp.max,
    "arith.minsi": jnp.min,
    "arith.maxnumf": jnp.nanmax,
    "arith.minnumf": jnp.nanmin,
}
# ... and the lax computation a window reduction uses (NaN-ignoring ones have none).
_WINDOW_REDUCERS = {
    "arith.addf": lax.add,
    "arith.addi": lax.add,
    "arith.mulf": lax.mul,
    "arith.muli": lax.mul,
    "arith.maximumf": lax.max,
    "arith.maxsi": lax.max,
    "arith.minimumf": lax.min,
    "arith.minsi": lax.min,
}


def _dtype(element_type: str):
    """The array type of an MLIR element type; None for bf16 (the reference reads it as f32)."""
    return None if element_type == "bf16" else NUMPY_TYPES.get(element_type)


def _needs_x64(program: Program) -> bool:
    """Whether the program has 64-bit values, which JAX computes only with x64 enabled."""
    wide = ("f64", "i64", "index")
    types = [o.element_type for op in program.ops for o in op.operands]
    types += [b.result_type for op in program.ops for b in op.body]
    return any(t in wide for t in types)


def _supported(b: BodyOp) -> bool:
    if _dtype(b.result_type) is None:
        return False
    return b.name == "linalg.index" or semantics.supported(b)


def _needed(op: LinalgOp, roots) -> set[int]:
    """The body values (block arguments included) that computing `roots` reads."""
    n_args = len(op.operands)
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        value = stack.pop()
        if value not in seen:
            seen.add(value)
            if value >= n_args:
                stack.extend(op.body[value - n_args].operands)
    return seen


def _computable(op: LinalgOp, needed: set[int], index: bool) -> bool:
    """Whether every needed body op translates and no needed block argument is uninitialised;
    `index`: whether `linalg.index` may be used (only where values are laid out over loops)."""
    n_args = len(op.operands)
    for value in needed:
        if value < n_args:
            if op.operands[value].source[0] == "empty":
                return False
        else:
            b = op.body[value - n_args]
            if not _supported(b) or (b.name == "linalg.index" and not index):
                return False
    return True


def _evaluate(op: LinalgOp, needed: set[int], args: dict, index=None) -> dict:
    """The needed body values, from the block arguments in `args`; `index(dim)` gives the
    values of `linalg.index`."""
    n_args = len(op.operands)
    values = dict(args)
    for number, b in enumerate(op.body, n_args):
        if number not in needed:
            continue
        dtype = _dtype(b.result_type)
        if b.name == "linalg.index":
            values[number] = index(dict(b.attrs)["dim"]).astype(dtype)
        else:
            values[number] = semantics.apply(jnp, b, [values[v] for v in b.operands], dtype)
    return values


def _combine(combiner: BodyOp, accumulated, total):
    """`combiner` applied to an output's value and a reduced total, in the output's type."""
    return semantics.apply(jnp, combiner, [accumulated, total], accumulated.dtype)


def _combiners(op: LinalgOp) -> list[tuple[BodyOp, int]] | None:
    """Per output, (combiner, value of f(inputs)) when the op yields combine(out, f(inputs))."""
    n_in, n_args = len(op.inputs), len(op.operands)
    outputs = set(range(n_in, n_args))
    found = []
    for j, y in enumerate(op.yields):
        if y < n_args or op.body[y - n_args].name not in _REDUCERS:
            return None
        b = op.body[y - n_args]
        lhs, rhs = b.operands
        other = rhs if lhs == n_in + j else lhs if rhs == n_in + j else None
        if other is None or _needed(op, [other]) & outputs:
            return None
        found.append((b, other))
    return found


def _factor(op: LinalgOp, value: int) -> tuple[int, list[BodyOp]] | None:
    """(block argument, the casts applied to it) if `value` is a chain of casts of an input."""
    n_in, n_args = len(op.inputs), len(op.operands)
    casts = []
    while value >= n_args:
        b = op.body[value - n_args]
        if b.name not in semantics.CASTS or _dtype(b.result_type) is None:
            return None
        casts.insert(0, b)
        value = b.operands[0]
    return (value, casts) if value < n_in else None


def _product(op: LinalgOp, value: int):
    """The two factors of `value` if it multiplies two (cast) inputs, and the product's type."""
    b = op.body[value - len(op.operands)] if value >= len(op.operands) else None
    if b is None or b.name not in ("arith.mulf", "arith.muli"):
        return None
    factors = [_factor(op, v) for v in b.operands]
    if None in factors or _dtype(b.result_type) is None:
        return None
    return factors, _dtype(b.result_type)


def _cast(array, casts: list[BodyOp]):
    for b in casts:
        array = semantics.apply(jnp, b, [array], _dtype(b.result_type))
    return array


# ----------------------------------------------------------------------------- operand layout
# An operand's view: per dimension ("loop", loop, stride, offset), ("const", offset) or
# ("sum", ((loop, coeff), (loop, coeff)), offset) for a window (conv, pooling) dimension.
def _view(operand: Operand, extents: tuple[int, ...]) -> list[tuple] | None:
    """How the loops index `operand`, if each index is one of the forms above and in range."""
    rows = []
    for row, offset, size in zip(operand.access, operand.offset, operand.shape):
        terms = [(loop, c) for loop, c in enumerate(row) if c]
        if offset < 0 or any(c < 0 for _, c in terms) or len(terms) > 2:
            return None
        last = offset + sum(c * (extents[loop] - 1) for loop, c in terms)
        if last >= size:
            return None
        if not terms:
            rows.append(("const", offset))
        elif len(terms) == 1:
            rows.append(("loop", terms[0][0], terms[0][1], offset))
        else:
            rows.append(("sum", tuple(terms), offset))
    return rows


def _sliced(array, view: list[tuple], extents: tuple[int, ...]):
    """The elements the loops read, one dimension per loop or window dimension."""
    index = []
    for row in view:
        if row[0] == "const":
            index.append(row[1])
        elif row[0] == "loop":
            _, loop, stride, offset = row
            index.append(slice(offset, offset + stride * (extents[loop] - 1) + 1, stride))
        else:
            _, terms, offset = row
            last = offset + sum(c * (extents[loop] - 1) for loop, c in terms)
            index.append(slice(offset, last + 1))
    return array[tuple(index)] if index else array


def _labels(view: list[tuple]) -> list:
    """Per dimension of `_sliced`: its loop, or the (loop, coeff) terms of a window dimension."""
    return [row[1] for row in view if row[0] != "const"]


def _loop_labels(view: list[tuple]) -> list[int] | None:
    """The loops of a sliced operand's dimensions, if each has its own loop."""
    labels = _labels(view)
    if any(not isinstance(label, int) for label in labels) or len(set(labels)) != len(labels):
        return None
    return labels


def _over_loops(array, labels: list[int], n_loops: int):
    """A sliced operand laid out over the loops: dimension l is loop l (size 1 if unused)."""
    order = sorted(range(len(labels)), key=lambda axis: labels[axis])
    array = jnp.transpose(array, order) if order else array
    shape = [1] * n_loops
    for position, axis in enumerate(order):
        shape[labels[axis]] = array.shape[position]
    return jnp.reshape(array, shape)


def _output_loops(op: LinalgOp, operand: Operand) -> list[int] | None:
    """The loops of an output's dimensions, if each is one whole loop (the op writes it all)."""
    loops = []
    for row, offset, size in zip(operand.access, operand.offset, operand.shape):
        terms = [(loop, c) for loop, c in enumerate(row) if c]
        if offset or len(terms) != 1 or terms[0][1] != 1 or op.extents[terms[0][0]] != size:
            return None
        loops.append(terms[0][0])
    parallel = [i for i, lp in enumerate(op.loops) if lp.iterator == "parallel"]
    return loops if sorted(loops) == parallel else None


# ----------------------------------------------------------------------------- ops
def _translate_op(op: LinalgOp) -> OpFunction | None:
    """A JAX function of the op's operand values giving its results, or None."""
    views = [_view(o, op.extents) for o in op.operands]
    out_loops = [_output_loops(op, o) for o in op.outputs]
    if (
        None in views
        or None in out_loops
        or any(_dtype(o.element_type) is None for o in op.outputs)
    ):
        return None
    if all(lp.iterator == "parallel" for lp in op.loops):
        return _map(op, views, out_loops)
    combiners = _combiners(op)
    if combiners is None:
        return None
    per_output = []
    for j, (combiner, value) in enumerate(combiners):
        args = (op, j, combiner, value, views, out_loops[j])
        fn = _windowed(*args) or _contraction(*args) or _reduction(*args)
        if fn is None:
            return None
        per_output.append(fn)
    return lambda values: [fn(values) for fn in per_output]


def _index_function(op: LinalgOp):
    def index(dim: int):
        shape = [1] * op.n_loops
        shape[dim] = op.extents[dim]
        return lax.broadcasted_iota(_dtype("index"), shape, dim)

    return index


def _loop_arrays(op: LinalgOp, needed: set[int], views) -> Callable | None:
    """A function of the operand values giving the needed block arguments laid out over the
    loops, if each of them can be."""
    args = sorted(v for v in needed if v < len(op.operands))
    labels = {k: _loop_labels(views[k]) for k in args}
    if None in labels.values():
        return None

    def arrays(values: list) -> dict:
        return {
            k: _over_loops(_sliced(values[k], views[k], op.extents), labels[k], op.n_loops)
            for k in args
        }

    return arrays


def _map(op: LinalgOp, views, out_loops) -> OpFunction | None:
    """An all-parallel op: the body over the loops, each yield written in its output's layout."""
    needed = _needed(op, op.yields)
    arrays = _loop_arrays(op, needed, views)
    if arrays is None or not _computable(op, needed, index=True):
        return None
    index = _index_function(op)

    def run(values: list) -> list:
        computed = _evaluate(op, needed, arrays(values), index)
        results = []
        for y, loops, out in zip(op.yields, out_loops, op.outputs):
            full = jnp.broadcast_to(computed[y], op.extents)
            results.append(jnp.transpose(full, loops).astype(_dtype(out.element_type)))
        return results

    return run


def _reduction(op: LinalgOp, j: int, combiner: BodyOp, value: int, views, loops) -> Callable | None:
    """out = combine(out, reduce(f(inputs))) with f over the loops, reduced over the reduction
    loops by the combiner's jnp reduction (XLA fuses f into the reduction)."""
    needed = _needed(op, [value])
    arrays = _loop_arrays(op, needed, views)
    if arrays is None or not _computable(op, needed, index=True):
        return None
    index = _index_function(op)
    reduced = tuple(i for i, lp in enumerate(op.loops) if lp.iterator == "reduction")
    parallel = [i for i, lp in enumerate(op.loops) if lp.iterator == "parallel"]
    out = len(op.inputs) + j

    def run(values: list):
        f = _evaluate(op, needed, arrays(values), index)[value]
        full = jnp.broadcast_to(f, op.extents)
        total = _REDUCERS[combiner.name](full, axis=reduced)  # integers wrap alike when cast
        total = jnp.transpose(total, [parallel.index(loop) for loop in loops])
        return _combine(combiner, values[out], total)

    return run


def _contraction(
    op: LinalgOp, j: int, combiner: BodyOp, value: int, views, loops
) -> Callable | None:
    """out += a * b over projected permutations: one `jnp.einsum` (a dot_general)."""
    product = _product(op, value)
    if combiner.name not in ("arith.addf", "arith.addi") or product is None:
        return None
    ((ka, casts_a), (kb, casts_b)), dtype = product
    labels_a, labels_b = _loop_labels(views[ka]), _loop_labels(views[kb])
    if labels_a is None or labels_b is None or not _computable(op, {ka, kb}, index=False):
        return None
    if set(labels_a) | set(labels_b) != set(range(op.n_loops)):
        return None  # a loop that indexes neither factor multiplies the sum: not an einsum

    def letters(labels):
        return "".join("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[i] for i in labels)

    spec = f"{letters(labels_a)},{letters(labels_b)}->{letters(loops)}"
    out = len(op.inputs) + j

    def run(values: list):
        a = _cast(_sliced(values[ka], views[ka], op.extents), casts_a)
        b = _cast(_sliced(values[kb], views[kb], op.extents), casts_b)
        total = jnp.einsum(spec, a, b, preferred_element_type=dtype)
        return _combine(combiner, values[out], total)

    return run


def _windows(op: LinalgOp, labels: list) -> list[tuple[int, int, int, int]] | None:
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


def _windowed(op: LinalgOp, j: int, combiner: BodyOp, value: int, views, loops) -> Callable | None:
    """A reduction reading an operand through window dimensions: a convolution (a product of
    the windowed input and a filter) or a pooling (a function of the windowed input alone)."""
    windowed = [
        k
        for k in _needed(op, [value])
        if k < len(op.inputs) and any(row[0] == "sum" for row in views[k])
    ]
    if len(windowed) != 1:
        return None
    product = _product(op, value)
    if product is not None and combiner.name in ("arith.addf", "arith.addi"):
        return _convolution(op, j, combiner, product, windowed[0], views, loops)
    return _pooling(op, j, combiner, value, windowed[0], views, loops)


def _group(array, roles: list, parts: list, name: str):
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


def _convolution(op, j, combiner, product, image, views, loops) -> Callable | None:
    """out += conv(image, filter): batch, (group, input channel), output feature and window
    loops read off the maps, given to `lax.conv_general_dilated` in the operands' own layouts."""
    ((ka, casts_a), (kb, casts_b)), dtype = product
    (ki, casts_i), (kf, casts_f) = (
        ((ka, casts_a), (kb, casts_b)) if ka == image else ((kb, casts_b), (ka, casts_a))
    )
    image_labels, filter_labels = _labels(views[ki]), _loop_labels(views[kf])
    windows = _windows(op, image_labels)
    if ki == kf or filter_labels is None or windows is None:
        return None
    if not _computable(op, {ki, kf}, index=False):
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
        x = _cast(_sliced(values[ki], views[ki], op.extents), casts_i)
        w = _cast(_sliced(values[kf], views[kf], op.extents), casts_f)
        x, x_roles = _group(x, image_roles, ["N"], "N")
        x, x_roles = _group(x, x_roles, ["G", "C"], "CF")
        w, w_roles = _group(w, filter_roles, ["G", "F"], "O")
        w, w_roles = _group(w, w_roles, ["C"], "I")
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
        return _combine(combiner, values[out], y)

    return run


def _pooling(op, j, combiner, value, image, views, loops) -> Callable | None:
    """out = combine(out, reduce_window(f(image))): a windowed reduction of one input."""
    needed = _needed(op, [value])
    labels = _labels(views[image])
    windows = _windows(op, labels)
    if (
        combiner.name not in _WINDOW_REDUCERS
        or windows is None
        or {v for v in needed if v < len(op.operands)} != {image}
        or not _computable(op, needed, index=False)
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
        x = _sliced(values[image], views[image], op.extents)
        f = _evaluate(op, needed, {image: x})[value]
        pooled = lax.reduce_window(
            f,
            _identity(combiner.name, f.dtype),
            _WINDOW_REDUCERS[combiner.name],
            window,
            strides,
            "VALID",
            window_dilation=dilation,
        )
        return _combine(combiner, values[out], jnp.transpose(pooled, order))

    return run


def _identity(combiner: str, dtype):
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
def _translate(program: Program) -> Callable | None:
    """The program as a function of its inputs, whatever JAX's x64 setting (see jax_function)."""
    functions = [_translate_op(op) for op in program.ops]
    out_dtypes = [_dtype(t.element_type) for t in program.outputs]
    if None in functions or None in out_dtypes:
        return None

    def operand_value(operand: Operand, inputs, results):
        kind, ref = operand.source
        if kind == "arg":
            return jnp.asarray(inputs[ref])
        if kind == "op":
            return results[ref]
        if kind == "scalar":
            return jnp.asarray(ref, _dtype(operand.element_type))
        return None  # an uninitialised tensor: the translators never read one

    def computation(*inputs):
        results: dict = {}
        for op, fn in zip(program.ops, functions):
            values = [operand_value(o, inputs, results) for o in op.operands]
            for index, value in enumerate(fn(values)):
                results[(op.id, index)] = value
        return tuple(
            (results[ref] if kind == "op" else jnp.asarray(inputs[ref])).astype(dtype)
            for (kind, ref), dtype in zip(program.returns, out_dtypes)
        )

    return computation


def jax_function(program: Program) -> Callable | None:
    """`f(*inputs) -> tuple of outputs`, the program in JAX (outputs in the program's element
    types, as `reference.evaluate` computes them); None if some op has no exact translation, or
    the program has 64-bit values and JAX's x64 mode is off."""
    if _needs_x64(program) and not jax.config.jax_enable_x64:
        return None
    return _translate(program)


def _plain_matmul(program: Program) -> bool:
    """Whether the program is C = A @ B (or batched) of two float inputs into a zero fill."""
    if len(program.ops) != 2 or program.returns != [("op", (1, 0))]:
        return False
    fill, mm = program.ops
    plain = {
        "linalg.matmul": [((1, 0, 0), (0, 0, 1)), ((0, 0, 1), (0, 1, 0)), ((1, 0, 0), (0, 1, 0))],
        "linalg.batch_matmul": [
            ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 0, 1)),
            ((1, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0)),
            ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0)),
        ],
    }
    return (
        fill.kind == "fill"
        and fill.operands[0].source == ("scalar", 0.0)
        and mm.name in plain
        and [o.access for o in mm.operands] == plain[mm.name]
        and [o.source for o in mm.operands] == [("arg", 0), ("arg", 1), ("op", (0, 0))]
        and all(o.element_type in ("f32", "f64") for o in mm.operands)
    )


# ----------------------------------------------------------------------------- measuring
def measure_xla(
    program: Program,
    threads: int = 1,
    method: TimingMethod | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    inject_fault: str | None = None,
) -> Measurement | None:
    """The program jitted by XLA:CPU on `threads` cores, verified and timed in a child process;
    None if it has no exact JAX translation. Inputs come from `method.seed`, as in the runner."""
    if _translate(program) is None:
        return None
    return _measure_in_child("xla", program, threads, method, timeout_s, inject_fault)


def measure_numpy(
    program: Program,
    threads: int = 1,
    method: TimingMethod | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    inject_fault: str | None = None,
) -> Measurement | None:
    """`np.matmul(a, b, out=c)` with BLAS on `threads` threads, verified and timed in a child
    process; None unless the program is a plain matmul or batch_matmul."""
    if not _plain_matmul(program):
        return None
    return _measure_in_child("numpy", program, threads, method, timeout_s, inject_fault)


def _child_env(threads: int) -> dict:
    """The child's environment: XLA on the CPU with one device, and thread pools of `threads`.

    XLA:CPU sizes its intra-op pool from $NPROC, else from the affinity; both are set. Measured
    with jax 0.10.2 (2048^3 f32 matmul, 2 cores): 137 ms on 1 core, 72 ms on 2, and 138 ms on
    2 cores with NPROC=1; --xla_cpu_multi_thread_eigen=false changes nothing (67.8 ms on 2
    cores), as the dot no longer runs through Eigen's threads, so it is not set.
    """
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = " ".join(f for f in flags if not f.startswith(HOST_DEVICES_FLAG))
    env["JAX_PLATFORMS"] = "cpu"
    for name in ("NPROC", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def _measure_in_child(
    library: str,
    program: Program,
    threads: int,
    method: TimingMethod | None,
    timeout_s: float,
    inject_fault: str | None,
) -> Measurement:
    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= threads <= len(cores):
        raise ConfigError(f"threads must be in 1..{len(cores)} (the cores allowed), got {threads}")
    if inject_fault is not None and inject_fault not in FAULTS:
        raise ConfigError(f"unknown fault {inject_fault!r}; known: {FAULTS}")
    method = method or TimingMethod()
    record = Measurement(
        status="ok",
        program=program.name,
        program_hash=program.hash,
        schedule={"baseline": library},
        schedule_hash=f"baseline:{library}",
        threads=threads,
        runtime=library,
        method=dataclasses.asdict(method),
        fingerprint=fingerprint(),
        flops=program.flops,
    )
    start = time.perf_counter()
    request = {
        "library": library,
        "program": program,
        "threads": threads,
        "method": method,
        "inject_fault": inject_fault,
    }
    reply = _round_trip(request, cores[:threads], _child_env(threads), timeout_s)
    record.fingerprint["baseline"] = reply.pop("baseline", {})
    for key, value in reply.items():
        setattr(record, key, value)
    record.wall_s = time.perf_counter() - start
    return record


def _round_trip(request: dict, cores: list[int], env: dict, timeout_s: float) -> dict:
    """Send `request` to a fresh child pinned to `cores`; its reply, or a failure record."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, ",".join(map(str, cores))]
            + [str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        send = Connection(to_child_w, readable=False)
        receive = Connection(from_child_r, writable=False)
        reply = None
        try:
            send.send(request)
            if receive.poll(timeout_s):
                reply = receive.recv()
            else:
                reply = {"status": "timeout", "error": f"no result within {timeout_s:g} s; killed"}
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass  # the child died: its exit code and log say how below
        if reply is None:
            try:
                code = process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # closed its pipe but lingers: a crash
                code = -signal.SIGABRT
            log.seek(0)
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line]
            memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
            reply = death_record(code, " | ".join(lines[-6:])[-1500:], memory_mb)
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()
        send.close()
        receive.close()
    return reply


def _child_main(read_fd: int, write_fd: int) -> None:
    """The child: serve one request and exit (started through `_BOOTSTRAP`)."""
    receive = Connection(read_fd, writable=False)
    send = Connection(write_fd, readable=False)
    send.send(_serve(receive.recv()))


def _serve(request: dict) -> dict:
    program: Program = request["program"]
    method: TimingMethod = request["method"]
    fault = request["inject_fault"]
    inject_test_fault(fault)
    try:  # the kernels' reference, from the same disk cache (computed once per seed)
        data, _ = program_data(program, method.seed)
    except ReferenceUnsupported as exc:
        return {"status": "reference_error", "error": str(exc)}
    prepare = _prepare_xla if request["library"] == "xla" else _prepare_numpy
    call, outputs, fields = prepare(program, data.inputs, request["threads"])
    checked = verify_and_time(call, outputs(), data.references, data.tolerance, method, fault)
    return {**fields, **checked}


def _prepare_xla(program: Program, inputs: list[np.ndarray], threads: int):
    """(timed call, copies of the outputs, record fields) for the jitted program, run twice:
    compiled, then checked to write into the buffers it was given. Each call donates the last
    call's output buffers (the first ones, made from NumPy, may not be donatable)."""
    if _needs_x64(program):
        jax.config.update("jax_enable_x64", True)
    # run in the calling thread, as the project's kernels are called
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    computation = jax_function(program)
    # keep_unused: else jit drops the unread `outs` argument, and with it the donation
    jitted = jax.jit(lambda ins, outs: computation(*ins), donate_argnums=1, keep_unused=True)
    device_inputs = tuple(jax.device_put(x) for x in inputs)
    state = [
        tuple(
            jnp.asarray(nan_filled(t.shape, NUMPY_TYPES[t.element_type])) for t in program.outputs
        )
    ]

    def call() -> None:
        state[0] = jax.block_until_ready(jitted(device_inputs, state[0]))

    start = time.perf_counter()
    call()
    jit_s = time.perf_counter() - start
    pointers = [o.unsafe_buffer_pointer() for o in state[0]]
    call()
    reused = [o.unsafe_buffer_pointer() for o in state[0]] == pointers

    def outputs() -> list[np.ndarray]:
        return [np.array(o) for o in state[0]]  # copies: the next call donates the buffers

    baseline = {
        "library": f"jax {jax.__version__}",
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "nproc": os.environ.get("NPROC"),
        "output_buffer_reused": reused,
        "cores": sorted(os.sched_getaffinity(0)),
    }
    return call, outputs, {"compile_s": {"jit_s": jit_s}, "baseline": baseline}


def _prepare_numpy(program: Program, inputs: list[np.ndarray], threads: int):
    """(timed call, copies of the outputs, record fields) for `np.matmul` into one buffer."""
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(limits=threads)  # for the rest of this one-request process
    a, b = inputs
    out = nan_filled(program.outputs[0].shape, NUMPY_TYPES[program.outputs[0].element_type])

    def call() -> None:
        np.matmul(a, b, out=out)

    call()
    baseline = {
        "library": f"numpy {np.__version__}",
        "blas": [
            {k: pool.get(k) for k in ("internal_api", "version", "num_threads")}
            for pool in threadpool_info()
            if pool.get("user_api") == "blas"
        ],
        "cores": sorted(os.sched_getaffinity(0)),
    }
    return call, lambda: [out.copy()], {"baseline": baseline}
