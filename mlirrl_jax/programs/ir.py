"""MLIR module of Linalg ops on tensors -> `Program`: loops, operands, access matrices, graph.

A user module holds one public `func.func` on statically shaped tensors. `load_program` wraps it
into a destination-passing `@kernel` on memrefs (inputs, then outputs), inlines it, tags every
Linalg op with `mlirrl.op_id`, and extracts what the schedules, the features and the reference
evaluator need. Anything it cannot handle is refused with a `ProgramError` that names the op.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import Counter
from pathlib import Path

from mlir import ir, passmanager

from mlirrl_jax.programs.bodies import arith_class, classify_op, extract_body, scalar_constant

# the types, re-exported: callers import them with the parser from here
from mlirrl_jax.programs.program import (
    BodyOp,
    LinalgOp,
    Loop,
    Operand,
    Program,
    ProgramError,
    TensorType,
)

KERNEL_NAME = "kernel"
OP_ID_ATTR = "mlirrl.op_id"

# Top-level ops allowed around the Linalg ops of a kernel.
_GLUE_OPS = {
    "arith.constant",
    "tensor.empty",
    "bufferization.to_tensor",
    "bufferization.materialize_in_destination",
    "func.return",
}
# Ops whose structure the project cannot tile or whose generic form carries no loops.
_UNSCHEDULABLE = {
    "linalg.softmax",
    "linalg.winograd_filter_transform",
    "linalg.pack",
    "linalg.unpack",
}
_ELEMENT_TYPES = {"f32", "f64", "f16", "bf16", "i8", "i16", "i32", "i64"}


def load_program(source: str | os.PathLike, name: str | None = None) -> Program:
    """Build a Program from a `suite://` URI, a path to a .mlir file, or MLIR text."""
    text, default_name = _read_source(source)
    return parse_program(text, name or default_name)


def _read_source(source: str | os.PathLike) -> tuple[str, str]:
    if isinstance(source, str) and source.startswith("suite://"):
        from mlirrl_jax.programs import suites

        entry = suites.get(source)
        return entry.text, source
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and "\n" not in source and source.endswith(".mlir")
    ):
        path = Path(source)
        if not path.is_file():
            raise ProgramError(f"{path}: no such file")
        try:
            return path.read_text(encoding="utf-8"), path.stem
        except UnicodeDecodeError as exc:
            raise ProgramError(
                f"{path}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}), "
                "so not MLIR"
            ) from None
    if isinstance(source, str) and "func.func" in source:
        return source, "inline"
    raise ProgramError(
        f"cannot read program {str(source)[:80]!r}: expected a suite:// URI, a .mlir file or MLIR text"
    )


_THREAD = threading.local()


def _context() -> ir.Context:
    """This thread's MLIR context for parsing, made once: a new context costs about 10 ms,
    which dominated loading a store of thousands of programs."""
    if getattr(_THREAD, "context", None) is None:
        _THREAD.context = ir.Context()
    return _THREAD.context


def parse_program(text: str, name: str = "program") -> Program:
    """Parse MLIR text holding one public tensor function into a Program."""
    with _context(), ir.Location.unknown():
        module = _parse_module(text, name)
        func = _the_function(module, name)
        if _is_kernel(func):  # already normalized (e.g. a Program's own `mlir`)
            kernel = module
            inputs, outputs = _kernel_signature(func, name)
        else:
            inputs, outputs = _signature(func, name)
            kernel = _wrap_as_kernel(module, func, inputs, outputs, name)
        ops = _tag_and_collect(kernel, name)
        normalized = str(kernel)
        generic = ir.Module.parse(normalized)
        passmanager.PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))").run(
            generic.operation
        )
        generic_ops = _top_level_ops(_kernel_func(generic))
        generic_ops = [op for op in generic_ops if op.operation.name.startswith("linalg.")]
        if len(generic_ops) != len(ops):
            raise ProgramError(f"{name}: generalizing named ops changed the op count")
        linalg_ops, edges = [], []
        for op_id, (named, generic_op) in enumerate(zip(ops, generic_ops)):
            op, op_edges = _extract_op(op_id, named, generic_op, inputs, name)
            linalg_ops.append(op)
            edges.extend(op_edges)
        returns = _kernel_returns(kernel, len(inputs))
    if not linalg_ops:
        raise ProgramError(f"{name}: no Linalg op to schedule")
    digest = hashlib.sha256(normalized.encode()).hexdigest()
    return Program(name, normalized, inputs, outputs, linalg_ops, edges, returns, digest)


def _parse_module(text: str, name: str) -> ir.Module:
    try:
        return ir.Module.parse(text)
    except Exception as exc:  # the bindings raise MLIRError with the diagnostics
        detail = " ".join(str(exc).split())
        raise ProgramError(f"{name}: MLIR text does not parse: {detail[:400]}") from None


def _the_function(module: ir.Module, name: str):
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    public = [f for f in funcs if "sym_visibility" not in f.attributes]
    if len(public) != 1:
        raise ProgramError(f"{name}: expected exactly one public func.func, found {len(public)}")
    if len(funcs) != 1:
        raise ProgramError(f"{name}: calls between functions are not supported; inline them first")
    return public[0]


def _tensor_type(t: ir.Type, what: str, name: str) -> TensorType:
    if not isinstance(t, ir.RankedTensorType):
        raise ProgramError(f"{name}: {what} has type {t}; only ranked tensors are supported")
    rt = ir.RankedTensorType(t)
    if not rt.has_static_shape:
        raise ProgramError(
            f"{name}: {what} has dynamic shape {t}; only static shapes are supported"
        )
    element = str(rt.element_type)
    if element not in _ELEMENT_TYPES:
        raise ProgramError(f"{name}: {what} has element type {element}, which is not supported")
    return TensorType(tuple(rt.shape), element)


def _signature(func, name: str) -> tuple[list[TensorType], list[TensorType]]:
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    inputs = [_tensor_type(t, f"argument {i}", name) for i, t in enumerate(ftype.inputs)]
    outputs = [_tensor_type(t, f"result {i}", name) for i, t in enumerate(ftype.results)]
    if not outputs:
        raise ProgramError(f"{name}: the function returns nothing")
    return inputs, outputs


def _is_kernel(func) -> bool:
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    named = ir.StringAttr(func.attributes["sym_name"]).value == KERNEL_NAME
    return named and not ftype.results and all(isinstance(t, ir.MemRefType) for t in ftype.inputs)


def _kernel_signature(func, name: str) -> tuple[list[TensorType], list[TensorType]]:
    """Inputs (read through to_tensor) and outputs (written by materialize) of a kernel."""
    inputs, outputs = [], []
    for op in _top_level_ops(func):
        if op.operation.name == "bufferization.to_tensor":
            inputs.append(_tensor_type(op.result.type, "kernel input", name))
        elif op.operation.name == "bufferization.materialize_in_destination":
            outputs.append(_tensor_type(op.operands[0].type, "kernel output", name))
    return inputs, outputs


def _memref(t: TensorType) -> str:
    return f"memref<{'x'.join(map(str, t.shape))}{'x' if t.shape else ''}{t.element_type}>"


def _tensor(t: TensorType) -> str:
    return f"tensor<{'x'.join(map(str, t.shape))}{'x' if t.shape else ''}{t.element_type}>"


def _wrap_as_kernel(module, func, inputs, outputs, name: str) -> ir.Module:
    """Add a DPS `@kernel` on memrefs that calls the function, then inline and drop it."""
    callee = ir.StringAttr(func.attributes["sym_name"]).value
    func.attributes["sym_visibility"] = ir.StringAttr.get("private")
    n_in = len(inputs)
    args = [f"%in{i}: {_memref(t)}" for i, t in enumerate(inputs)]
    args += [f"%out{i}: {_memref(t)}" for i, t in enumerate(outputs)]
    lines = [f"func.func @{KERNEL_NAME}({', '.join(args)}) attributes {{llvm.emit_c_interface}} {{"]
    for i, t in enumerate(inputs):
        lines.append(
            f"  %t{i} = bufferization.to_tensor %in{i} restrict : {_memref(t)} to {_tensor(t)}"
        )
    results = ", ".join(_tensor(t) for t in outputs)
    call_args = ", ".join(f"%t{i}" for i in range(n_in))
    in_types = ", ".join(_tensor(t) for t in inputs)
    lines.append(
        f"  %r:{len(outputs)} = func.call @{callee}({call_args}) : ({in_types}) -> ({results})"
    )
    for i, t in enumerate(outputs):
        lines.append(
            f"  bufferization.materialize_in_destination %r#{i} in restrict writable %out{i}"
            f" : ({_tensor(t)}, {_memref(t)}) -> ()"
        )
    lines += ["  return", "}"]
    wrapper = "\n".join(lines)
    text = str(module).rstrip()
    if not text.endswith("}"):
        raise ProgramError(f"{name}: unexpected module text")
    combined = text[:-1] + wrapper + "\n}\n"
    try:
        kernel = ir.Module.parse(combined)
        passmanager.PassManager.parse("builtin.module(inline{default-pipeline=}, symbol-dce)").run(
            kernel.operation
        )
    except Exception as exc:
        detail = " ".join(str(exc).split())
        raise ProgramError(f"{name}: cannot build the kernel wrapper: {detail[:400]}") from None
    return kernel


def _kernel_func(module: ir.Module):
    return next(op for op in module.body.operations if op.operation.name == "func.func")


def _top_level_ops(func) -> list:
    return list(func.regions[0].blocks[0].operations)


def _tag_and_collect(kernel: ir.Module, name: str) -> list:
    """Check the kernel's top-level ops and tag each Linalg op with its id."""
    ops = []
    i64 = ir.IntegerType.get_signless(64)
    for op in _top_level_ops(_kernel_func(kernel)):
        op_name = op.operation.name
        if op_name.startswith("linalg."):
            if op_name in _UNSCHEDULABLE:
                raise ProgramError(f"{name}: {op_name} is not supported (no tileable loop nest)")
            op.operation.attributes[OP_ID_ATTR] = ir.IntegerAttr.get(i64, len(ops))
            ops.append(op)
        elif op_name not in _GLUE_OPS:
            raise ProgramError(
                f"{name}: {op_name} is not supported between Linalg ops; only {sorted(_GLUE_OPS)}"
            )
        elif op_name == "arith.constant" and isinstance(op.result.type, ir.RankedTensorType):
            raise ProgramError(f"{name}: tensor constants are not supported; pass them as inputs")
        for region in op.operation.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name.startswith("linalg.") and inner.operation.name not in (
                        "linalg.yield",
                        "linalg.index",
                    ):
                        raise ProgramError(
                            f"{name}: nested {inner.operation.name} is not supported"
                        )
    return ops


def _value_source(value: ir.Value, n_inputs: int) -> tuple:
    """Where a kernel-level value comes from (see `Operand.source`)."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        raise ProgramError("kernel block arguments are only used through bufferization.to_tensor")
    op = owner.operation if hasattr(owner, "operation") else owner
    if OP_ID_ATTR in op.attributes:
        result_index = ir.OpResult(value).result_number
        return ("op", (ir.IntegerAttr(op.attributes[OP_ID_ATTR]).value, result_index))
    if op.name == "bufferization.to_tensor":
        memref_arg = ir.BlockArgument(op.operands[0])
        return ("arg", memref_arg.arg_number)
    if op.name == "tensor.empty":
        return ("empty", None)
    if op.name == "arith.constant":
        return ("scalar", scalar_constant(op))
    raise ProgramError(f"value produced by {op.name} is not supported as a Linalg operand")


def _affine_linear(expr, n_dims: int) -> tuple[list[int], int]:
    """Coefficients and constant of an affine expression that is linear in the dims."""
    if isinstance(expr, ir.AffineDimExpr):
        coeffs = [0] * n_dims
        coeffs[ir.AffineDimExpr(expr).position] = 1
        return coeffs, 0
    if isinstance(expr, ir.AffineConstantExpr):
        return [0] * n_dims, ir.AffineConstantExpr(expr).value
    if isinstance(expr, ir.AffineAddExpr):
        add = ir.AffineAddExpr(expr)
        (lc, lk), (rc, rk) = _affine_linear(add.lhs, n_dims), _affine_linear(add.rhs, n_dims)
        return [a + b for a, b in zip(lc, rc)], lk + rk
    if isinstance(expr, ir.AffineMulExpr):
        mul = ir.AffineMulExpr(expr)
        (lc, lk), (rc, rk) = _affine_linear(mul.lhs, n_dims), _affine_linear(mul.rhs, n_dims)
        if any(lc) and any(rc):
            raise ProgramError(f"indexing expression {expr} is not linear")
        if any(lc):
            return [c * rk for c in lc], lk * rk
        return [c * lk for c in rc], lk * rk
    raise ProgramError(f"indexing expression {expr} is not supported (mod/floordiv/symbols)")


def _element_type_of(t: ir.Type) -> str:
    if isinstance(t, ir.ShapedType):
        return str(ir.ShapedType(t).element_type)
    return str(t)


def _shape_of(t: ir.Type) -> tuple[int, ...]:
    if isinstance(t, ir.ShapedType):
        return tuple(ir.ShapedType(t).shape)
    return ()


_ITERATOR_RE = re.compile(r"iterator_type<(\w+)>")


def _extract_op(op_id: int, named, generic, inputs, name: str):
    op_name = named.operation.name
    where = f"{name}: op {op_id} ({op_name})"
    if generic.operation.name != "linalg.generic":
        raise ProgramError(f"{where}: has no generic form, cannot be scheduled")
    maps = [ir.AffineMapAttr(m).value for m in generic.attributes["indexing_maps"]]
    iterators = _ITERATOR_RE.findall(str(generic.attributes["iterator_types"]))
    n_loops = len(iterators)
    n_inputs = len(generic.inputs)
    operands, edges = [], []
    for index, (value, amap) in enumerate(zip(generic.operands, maps)):
        if amap.n_symbols:
            raise ProgramError(f"{where}: indexing map {amap} uses symbols")
        try:
            rows = [_affine_linear(e, n_loops) for e in amap.results]
            source = _value_source(named.operation.operands[index], len(inputs))
        except ProgramError as exc:
            raise ProgramError(f"{where}: operand {index}: {exc}") from None
        if source[0] == "op":
            edges.append((source[1][0], op_id, index))
        operands.append(
            Operand(
                shape=_shape_of(value.type),
                element_type=_element_type_of(value.type),
                access=tuple(tuple(c) for c, _ in rows),
                offset=tuple(k for _, k in rows),
                is_output=index >= n_inputs,
                source=source,
            )
        )
    extents = _loop_extents(operands, n_loops, where)
    loops = [Loop(e, it) for e, it in zip(extents, iterators)]
    body, yields = extract_body(generic, where)
    counts = Counter(arith_class(b.name) for b in body)
    counts.pop(None, None)
    kind = classify_op(op_name, loops, counts)
    for operand in operands:
        if operand.is_output and operand.source[0] == "empty" and "reduction" in iterators:
            raise ProgramError(f"{where}: reduces into an uninitialised tensor.empty")
    return LinalgOp(op_id, op_name, kind, loops, operands, body, yields, dict(counts)), edges


def _loop_extents(operands: list[Operand], n_loops: int, where: str) -> list[int]:
    """Each loop's extent, read off an operand dimension indexed by that loop alone."""
    extents: list[int | None] = [None] * n_loops
    for operand in operands:
        for row, offset, size in zip(operand.access, operand.offset, operand.shape):
            nonzero = [i for i, c in enumerate(row) if c]
            if len(nonzero) == 1 and row[nonzero[0]] == 1 and offset == 0:
                extents[nonzero[0]] = extents[nonzero[0]] or size
    missing = [i for i, e in enumerate(extents) if e is None]
    if missing:
        raise ProgramError(f"{where}: cannot infer the extent of loop(s) {missing}")
    return [int(e) for e in extents]


def _kernel_returns(kernel: ir.Module, n_inputs: int) -> list[tuple]:
    returns = []
    for op in _top_level_ops(_kernel_func(kernel)):
        if op.operation.name == "bufferization.materialize_in_destination":
            returns.append(_value_source(op.operands[0], n_inputs))
    return returns


__all__ = [
    "KERNEL_NAME",
    "OP_ID_ATTR",
    "BodyOp",
    "LinalgOp",
    "Loop",
    "Operand",
    "Program",
    "ProgramError",
    "TensorType",
    "load_program",
    "parse_program",
]
