"""Programs as JAX functions, for XLA:CPU's baseline.

`jax_function(program)` translates a Program op by op into JAX, from what each op computes:
multiply-accumulate contractions over projected permutations become `jnp.einsum`, windowed
multiply-accumulates (the maps hold `stride * p + dilation * r`) `lax.conv_general_dilated`,
windowed reductions `lax.reduce_window`, other reductions a jnp reduction of the body over the
reduction loops, and all-parallel ops (fills, element-wise, broadcasts) the body evaluated with
jnp on operands laid out over the loops. Body ops compute what `semantics` defines, as in
the reference. What it cannot translate exactly gives None.

The body ops and operand views are `jax_body`'s, the windowed reductions (convolutions, poolings)
`jax_windows`'."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from mlirrl_jax.measure.jax_body import (
    REDUCERS,
    OpFunction,
    cast_to,
    combine_values,
    combiners_of,
    computable,
    evaluate_body,
    index_function,
    jax_dtype,
    loop_arrays,
    loop_labels_of,
    needed_values,
    needs_x64,
    operand_view,
    output_loops_of,
    product_of,
    sliced_view,
)
from mlirrl_jax.measure.jax_windows import windowed_reduction
from mlirrl_jax.programs.ir import BodyOp, LinalgOp, Operand, Program


def translate_op(op: LinalgOp) -> OpFunction | None:
    """A JAX function of the op's operand values giving its results, or None."""
    views = [operand_view(o, op.extents) for o in op.operands]
    out_loops = [output_loops_of(op, o) for o in op.outputs]
    if (
        None in views
        or None in out_loops
        or any(jax_dtype(o.element_type) is None for o in op.outputs)
    ):
        return None
    if all(lp.iterator == "parallel" for lp in op.loops):
        return map_op(op, views, out_loops)
    combiners = combiners_of(op)
    if combiners is None:
        return None
    per_output = []
    for j, (combiner, value) in enumerate(combiners):
        args = (op, j, combiner, value, views, out_loops[j])
        fn = windowed_reduction(*args) or contraction_op(*args) or reduction_op(*args)
        if fn is None:
            return None
        per_output.append(fn)
    return lambda values: [fn(values) for fn in per_output]


def map_op(op: LinalgOp, views, out_loops) -> OpFunction | None:
    """An all-parallel op: the body over the loops, each yield written in its output's layout."""
    needed = needed_values(op, op.yields)
    arrays = loop_arrays(op, needed, views, gather=True)
    if arrays is None or not computable(op, needed, index=True):
        return None
    index = index_function(op)

    def run(values: list) -> list:
        computed = evaluate_body(op, needed, arrays(values), index)
        results = []
        for y, loops, out in zip(op.yields, out_loops, op.outputs):
            full = jnp.broadcast_to(computed[y], op.extents)
            results.append(jnp.transpose(full, loops).astype(jax_dtype(out.element_type)))
        return results

    return run


def reduction_op(
    op: LinalgOp, j: int, combiner: BodyOp, value: int, views, loops
) -> Callable | None:
    """out = combine(out, reduce(f(inputs))) with f over the loops, reduced over the reduction
    loops by the combiner's jnp reduction (XLA fuses f into the reduction)."""
    needed = needed_values(op, [value])
    arrays = loop_arrays(op, needed, views)
    if arrays is None or not computable(op, needed, index=True):
        return None
    index = index_function(op)
    reduced = tuple(i for i, lp in enumerate(op.loops) if lp.iterator == "reduction")
    parallel = [i for i, lp in enumerate(op.loops) if lp.iterator == "parallel"]
    out = len(op.inputs) + j

    def run(values: list):
        f = evaluate_body(op, needed, arrays(values), index)[value]
        full = jnp.broadcast_to(f, op.extents)
        total = REDUCERS[combiner.name](full, axis=reduced)  # integers wrap alike when cast
        total = jnp.transpose(total, [parallel.index(loop) for loop in loops])
        return combine_values(combiner, values[out], total)

    return run


def contraction_op(
    op: LinalgOp, j: int, combiner: BodyOp, value: int, views, loops
) -> Callable | None:
    """out += a * b over projected permutations: one `jnp.einsum` (a dot_general)."""
    product = product_of(op, value)
    if combiner.name not in ("arith.addf", "arith.addi") or product is None:
        return None
    ((ka, casts_a), (kb, casts_b)), dtype = product
    labels_a, labels_b = loop_labels_of(views[ka]), loop_labels_of(views[kb])
    if labels_a is None or labels_b is None or not computable(op, {ka, kb}, index=False):
        return None
    if set(labels_a) | set(labels_b) != set(range(op.n_loops)):
        return None  # a loop that indexes neither factor multiplies the sum: not an einsum

    def letters(labels):
        return "".join("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[i] for i in labels)

    spec = f"{letters(labels_a)},{letters(labels_b)}->{letters(loops)}"
    out = len(op.inputs) + j

    def run(values: list):
        a = cast_to(sliced_view(values[ka], views[ka], op.extents), casts_a)
        b = cast_to(sliced_view(values[kb], views[kb], op.extents), casts_b)
        total = jnp.einsum(spec, a, b, preferred_element_type=dtype)
        return combine_values(combiner, values[out], total)

    return run


def translate_program(program: Program) -> Callable | None:
    """The program as a function of its inputs, whatever JAX's x64 setting (see jax_function)."""
    functions = [translate_op(op) for op in program.ops]
    out_dtypes = [jax_dtype(t.element_type) for t in program.outputs]
    if None in functions or None in out_dtypes:
        return None

    def operand_value(operand: Operand, inputs, results):
        kind, ref = operand.source
        if kind == "arg":
            return jnp.asarray(inputs[ref])
        if kind == "op":
            return results[ref]
        if kind == "scalar":
            return jnp.asarray(ref, jax_dtype(operand.element_type))
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
    if needs_x64(program) and not jax.config.jax_enable_x64:
        return None
    return translate_program(program)


def plain_matmul(program: Program) -> bool:
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
