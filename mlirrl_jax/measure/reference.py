"""A NumPy evaluator of a Program: the reference a compiled kernel's output must match.

It is independent of MLIR's lowering: each op is evaluated from its access matrices and its
body ops (as `semantics` defines them), in float64 for floating-point types, over chunks of the
iteration space. Reductions whose body is `out = combine(out, f(inputs))` are reduced with the
combiner's ufunc; other reduction bodies are evaluated one reduction point at a time.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from mlirrl_jax.errors import Error
from mlirrl_jax.measure import semantics
from mlirrl_jax.programs.ir import BodyOp, LinalgOp, Program

CHUNK_POINTS = 1 << 22  # iteration points evaluated at once (bounds the evaluator's memory)
MAX_SEQUENTIAL_REDUCTION = 1 << 16

NUMPY_TYPES = {
    "f16": np.float16,
    "bf16": np.float32,
    "f32": np.float32,
    "f64": np.float64,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "index": np.int64,
    "i1": np.bool_,
}


class ReferenceUnsupported(Error, ValueError):
    """The program cannot be evaluated by the reference (an unsupported body op, say)."""


def compute_dtype(element_type: str):
    """The NumPy type the reference computes in: float64 for floats, the type itself else."""
    if element_type.startswith(("f", "bf")):
        return np.float64
    return NUMPY_TYPES[element_type]


def random_inputs(program: Program, seed: int) -> list[np.ndarray]:
    """Inputs fixed by a seed: floats uniform in [-1, 1), integers in [-8, 8)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for t in program.inputs:
        dtype = NUMPY_TYPES[t.element_type]
        if np.issubdtype(dtype, np.floating):
            values = rng.random(t.shape, dtype=np.float32) * 2 - 1
        else:
            values = rng.integers(-8, 8, size=t.shape)
        arrays.append(np.asarray(values, dtype=dtype))  # a rank-0 tensor too: an array
    return arrays


def evaluate(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The program's outputs for `inputs`, in the compute dtype (float64 for floats)."""
    results: dict[tuple[int, int], np.ndarray] = {}
    for op in program.ops:
        operands = []
        for operand in op.operands:
            kind, ref = operand.source
            dtype = compute_dtype(operand.element_type)
            if kind == "arg":
                operands.append(inputs[ref].astype(dtype))
            elif kind == "op":
                operands.append(results[ref])
            elif kind == "scalar":
                operands.append(np.asarray(ref, dtype=dtype))
            else:  # an uninitialised tensor: only written, never read, by well-formed ops
                operands.append(np.zeros(operand.shape, dtype=dtype))
        for index, value in enumerate(evaluate_op(op, operands)):
            results[(op.id, index)] = value
    outputs = []
    for kind, ref in program.returns:
        outputs.append(results[ref] if kind == "op" else inputs[ref].astype(np.float64))
    return outputs


def evaluate_op(op: LinalgOp, operands: list[np.ndarray]) -> list[np.ndarray]:
    """Evaluate one op; returns its results (the updated output operands)."""
    n_in = len(op.inputs)
    results = [operands[n_in + j].copy() for j in range(len(op.outputs))]
    reductions = [i for i, lp in enumerate(op.loops) if lp.iterator == "reduction"]
    combiners = _combiners(op, n_in) if reductions else None
    if reductions and combiners is None and _sequential_size(op) > MAX_SEQUENTIAL_REDUCTION:
        raise ReferenceUnsupported(
            f"op {op.id} ({op.name}): reduction body is too irregular to evaluate"
        )
    for ranges in _chunks(op):
        ivs = _index_vectors(ranges, op.n_loops)
        if not reductions:
            values = _run_body(op, operands, ivs, results)
            shape = np.broadcast_shapes(*(iv.shape for iv in ivs))
            for j, value in enumerate(values):
                _scatter(results[j], op.outputs[j], ivs, np.broadcast_to(value, shape))
        elif combiners is not None:
            _reduce_chunk(op, operands, ivs, results, combiners, reductions)
        else:
            _sequential_chunk(op, operands, ranges, results, reductions)
    return results


def _sequential_size(op: LinalgOp) -> int:
    return math.prod(lp.extent for lp in op.loops if lp.iterator == "reduction")


def _chunks(op: LinalgOp):
    """Ranges per loop covering the iteration space, with at most ~CHUNK_POINTS points each."""
    extents = list(op.extents)
    steps = list(extents)
    budget = CHUNK_POINTS
    red = math.prod(e for e, lp in zip(extents, op.loops) if lp.iterator == "reduction")
    budget = max(1, budget // red)
    # keep the innermost parallel loops whole; split the outer ones
    parallel = [i for i, lp in enumerate(op.loops) if lp.iterator == "parallel"]
    for i in reversed(parallel):
        if extents[i] <= budget:
            budget //= extents[i]
        else:
            steps[i] = max(1, budget)
            budget = 1
    starts = [range(0, e, s) for e, s in zip(extents, steps)]
    for corner in itertools.product(*starts):
        yield [range(c, min(c + s, e)) for c, s, e in zip(corner, steps, extents)]


def _index_vectors(ranges: list[range], n_loops: int) -> list[np.ndarray]:
    ivs = []
    for axis, r in enumerate(ranges):
        shape = [1] * n_loops
        shape[axis] = len(r)
        ivs.append(np.arange(r.start, r.stop, dtype=np.int64).reshape(shape))
    return ivs


def _indices(operand, ivs: list) -> tuple:
    index = []
    for row, offset in zip(operand.access, operand.offset):
        term = offset
        for coeff, iv in zip(row, ivs):
            if coeff:
                term = term + coeff * iv
        index.append(np.asarray(term))
    return tuple(index)


def _gather(array: np.ndarray, operand, ivs: list) -> np.ndarray:
    if array.ndim == 0:
        return array
    return array[_indices(operand, ivs)]


def _scatter(target: np.ndarray, operand, ivs: list, values: np.ndarray) -> None:
    index = _indices(operand, ivs)
    shape = values.shape
    target[tuple(np.broadcast_to(i, shape) for i in index)] = values


# Combiners of `out = combine(out, f(inputs))` reductions, as the NumPy ufuncs that reduce with
# them. They agree with `semantics` except on the sign of a zero result (np.maximum(0.0, -0.0)
# is -0.0, arith.maximumf's is 0.0), which `compare` does not tell apart.
_REDUCING_UFUNCS = {
    "arith.addf": np.add,
    "arith.addi": np.add,
    "arith.mulf": np.multiply,
    "arith.muli": np.multiply,
    "arith.maximumf": np.maximum,
    "arith.minimumf": np.minimum,
    "arith.maxnumf": np.fmax,
    "arith.minnumf": np.fmin,
    "arith.maxsi": np.maximum,
    "arith.minsi": np.minimum,
    "arith.andi": np.bitwise_and,
    "arith.ori": np.bitwise_or,
    "arith.xori": np.bitwise_xor,
}


def _eval_body_op(b: BodyOp, args: list, ivs: list):
    if b.name == "linalg.index":
        return ivs[dict(b.attrs)["dim"]]
    if not semantics.supported(b):
        raise ReferenceUnsupported(f"body op {b.name} is not supported by the reference evaluator")
    with np.errstate(all="ignore"):  # NaN and infinities are values, as in the kernels
        return semantics.apply(np, b, args, compute_dtype(b.result_type))


def _run_body(op, operands, ivs, outputs):
    """Evaluate the body; block args are gathered operands (outputs from `outputs`)."""
    n_in = len(op.inputs)
    values = [_gather(operands[k], op.operands[k], ivs) for k in range(n_in)]
    values += [_gather(outputs[j], op.outputs[j], ivs) for j in range(len(op.outputs))]
    for b in op.body:
        values.append(_eval_body_op(b, [values[i] for i in b.operands], ivs))
    return [values[y] for y in op.yields]


def _depends_on(op: LinalgOp, value: int, sources: set[int]) -> bool:
    n_args = len(op.operands)
    if value in sources:
        return True
    if value < n_args:
        return False
    b = op.body[value - n_args]
    return any(_depends_on(op, v, sources) for v in b.operands)


def _combiners(op: LinalgOp, n_in: int):
    """Per output, (ufunc, value number of f(inputs)) when the yield is combine(out, f(...))."""
    n_args = len(op.operands)
    outs = set(range(n_in, n_args))
    found = []
    for j, y in enumerate(op.yields):
        if y < n_args:
            return None
        b = op.body[y - n_args]
        if b.name not in _REDUCING_UFUNCS:
            return None
        lhs, rhs = b.operands
        if lhs == n_in + j and not _depends_on(op, rhs, outs):
            found.append((_REDUCING_UFUNCS[b.name], rhs))
        elif rhs == n_in + j and not _depends_on(op, lhs, outs):
            found.append((_REDUCING_UFUNCS[b.name], lhs))
        else:
            return None
    return found


def _value_of(op, operands, ivs, number: int, shape):
    """Compute body value `number` over the chunk (outputs are not read: it doesn't use them)."""
    n_args = len(op.operands)
    values = [_gather(operands[k], op.operands[k], ivs) for k in range(len(op.inputs))]
    values += [None] * (n_args - len(values))
    for b in op.body[: max(0, number - n_args + 1)]:
        values.append(_eval_body_op(b, [values[i] for i in b.operands], ivs))
    return np.broadcast_to(values[number], shape)


def _reduce_chunk(op, operands, ivs, results, combiners, reductions):
    shape = np.broadcast_shapes(*(iv.shape for iv in ivs))
    parallel_ivs = [
        iv if i not in reductions else np.zeros((1,) * len(ivs), np.int64)
        for i, iv in enumerate(ivs)
    ]
    for j, (ufunc, number) in enumerate(combiners):
        partial = ufunc.reduce(
            _value_of(op, operands, ivs, number, shape), axis=tuple(reductions), keepdims=True
        )
        current = _gather(results[j], op.outputs[j], parallel_ivs)
        combined = ufunc(current, partial)
        _scatter(results[j], op.outputs[j], parallel_ivs, np.broadcast_to(combined, partial.shape))


def _sequential_chunk(op, operands, ranges, results, reductions):
    n = op.n_loops
    for point in itertools.product(*(ranges[i] for i in reductions)):
        fixed = list(ranges)
        for axis, value in zip(reductions, point):
            fixed[axis] = range(value, value + 1)
        ivs = _index_vectors(fixed, n)
        values = _run_body(op, operands, ivs, results)
        shape = np.broadcast_shapes(*(iv.shape for iv in ivs))
        for j, value in enumerate(values):
            _scatter(results[j], op.outputs[j], ivs, np.broadcast_to(value, shape))


def tolerance(program: Program) -> float:
    """Relative tolerance fit for the longest reduction: rounding error grows ~ sqrt(length)."""
    longest = max((op.reduction_size for op in program.ops), default=1)
    return 1e-5 * max(1.0, math.sqrt(longest)) * max(1, len(program.ops)) ** 0.5


def compare(output: np.ndarray, reference: np.ndarray, rtol: float) -> tuple[bool, float]:
    """Whether `output` matches `reference`; also the worst error relative to the data's scale."""
    if output.shape != reference.shape:
        return False, math.inf
    if np.issubdtype(output.dtype, np.integer):
        return bool(np.array_equal(output, reference)), float(
            np.max(np.abs(output - reference), initial=0)
        )
    ref = reference.astype(np.float64)
    out = output.astype(np.float64)
    finite = np.isfinite(ref)
    if not np.array_equal(np.isnan(out), np.isnan(ref)) or not np.array_equal(
        out[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)]
    ):
        return False, math.inf
    if not finite.any():
        return True, 0.0
    scale = float(np.mean(np.abs(ref[finite]))) or 1.0
    error = np.abs(out[finite] - ref[finite])
    worst = float(np.max(error / (np.abs(ref[finite]) + scale)))
    return worst <= rtol, worst
