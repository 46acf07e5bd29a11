"""Body-op semantics against MLIR's own results: each op is compiled into a kernel that applies
it to every pair of special values (NaN, infinities, signed zeros, the integers whose signed and
unsigned readings differ), and the NumPy reference and the JAX translation must give the
kernel's output exactly."""

from dataclasses import dataclass

import numpy as np
import pytest

from mlirrl_jax.measure import semantics
from mlirrl_jax.measure.compile import compile_kernel
from mlirrl_jax.measure.reference import NUMPY_TYPES, evaluate
from mlirrl_jax.measure.to_jax import jax_function
from mlirrl_jax.programs.ir import Program, parse_program

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOATS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.5, 2.5)
# -1 is 0xFFFFFFFF unsigned, INT32_MIN 0x80000000
INTS = (INT32_MIN, INT32_MIN + 1, -7, -1, 0, 1, 7, INT32_MAX)
# no 0, and no -1: dividing INT32_MIN by -1 traps on x86, as dividing by 0 does
DIVISORS = (INT32_MIN, -7, -2, 1, 2, 7, INT32_MAX)
INT8S = (-128, -1, 0, 1, 127)
INT64S = (-(2**63), -1, 0, 1, 2**63 - 1)
# f64 values that round to f32 (or overflow to its infinities)
DOUBLES = (*FLOATS, 1 / 3, 1e300, -1e300, 1e-300)
# in the range of i32, where fptosi is defined
CONVERTIBLE = (-2.75, -1.5, -0.5, -0.0, 0.0, 0.5, 1.0, 2.75, 1e9, -2147483648.0)

CMPF = "false oeq ogt oge olt ole one ord ueq ugt uge ult ule une uno true".split()
CMPI = "eq ne slt sle sgt sge ult ule ugt uge".split()
# an i1 written out as 0 or 1 (i1 is no tensor element type)
AS_I8 = """
    %one = arith.constant 1 : i8
    %zero = arith.constant 0 : i8
    %r = arith.select %c, %one, %zero : i8"""
# two i1 values from the floats: a < b and a > b
TWO_BOOLS = """
    %c = arith.cmpf olt, %a, %b : f32
    %d = arith.cmpf ogt, %a, %b : f32"""


@dataclass(frozen=True)
class Case:
    """out = body(x, y) for every pair (x, y) of xs and ys; `body` reads %a (x) and %b (y) and
    defines %r."""

    name: str
    types: tuple[str, str, str]  # x, y and out element types
    xs: tuple
    ys: tuple
    body: str
    either_zero: bool = False  # of -0.0 and +0.0, either may come out (maxnumf, minnumf)


def _float(name: str, body: str, either_zero: bool = False) -> Case:
    return Case(name, ("f32", "f32", "f32"), FLOATS, FLOATS, body, either_zero)


def _int(name: str, body: str, ys: tuple = INTS) -> Case:
    return Case(name, ("i32", "i32", "i32"), INTS, ys, body)


CASES = [
    *[
        Case(
            f"cmpf {p}",
            ("f32", "f32", "i8"),
            FLOATS,
            FLOATS,
            f"%c = arith.cmpf {p}, %a, %b : f32{AS_I8}",
        )
        for p in CMPF
    ],
    *[
        Case(
            f"cmpi {p}",
            ("i32", "i32", "i8"),
            INTS,
            INTS,
            f"%c = arith.cmpi {p}, %a, %b : i32{AS_I8}",
        )
        for p in CMPI
    ],
    *[
        _float(op, f"%r = arith.{op} %a, %b : f32", op in ("maxnumf", "minnumf"))
        for op in "addf subf mulf divf remf maximumf minimumf maxnumf minnumf".split()
    ],
    _float("negf", "%r = arith.negf %a : f32"),
    _float(
        "addf of a -0.0 constant",
        "%z = arith.constant -0.0 : f32\n    %r = arith.addf %a, %z : f32",
    ),
    _float("select", "%c = arith.cmpf ult, %a, %b : f32\n    %r = arith.select %c, %a, %b : f32"),
    *[
        _int(op, f"%r = arith.{op} %a, %b : i32")
        for op in "addi subi muli andi ori xori maxsi minsi maxui minui".split()
    ],
    *[
        _int(op, f"%r = arith.{op} %a, %b : i32", DIVISORS)
        for op in "divsi remsi divui remui".split()
    ],
    Case("sitofp", ("i32", "i32", "f32"), INTS, INTS, "%r = arith.sitofp %a : i32 to f32"),
    Case("uitofp", ("i32", "i32", "f32"), INTS, INTS, "%r = arith.uitofp %a : i32 to f32"),
    Case("trunci", ("i32", "i32", "i8"), INTS, INTS, "%r = arith.trunci %a : i32 to i8"),
    Case("extsi", ("i8", "i8", "i32"), INT8S, INT8S, "%r = arith.extsi %a : i8 to i32"),
    Case("extui", ("i8", "i8", "i32"), INT8S, INT8S, "%r = arith.extui %a : i8 to i32"),
    Case("extf", ("f32", "f32", "f64"), FLOATS, FLOATS, "%r = arith.extf %a : f32 to f64"),
    Case("truncf", ("f64", "f64", "f32"), DOUBLES, DOUBLES, "%r = arith.truncf %a : f64 to f32"),
    Case(
        "index_cast",
        ("i32", "i32", "i64"),
        INTS,
        INTS,
        "%i = arith.index_cast %a : i32 to index\n    %r = arith.index_cast %i : index to i64",
    ),
    Case(
        "index_castui",
        ("i32", "i32", "i64"),
        INTS,
        INTS,
        "%i = arith.index_castui %a : i32 to index\n    %r = arith.index_cast %i : index to i64",
    ),
    Case(
        "uitofp of i64", ("i64", "i64", "f64"), INT64S, INT64S, "%r = arith.uitofp %a : i64 to f64"
    ),
    Case(
        "cmpi ult of i64",
        ("i64", "i64", "i8"),
        INT64S,
        INT64S,
        f"%c = arith.cmpi ult, %a, %b : i64{AS_I8}",
    ),
    Case(
        "fptosi",
        ("f32", "f32", "i32"),
        CONVERTIBLE,
        CONVERTIBLE,
        "%r = arith.fptosi %a : f32 to i32",
    ),
    # i1: true is -1 read as signed, 1 read as unsigned, and arithmetic keeps one bit
    _float("sitofp of i1", f"{TWO_BOOLS}\n    %r = arith.sitofp %c : i1 to f32"),
    _float("uitofp of i1", f"{TWO_BOOLS}\n    %r = arith.uitofp %c : i1 to f32"),
    *[
        _float(
            f"{op} of i1",
            f"{TWO_BOOLS}\n    %s = arith.{op} %c, %d : i1\n    %r = arith.uitofp %s : i1 to f32",
        )
        for op in ("addi", "muli", "maxsi", "minsi", "maxui", "minui")
    ],
    *[
        _float(
            f"cmpi {p} of i1",
            f"{TWO_BOOLS}\n    %s = arith.cmpi {p}, %c, %d : i1\n    %r = arith.uitofp %s : i1 to f32",
        )
        for p in ("slt", "sge", "ult", "uge")
    ],
]
# math ops: the reference computes in float64, the kernel in f32, so only close in general
MATH = [
    *[
        _float(op, f"%r = math.{op} %a : f32")
        for op in "exp log tanh erf sqrt rsqrt absf sin cos floor ceil".split()
    ],
    _float("powf", "%r = math.powf %a, %b : f32"),
]


def _pairs(case: Case) -> list[np.ndarray]:
    """Every pair (x, y) of the case's values, as two arrays of the input types."""
    xs = np.repeat(np.array(case.xs), len(case.ys))
    ys = np.tile(np.array(case.ys), len(case.xs))
    return [xs.astype(NUMPY_TYPES[case.types[0]]), ys.astype(NUMPY_TYPES[case.types[1]])]


def _program(case: Case) -> Program:
    x, y, out = case.types
    n = len(case.xs) * len(case.ys)
    text = f"""
#id = affine_map<(i) -> (i)>
func.func @pairs(%x: tensor<{n}x{x}>, %y: tensor<{n}x{y}>) -> tensor<{n}x{out}> {{
  %e = tensor.empty() : tensor<{n}x{out}>
  %r = linalg.generic {{indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}}
       ins(%x, %y : tensor<{n}x{x}>, tensor<{n}x{y}>) outs(%e : tensor<{n}x{out}>) {{
  ^bb0(%a: {x}, %b: {y}, %o: {out}):
    {case.body.strip()}
    linalg.yield %r : {out}
  }} -> tensor<{n}x{out}>
  return %r : tensor<{n}x{out}>
}}
"""
    return parse_program(text, case.name)


def _results(case: Case) -> dict[str, np.ndarray]:
    """The kernel's output, the reference's (in the output type) and the JAX translation's."""
    program = _program(case)
    inputs = _pairs(case)
    out = program.outputs[0]
    mlir = np.zeros(out.shape, NUMPY_TYPES[out.element_type])
    kernel = compile_kernel(program.mlir, None, 1, "auto")
    packed, keep_alive = kernel.pack([*inputs, mlir])
    kernel.function(packed)
    del keep_alive
    with np.errstate(over="ignore"):  # a float64 beyond f32's range becomes inf, as truncf's
        reference = evaluate(program, inputs)[0].astype(mlir.dtype)
    results = {"mlir": mlir, "reference": reference}
    translated = jax_function(program)
    if translated is not None:
        results["jax"] = np.asarray(translated(*inputs)[0])
    elif not _wide(case):
        raise AssertionError(f"{case.name}: no JAX translation")
    return results


def _wide(case: Case) -> bool:
    """Whether the case has 64-bit values, which JAX translates only in its x64 mode."""
    return "64" in "".join(case.types) or "index" in case.body


def _zero_signs(case: Case, actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Where MLIR gives a zero, the same signed zero (unless the op may give either)."""
    zero = expected == 0
    if case.either_zero:
        xs, ys = _pairs(case)
        zero &= (xs != 0) | (ys != 0)
    wrong = zero & (np.signbit(actual) != np.signbit(expected))
    assert not wrong.any(), f"{case.name}: {what} has the wrong zero sign at {np.argwhere(wrong)}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_and_translation_match_mlir_exactly(case):
    results = _results(case)
    expected = results.pop("mlir")
    for what, actual in results.items():
        assert actual.dtype == expected.dtype
        np.testing.assert_array_equal(actual, expected, err_msg=f"{case.name}: {what}")
        if np.issubdtype(expected.dtype, np.floating):
            _zero_signs(case, actual, expected, what)


@pytest.mark.parametrize("case", MATH, ids=lambda c: c.name)
def test_math_ops_match_mlir_on_special_values(case):
    results = _results(case)
    expected = results.pop("mlir")
    for what, actual in results.items():
        np.testing.assert_allclose(actual, expected, rtol=2e-6, err_msg=f"{case.name}: {what}")
        _zero_signs(case, actual, expected, what)


def test_every_op_of_the_table_is_checked_against_mlir():
    assert semantics.CASTS <= set(semantics.OPS)
    assert len(semantics.CMPF_PREDICATES) == len(CMPF)
    assert len(semantics.CMPI_PREDICATES) == len(CMPI)
    checked = {b.name for case in CASES + MATH for b in _program(case).ops[0].body}
    assert set(semantics.OPS) <= checked
