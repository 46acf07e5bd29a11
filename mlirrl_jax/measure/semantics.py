"""What each scalar op of a Linalg body computes, written once for NumPy and for JAX.

Every op is a function of the array module `xp` (numpy or jax.numpy) and its operand values,
so the NumPy reference (`reference.py`) and the JAX translation (`xla.py`) compute the same
thing. `apply` converts each result to the array type its caller computes the op's result
type in (the reference computes floats in float64, the translation in the type itself).

The functions follow MLIR's definitions where NumPy's or JAX's own differ: `cmpf one` is false
when an operand is NaN; unsigned ops (`cmpi ult`, `uitofp`, `divui`, ...) read an operand's bits
as an unsigned number of its width; `maximumf`/`minimumf` order -0.0 below +0.0 (`np.maximum`
returns its second operand when they compare equal); `divsi` rounds toward zero; `remf` and
`remsi` take the dividend's sign (C's fmod and %). An `i1` is a NumPy/JAX bool: read as signed,
`true` is -1 (so `sitofp` gives -1.0), and integer results of type `i1` keep the low bit, as
`trunci` does. `maxnumf`/`minnumf` of -0.0 and +0.0 may give either (LLVM's maxnum/minnum).
Division by zero, `divsi` of the smallest integer by -1 and out-of-range `fptosi` are undefined
in MLIR and follow the array module here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from mlirrl_jax.programs.ir import BodyOp

Array = Any  # a NumPy or JAX array
OpFunction = Callable[..., Array]  # (xp, *operand values) -> the result, before conversion


def _as_is(xp: ModuleType, x: Array) -> Array:
    return x


def _signed(xp: ModuleType, x: Array) -> Array:
    """Integer `x` read as signed: an i1 `true` is -1."""
    return -x.astype(np.int8) if x.dtype == np.bool_ else x


def _unsigned(xp: ModuleType, x: Array) -> Array:
    """Integer `x`'s bits read as an unsigned number of its width."""
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    return x.astype(np.dtype(f"uint{8 * x.dtype.itemsize}"))


def _xp(name: str, read: Callable[[ModuleType, Array], Array] = _as_is) -> OpFunction:
    """The array module's function `name` on the operands, each read through `read`."""
    return lambda xp, *args: getattr(xp, name)(*(read(xp, a) for a in args))


def _maximumf(xp: ModuleType, a: Array, b: Array) -> Array:
    """IEEE 754-2019 maximum: NaN if either operand is NaN; +0.0 is above -0.0."""
    larger = xp.where((a > b) | ((a == b) & xp.signbit(b)), a, b)
    return xp.where(xp.isnan(a), a, larger)


def _minimumf(xp: ModuleType, a: Array, b: Array) -> Array:
    """IEEE 754-2019 minimum: NaN if either operand is NaN; -0.0 is below +0.0."""
    smaller = xp.where((a < b) | ((a == b) & xp.signbit(a)), a, b)
    return xp.where(xp.isnan(a), a, smaller)


def _divsi(xp: ModuleType, a: Array, b: Array) -> Array:
    """Signed division rounding toward zero: the floor, plus one where it is inexact and the
    signs differ."""
    a, b = _signed(xp, a), _signed(xp, b)
    quotient = xp.floor_divide(a, b)
    return quotient + ((quotient * b != a) & ((a < 0) != (b < 0)))


def _rsqrt(xp: ModuleType, x: Array) -> Array:
    return 1 / xp.sqrt(x)


def _erf(xp: ModuleType, x: Array) -> Array:
    """The error function (a GELU's): JAX's, else the C library's element by element."""
    if xp is np:
        import math

        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)
    import jax.scipy.special

    return jax.scipy.special.erf(x)


OPS: dict[str, OpFunction] = {
    "arith.addf": _xp("add"),
    "arith.subf": _xp("subtract"),
    "arith.mulf": _xp("multiply"),
    "arith.divf": _xp("divide"),
    "arith.remf": _xp("fmod"),
    "arith.negf": _xp("negative"),
    "arith.maximumf": _maximumf,
    "arith.minimumf": _minimumf,
    "arith.maxnumf": _xp("fmax"),
    "arith.minnumf": _xp("fmin"),
    "arith.addi": _xp("add", _signed),
    "arith.subi": _xp("subtract", _signed),
    "arith.muli": _xp("multiply", _signed),
    "arith.divsi": _divsi,
    "arith.remsi": _xp("fmod", _signed),
    "arith.divui": _xp("floor_divide", _unsigned),
    "arith.remui": _xp("remainder", _unsigned),
    "arith.maxsi": _xp("maximum", _signed),
    "arith.minsi": _xp("minimum", _signed),
    "arith.maxui": _xp("maximum", _unsigned),
    "arith.minui": _xp("minimum", _unsigned),
    "arith.andi": _xp("bitwise_and"),
    "arith.ori": _xp("bitwise_or"),
    "arith.xori": _xp("bitwise_xor"),
    "arith.select": _xp("where"),
    "math.powf": _xp("power"),
    "math.exp": _xp("exp"),
    "math.log": _xp("log"),
    "math.tanh": _xp("tanh"),
    "math.erf": _erf,
    "math.sqrt": _xp("sqrt"),
    "math.rsqrt": _rsqrt,
    "math.absf": _xp("abs"),
    "math.sin": _xp("sin"),
    "math.cos": _xp("cos"),
    "math.floor": _xp("floor"),
    "math.ceil": _xp("ceil"),
    # casts: the conversion to the result type in `apply` does the rest (fptosi: toward zero)
    "arith.extf": _as_is,
    "arith.truncf": _as_is,
    "arith.fptosi": _as_is,
    "arith.trunci": _as_is,
    "arith.index_cast": _signed,
    "arith.extsi": _signed,
    "arith.sitofp": _signed,
    "arith.index_castui": _unsigned,
    "arith.extui": _unsigned,
    "arith.uitofp": _unsigned,
}
# The ops that only convert their one operand to the result type.
CASTS = frozenset(
    {
        "arith.extf",
        "arith.truncf",
        "arith.fptosi",
        "arith.trunci",
        "arith.index_cast",
        "arith.extsi",
        "arith.sitofp",
        "arith.index_castui",
        "arith.extui",
        "arith.uitofp",
    }
)


def _ordered(xp: ModuleType, a: Array, b: Array) -> Array:
    return ~(xp.isnan(a) | xp.isnan(b))


def _constant(value: bool) -> OpFunction:
    return lambda xp, a, b: xp.full(xp.broadcast_shapes(xp.shape(a), xp.shape(b)), value)


def _or_unordered(name: str) -> OpFunction:
    """The comparison `name`, also true when an operand is NaN."""
    return lambda xp, a, b: getattr(xp, name)(a, b) | ~_ordered(xp, a, b)


# arith.cmpf by predicate number: false oeq ogt oge olt ole one ord ueq ugt uge ult ule une uno
# true; NumPy's and JAX's comparisons are false with a NaN operand, except not_equal
CMPF_PREDICATES: tuple[OpFunction, ...] = (
    _constant(False),
    _xp("equal"),
    _xp("greater"),
    _xp("greater_equal"),
    _xp("less"),
    _xp("less_equal"),
    lambda xp, a, b: xp.not_equal(a, b) & _ordered(xp, a, b),
    _ordered,
    _or_unordered("equal"),
    _or_unordered("greater"),
    _or_unordered("greater_equal"),
    _or_unordered("less"),
    _or_unordered("less_equal"),
    _xp("not_equal"),
    lambda xp, a, b: ~_ordered(xp, a, b),
    _constant(True),
)
# arith.cmpi by predicate number: eq ne slt sle sgt sge ult ule ugt uge
CMPI_PREDICATES: tuple[OpFunction, ...] = (
    _xp("equal"),
    _xp("not_equal"),
    _xp("less", _signed),
    _xp("less_equal", _signed),
    _xp("greater", _signed),
    _xp("greater_equal", _signed),
    _xp("less", _unsigned),
    _xp("less_equal", _unsigned),
    _xp("greater", _unsigned),
    _xp("greater_equal", _unsigned),
)


def supported(op: BodyOp) -> bool:
    """Whether `apply` evaluates `op` (`linalg.index` is left to the caller: it needs the loops)."""
    predicate = dict(op.attrs).get("predicate", -1)
    if op.name == "arith.cmpf":
        return 0 <= predicate < len(CMPF_PREDICATES)
    if op.name == "arith.cmpi":
        return 0 <= predicate < len(CMPI_PREDICATES)
    return op.name == "arith.constant" or op.name in OPS


def apply(xp: ModuleType, op: BodyOp, args: Sequence[Array], dtype) -> Array:
    """The value of body op `op` on its operand values, as an array of `dtype` (the type the
    caller computes `op.result_type` in); `xp` is numpy or jax.numpy."""
    attrs = dict(op.attrs)
    if op.name == "arith.constant":
        return xp.asarray(attrs["value"], dtype)
    if op.name == "arith.cmpf":
        value = CMPF_PREDICATES[attrs["predicate"]](xp, *args)
    elif op.name == "arith.cmpi":
        value = CMPI_PREDICATES[attrs["predicate"]](xp, *args)
    else:
        value = OPS[op.name](xp, *args)
    value = xp.asarray(value)
    if np.dtype(dtype) == np.bool_ and xp.issubdtype(value.dtype, xp.integer):
        value = value & 1  # an integer i1 result keeps the low bit
    return value.astype(dtype, copy=False)
