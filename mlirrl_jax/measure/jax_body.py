"""The pieces of the Linalg-to-JAX translation (`to_jax`): body ops evaluated with jnp as
`semantics` defines them, the reductions' combiners, and operands laid out over an op's loops."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jax import lax

from mlirrl_jax.measure import semantics
from mlirrl_jax.measure.reference import (
    NUMPY_TYPES,
)
from mlirrl_jax.programs.ir import BodyOp, LinalgOp, Operand, Program

OpFunction = Callable[[list], list]  # operand values (None: never read) -> the op's results

# ----------------------------------------------------------------------------- body ops
# Combiners of `out = combine(out, f(inputs))` reductions: the jnp reduction over loops.
REDUCERS = {
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
WINDOW_REDUCERS = {
    "arith.addf": lax.add,
    "arith.addi": lax.add,
    "arith.mulf": lax.mul,
    "arith.muli": lax.mul,
    "arith.maximumf": lax.max,
    "arith.maxsi": lax.max,
    "arith.minimumf": lax.min,
    "arith.minsi": lax.min,
}


def jax_dtype(element_type: str):
    """The array type of an MLIR element type; None for bf16 (the reference reads it as f32)."""
    return None if element_type == "bf16" else NUMPY_TYPES.get(element_type)


def needs_x64(program: Program) -> bool:
    """Whether the program has 64-bit values, which JAX computes only with x64 enabled."""
    wide = ("f64", "i64", "index")
    types = [o.element_type for op in program.ops for o in op.operands]
    types += [b.result_type for op in program.ops for b in op.body]
    return any(t in wide for t in types)


def supported_body_op(b: BodyOp) -> bool:
    if jax_dtype(b.result_type) is None:
        return False
    return b.name == "linalg.index" or semantics.supported(b)


def needed_values(op: LinalgOp, roots) -> set[int]:
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


def computable(op: LinalgOp, needed: set[int], index: bool) -> bool:
    """Whether every needed body op translates and no needed block argument is uninitialised;
    `index`: whether `linalg.index` may be used (only where values are laid out over loops)."""
    n_args = len(op.operands)
    for value in needed:
        if value < n_args:
            if op.operands[value].source[0] == "empty":
                return False
        else:
            b = op.body[value - n_args]
            if not supported_body_op(b) or (b.name == "linalg.index" and not index):
                return False
    return True


def evaluate_body(op: LinalgOp, needed: set[int], args: dict, index=None) -> dict:
    """The needed body values, from the block arguments in `args`; `index(dim)` gives the
    values of `linalg.index`."""
    n_args = len(op.operands)
    values = dict(args)
    for number, b in enumerate(op.body, n_args):
        if number not in needed:
            continue
        dtype = jax_dtype(b.result_type)
        if b.name == "linalg.index":
            values[number] = index(dict(b.attrs)["dim"]).astype(dtype)
        else:
            values[number] = semantics.apply(jnp, b, [values[v] for v in b.operands], dtype)
    return values


def combine_values(combiner: BodyOp, accumulated, total):
    """`combiner` applied to an output's value and a reduced total, in the output's type."""
    return semantics.apply(jnp, combiner, [accumulated, total], accumulated.dtype)


def combiners_of(op: LinalgOp) -> list[tuple[BodyOp, int]] | None:
    """Per output, (combiner, value of f(inputs)) when the op yields combine(out, f(inputs))."""
    n_in, n_args = len(op.inputs), len(op.operands)
    outputs = set(range(n_in, n_args))
    found = []
    for j, y in enumerate(op.yields):
        if y < n_args or op.body[y - n_args].name not in REDUCERS:
            return None
        b = op.body[y - n_args]
        lhs, rhs = b.operands
        other = rhs if lhs == n_in + j else lhs if rhs == n_in + j else None
        if other is None or needed_values(op, [other]) & outputs:
            return None
        found.append((b, other))
    return found


def factor_of(op: LinalgOp, value: int) -> tuple[int, list[BodyOp]] | None:
    """(block argument, the casts applied to it) if `value` is a chain of casts of an input."""
    n_in, n_args = len(op.inputs), len(op.operands)
    casts = []
    while value >= n_args:
        b = op.body[value - n_args]
        if b.name not in semantics.CASTS or jax_dtype(b.result_type) is None:
            return None
        casts.insert(0, b)
        value = b.operands[0]
    return (value, casts) if value < n_in else None


def product_of(op: LinalgOp, value: int):
    """The two factors of `value` if it multiplies two (cast) inputs, and the product's type."""
    b = op.body[value - len(op.operands)] if value >= len(op.operands) else None
    if b is None or b.name not in ("arith.mulf", "arith.muli"):
        return None
    factors = [factor_of(op, v) for v in b.operands]
    if None in factors or jax_dtype(b.result_type) is None:
        return None
    return factors, jax_dtype(b.result_type)


def cast_to(array, casts: list[BodyOp]):
    for b in casts:
        array = semantics.apply(jnp, b, [array], jax_dtype(b.result_type))
    return array


# ----------------------------------------------------------------------------- operand layout
# An operand's view: per dimension ("loop", loop, stride, offset), ("const", offset) or
# ("sum", ((loop, coeff), (loop, coeff)), offset) for a window (conv, pooling) dimension.
def operand_view(operand: Operand, extents: tuple[int, ...]) -> list[tuple] | None:
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


def _view_index(view: list[tuple], extents: tuple[int, ...], iota=None) -> tuple:
    """The index of an operand's elements the loops read: slices (one dimension per loop or
    window dimension), or with `iota` (loop -> its indices laid over the loops) arrays that
    gather them element by element."""
    index = []
    for row in view:
        if row[0] == "const":
            index.append(row[1])
        elif row[0] == "loop":
            _, loop, stride, offset = row
            last = offset + stride * (extents[loop] - 1)
            index.append(offset + stride * iota(loop) if iota else slice(offset, last + 1, stride))
        else:
            _, terms, offset = row
            last = offset + sum(c * (extents[loop] - 1) for loop, c in terms)
            summed = offset + sum(c * iota(loop) for loop, c in terms) if iota else None
            index.append(summed if iota else slice(offset, last + 1))
    return tuple(index)


def sliced_view(array, view: list[tuple], extents: tuple[int, ...]):
    """The elements the loops read, one dimension per loop or window dimension."""
    index = _view_index(view, extents)
    return array[index] if index else array


def view_labels(view: list[tuple]) -> list:
    """Per dimension of `sliced_view`: its loop, or the (loop, coeff) terms of a window dimension."""
    return [row[1] for row in view if row[0] != "const"]


def loop_labels_of(view: list[tuple]) -> list[int] | None:
    """The loops of a sliced operand's dimensions, if each has its own loop."""
    labels = view_labels(view)
    if any(not isinstance(label, int) for label in labels) or len(set(labels)) != len(labels):
        return None
    return labels


def over_loops(array, labels: list[int], n_loops: int):
    """A sliced operand laid out over the loops: dimension l is loop l (size 1 if unused)."""
    order = sorted(range(len(labels)), key=lambda axis: labels[axis])
    array = jnp.transpose(array, order) if order else array
    shape = [1] * n_loops
    for position, axis in enumerate(order):
        shape[labels[axis]] = array.shape[position]
    return jnp.reshape(array, shape)


def output_loops_of(op: LinalgOp, operand: Operand) -> list[int] | None:
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
def index_function(op: LinalgOp):
    def index(dim: int):
        shape = [1] * op.n_loops
        shape[dim] = op.extents[dim]
        return lax.broadcasted_iota(jax_dtype("index"), shape, dim)

    return index


def loop_arrays(op: LinalgOp, needed: set[int], views, gather: bool = False) -> Callable | None:
    """A function of the operand values giving the needed block arguments laid out over the
    loops, if each of them can be; with `gather`, also an operand read through affine indices
    (`gathered_over_loops`: an all-parallel op's, whose arrays are its output's size anyway)."""
    args = sorted(v for v in needed if v < len(op.operands))
    labels = {k: loop_labels_of(views[k]) for k in args}
    if None in labels.values() and not gather:
        return None

    def arrays(values: list) -> dict:
        return {
            k: over_loops(sliced_view(values[k], views[k], op.extents), labels[k], op.n_loops)
            if labels[k] is not None
            else gathered_over_loops(values[k], views[k], op.extents)
            for k in args
        }

    return arrays


def gathered_over_loops(array, view: list[tuple], extents: tuple[int, ...]):
    """An operand read through affine indices (a window dimension such as `oh * 2 + kh`, or a
    loop indexing two dimensions) laid out over the loops, element by element: each dimension's
    index computed from the loops' iotas, one gather."""
    n = len(extents)

    def iota(loop: int):
        shape = [1] * n
        shape[loop] = extents[loop]
        return jnp.arange(extents[loop]).reshape(shape)

    index = _view_index(view, extents, iota)
    gathered = array[index] if index else array
    return jnp.reshape(gathered, [1] * (n - gathered.ndim) + list(gathered.shape))
