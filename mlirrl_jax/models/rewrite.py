"""Strided convolutions as a gather and a contraction, before a model is cut.

MLIR's vectorizer turns a 2-D convolution into 1-D ones (`decompose`) and vectorizes those; where
the window walks its row with a stride, it can only do so one output element at a time, so a
strided convolution runs several times slower per FLOP than the same shape with stride 1
(ResNet-18's 7x7/2 stem: 10.2 ms at best against 2.2 ms for a 3x3/1 convolution of the same
FLOPs, `bench/results/history.md`). Written as two ops it has no strided window left:

- a gather (`linalg.generic`, a copy): `col[n, c, kh, kw, oh, ow] = in[n, c, oh*sh + kh*dh,
  ow*sw + kw*dw]`, the input's patches laid out with the output's rows contiguous (im2col);
- a contraction (`linalg.generic`): `out[n, f, oh, ow] += w[f, c, kh, kw] * col[n, c, kh, kw,
  oh, ow]`, whose output row walks `col` with unit stride, a matmul in all but name.

Only a convolution whose output rows hold half a vector or more is rewritten
(`default_min_row`): a shorter row leaves most lanes of the contraction's vectors idle.

The gather costs one pass over `C*KH*KW*OH*OW` elements and is part of the layer's program (and
so of its time); the cut keeps it with the contraction it feeds. Both follow MLIR's semantics of
`linalg.conv_2d_nchw_fchw` exactly (the same sum in the same order of reduction loops), and the
import's check compares the model's output through them with the model's own.
"""

from __future__ import annotations

from mlir import ir

CONV = "linalg.conv_2d_nchw_fchw"
STRIDED_FORMS = ("im2col", "direct")  # how a strided convolution is cut; default first
FLOATS = ("f16", "bf16", "f32", "f64")


def _ints(op, name: str) -> list[int]:
    if name not in op.attributes:
        return [1, 1]
    return [int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])]


def _type(shape, element) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>"


def _helper(in_t, w_t, out_t, strides, dilations) -> str:
    """A function computing the convolution as a gather and a contraction (module text)."""
    n, c, _, _ = in_t.shape
    f, _, kh, kw = w_t.shape
    _, _, oh, ow = out_t.shape
    element = str(in_t.element_type)
    (sh, sw), (dh, dw) = strides, dilations
    col = _type([n, c, kh, kw, oh, ow], element)
    gather_in = (
        f"affine_map<(n, c, kh, kw, oh, ow) -> "
        f"(n, c, oh * {sh} + kh * {dh}, ow * {sw} + kw * {dw})>"
    )
    identity6 = "affine_map<(n, c, kh, kw, oh, ow) -> (n, c, kh, kw, oh, ow)>"
    loops = "(n, f, oh, ow, c, kh, kw)"
    par = '"parallel"'
    red = '"reduction"'
    return f"""
func.func @conv(%in: {in_t}, %w: {w_t}, %init: {out_t}) -> {out_t} {{
  %e = tensor.empty() : {col}
  %col = linalg.generic {{indexing_maps = [{gather_in}, {identity6}],
      iterator_types = [{", ".join([par] * 6)}]}}
      ins(%in : {in_t}) outs(%e : {col}) {{
  ^bb0(%x: {element}, %o: {element}):
    linalg.yield %x : {element}
  }} -> {col}
  %r = linalg.generic {{indexing_maps = [
        affine_map<{loops} -> (n, c, kh, kw, oh, ow)>,
        affine_map<{loops} -> (f, c, kh, kw)>,
        affine_map<{loops} -> (n, f, oh, ow)>],
      iterator_types = [{", ".join([par] * 4 + [red] * 3)}]}}
      ins(%col, %w : {col}, {w_t}) outs(%init : {out_t}) {{
  ^bb0(%x: {element}, %y: {element}, %acc: {element}):
    %m = arith.mulf %x, %y : {element}
    %s = arith.addf %acc, %m : {element}
    linalg.yield %s : {element}
  }} -> {out_t}
  return %r : {out_t}
}}
"""


def default_min_row() -> int:
    """The narrowest output row gathered: half a vector of this machine's f32 lanes. On
    63f92bffe2fc (AVX-512, 16 lanes) ResNet-18's 3x3/2 convolutions ran 1.56-1.70 ms gathered
    against 2.97-3.30 ms direct at rows of 14 and 28, but 8.3 ms against 3.8 ms at 7: a row
    shorter than the vector leaves most lanes idle, where the direct form's 1-D convolutions
    vectorize over the filters (bench/results/history.md, "Whole models")."""
    from mlirrl_jax.measure.fingerprint import vector_lanes

    return max(1, vector_lanes() // 2)


def _strided_convolutions(module, min_row: int) -> list:
    found = []

    def visit(o):
        op = o.operation if hasattr(o, "operation") else o
        if op.name == CONV and any(s > 1 for s in _ints(op, "strides")):
            in_t = ir.RankedTensorType(op.operands[0].type)
            out_t = ir.RankedTensorType(op.operands[-1].type)
            if (
                str(in_t.element_type) in FLOATS
                and len(op.operands) == 3
                and out_t.shape[-1] >= min_row
            ):
                found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def gather_strided_convolutions(module, min_row: int) -> int:
    """Rewrite every strided float `linalg.conv_2d_nchw_fchw` of `module` (parsed, in its
    context) whose output rows hold `min_row` elements or more as a gather and a contraction,
    in place; how many were rewritten."""
    convolutions = _strided_convolutions(module, min_row)
    for conv in convolutions:
        operands = list(conv.operands)
        types = [ir.RankedTensorType(v.type) for v in operands]
        text = _helper(*types, _ints(conv, "strides"), _ints(conv, "dilations"))
        helper = ir.Module.parse(text)
        body = helper.body.operations[0].regions[0].blocks[0]
        mapping = dict(zip(body.arguments, operands, strict=True))
        with ir.InsertionPoint(conv):
            for o in list(body.operations)[:-1]:  # the return not copied
                copy = o.clone()
                for old, new in mapping.items():
                    copy.operation.replace_uses_of_with(old, new)
                mapping.update(zip(o.results, copy.results, strict=True))
        result = mapping[list(body.operations)[-1].operands[0]]
        conv.results[0].replace_all_uses_with(result)
        conv.erase()
    return len(convolutions)


def is_gather(op) -> bool:
    """A copy through an indexing map (a `linalg.generic` of one input whose body yields it),
    as `gather_strided_convolutions` writes."""
    op = op.operation if hasattr(op, "operation") else op
    if (
        op.name != "linalg.generic"
        or len(op.operands) != 2
        or "reduction" in str(op.attributes["iterator_types"])
    ):
        return False
    block = op.regions[0].blocks[0]
    ops = list(block.operations)
    return (
        len(ops) == 1
        and ops[0].operation.name == "linalg.yield"
        and ops[0].operands[0] == block.arguments[0]
    )
