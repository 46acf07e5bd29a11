"""The body of a `linalg.generic` as `BodyOp`s (the arith and math ops, their operands and
constants), and an op's kind from its name, loops and arithmetic."""

from __future__ import annotations

from collections import Counter

from mlir import ir

from mlirrl_jax.programs.program import (
    BodyOp,
    Loop,
    ProgramError,
)


def scalar_constant(op) -> float | int:
    attr = op.attributes["value"]
    if isinstance(attr, ir.FloatAttr):
        return ir.FloatAttr(attr).value
    if isinstance(attr, ir.IntegerAttr):
        return ir.IntegerAttr(attr).value
    if isinstance(attr, ir.DenseElementsAttr) and ir.DenseElementsAttr(attr).is_splat:
        splat = ir.DenseElementsAttr(attr).get_splat_value()
        return (
            ir.FloatAttr(splat).value
            if isinstance(splat, ir.FloatAttr)
            else ir.IntegerAttr(splat).value
        )
    raise ProgramError(f"constant {attr} is not a scalar")


ARITH_CLASSES = {
    "arith.addf": "add",
    "arith.addi": "add",
    "arith.subf": "sub",
    "arith.subi": "sub",
    "arith.mulf": "mul",
    "arith.muli": "mul",
    "arith.divf": "div",
    "arith.divsi": "div",
    "arith.divui": "div",
    "math.exp": "exp",
    "arith.maximumf": "max",
    "arith.minimumf": "max",
    "arith.maxnumf": "max",
    "arith.minnumf": "max",
    "arith.maxsi": "max",
    "arith.minsi": "max",
}


def arith_class(op_name: str) -> str | None:
    if op_name in ARITH_CLASSES:
        return ARITH_CLASSES[op_name]
    if op_name.startswith("math."):
        return "math"
    if op_name in ("arith.constant", "linalg.index") or op_name.startswith("arith.index"):
        return None
    if op_name.startswith("arith."):
        return "other"
    return None


def extract_body(generic, where: str) -> tuple[list[BodyOp], tuple[int, ...]]:
    block = generic.regions[0].blocks[0]
    numbers: dict = {}
    for i, arg in enumerate(block.arguments):
        numbers[arg] = i
    body: list[BodyOp] = []
    next_number = len(block.arguments)

    def number_of(value) -> int:
        if value in numbers:
            return numbers[value]
        owner = value.owner
        if not isinstance(owner, ir.Block) and owner.operation.name == "arith.constant":
            return add_constant(owner)
        raise ProgramError(f"{where}: body uses a value defined outside it ({value})")

    def add_constant(owner) -> int:
        nonlocal next_number
        body.append(
            BodyOp(
                "arith.constant", (), str(owner.result.type), (("value", scalar_constant(owner)),)
            )
        )
        numbers[owner.result] = next_number
        next_number += 1
        return next_number - 1

    yields: tuple[int, ...] = ()
    for op in block.operations:
        name = op.operation.name
        if name == "linalg.yield":
            yields = tuple(number_of(v) for v in op.operands)
            continue
        if name == "arith.constant":
            add_constant(op)
            continue
        if len(op.results) != 1 or op.operation.regions:
            raise ProgramError(f"{where}: body op {name} is not supported")
        attrs: list[tuple[str, object]] = []
        if name == "linalg.index":
            attrs.append(("dim", ir.IntegerAttr(op.attributes["dim"]).value))
        if name in ("arith.cmpf", "arith.cmpi"):
            attrs.append(("predicate", ir.IntegerAttr(op.attributes["predicate"]).value))
        body.append(
            BodyOp(
                name, tuple(number_of(v) for v in op.operands), str(op.result.type), tuple(attrs)
            )
        )
        numbers[op.result] = next_number
        next_number += 1
    return body, yields


def classify_op(op_name: str, loops: list[Loop], counts: Counter) -> str:
    short = op_name.removeprefix("linalg.")
    if short == "fill":
        return "fill"
    if short.startswith("batch_matmul"):
        return "batch_matmul"
    if short.startswith("matmul"):
        return "matmul"
    if short.startswith("depthwise_conv"):
        return "depthwise_conv"
    if short.startswith("conv"):
        return "conv"
    if short.startswith("pooling"):
        return "pooling"
    has_reduction = any(lp.iterator == "reduction" for lp in loops)
    if not has_reduction:
        return "elementwise"
    if counts.get("mul") and counts.get("add"):
        return "contraction"
    return "reduction"
