"""The operand shapes, FLOP counts and memory footprints of the benchmark programs' specs."""

from __future__ import annotations

import math

# the spec types this module builds (each builder of specs imports the same list)
from mlirrl_jax.programs.specs import (
    CHAIN_BINARY_OPS,
    LQCD_PATTERNS,
    BatchMatmulSpec,
    ContractionSpec,
    Conv2dSpec,
    ConvBiasReluSpec,
    DepthwiseSpec,
    ElementwiseChainSpec,
    ElementwiseSpec,
    LayerNormSpec,
    MatmulBiasReluSpec,
    MatmulSpec,
    PoolSpec,
    Shape,
    SoftmaxSpec,
    Spec,
)

_F32_BYTES = 4


def _conv_macs(n: int, oh: int, ow: int, f: int, k: int, c: int) -> int:
    return n * oh * ow * f * k * k * c


def operand_shapes(spec: Spec) -> tuple[list[Shape], Shape]:
    """Argument shapes and result shape of the rendered function."""
    if isinstance(spec, MatmulSpec):
        return [(spec.m, spec.k), (spec.k, spec.n)], (spec.m, spec.n)
    if isinstance(spec, MatmulBiasReluSpec):
        return [(spec.m, spec.k), (spec.k, spec.n), (spec.n,)], (spec.m, spec.n)
    if isinstance(spec, BatchMatmulSpec):
        return [(spec.b, spec.m, spec.k), (spec.b, spec.k, spec.n)], (spec.b, spec.m, spec.n)
    if isinstance(spec, Conv2dSpec) and spec.layout == "nchw":
        n, c, f, k = spec.n, spec.c, spec.f, spec.k
        return [(n, c, spec.h, spec.w), (f, c, k, k)], (n, f, *spec.out_hw)
    if isinstance(spec, Conv2dSpec):
        n, c, f, k = spec.n, spec.c, spec.f, spec.k
        return [(n, spec.h, spec.w, c), (k, k, c, f)], (n, *spec.out_hw, f)
    if isinstance(spec, ConvBiasReluSpec):
        n, c, f, k = spec.n, spec.c, spec.f, spec.k
        return [(n, spec.h, spec.w, c), (k, k, c, f), (f,)], (n, *spec.out_hw, f)
    if isinstance(spec, DepthwiseSpec):
        n, c, k = spec.n, spec.c, spec.k
        return [(n, spec.h, spec.w, c), (k, k, c)], (n, *spec.out_hw, c)
    if isinstance(spec, PoolSpec) and spec.layout == "nchw":
        return [(spec.n, spec.c, spec.h, spec.w)], (spec.n, spec.c, *spec.out_hw)
    if isinstance(spec, PoolSpec):
        return [(spec.n, spec.h, spec.w, spec.c)], (spec.n, *spec.out_hw, spec.c)
    if isinstance(spec, ElementwiseSpec):
        return [spec.shape] * (2 if spec.op == "add" else 1), spec.shape
    if isinstance(spec, SoftmaxSpec):
        rc, r = (spec.rows, spec.cols), (spec.rows,)
        args = {"max": [rc], "exp": [rc, r], "sum": [rc], "div": [rc, r], "full": [rc]}[spec.part]
        return args, r if spec.part in ("max", "sum") else rc
    if isinstance(spec, LayerNormSpec):
        rc, r = (spec.rows, spec.cols), (spec.rows,)
        args = {"mean": [rc], "var": [rc, r], "norm": [rc, r, r], "full": [rc]}[spec.part]
        return args, r if spec.part in ("mean", "var") else rc
    if isinstance(spec, ElementwiseChainSpec):
        inputs = 1 + sum(op in CHAIN_BINARY_OPS for op in spec.ops)
        return [spec.shape] * inputs, spec.shape
    if isinstance(spec, ContractionSpec):
        pat, ext = LQCD_PATTERNS[spec.pattern], spec.extents
        lhs, rhs, out = (tuple(ext[i] for i in idx) for idx in (pat.lhs, pat.rhs, pat.out))
        return [lhs, rhs], out
    raise TypeError(f"not a program spec: {spec!r}")


# per element; gelu's body: 8 mul/add ops plus tanh, counted as one
_ELEMENTWISE_FLOPS = {"add": 1, "mul": 1, "relu": 1, "gelu": 9}


def flops(spec: Spec) -> int:
    """Floating-point operations of one run (2 per multiply-add, 1 per other scalar op)."""
    if isinstance(spec, MatmulSpec):
        return 2 * spec.m * spec.n * spec.k
    if isinstance(spec, BatchMatmulSpec):
        return 2 * spec.b * spec.m * spec.n * spec.k
    if isinstance(spec, Conv2dSpec):
        return 2 * _conv_macs(spec.n, *spec.out_hw, spec.f, spec.k, spec.c)
    if isinstance(spec, ConvBiasReluSpec):
        oh, ow = spec.out_hw
        return (
            2 * _conv_macs(spec.n, oh, ow, spec.f, spec.k, spec.c) + 2 * spec.n * oh * ow * spec.f
        )
    if isinstance(spec, DepthwiseSpec):
        return 2 * _conv_macs(spec.n, *spec.out_hw, spec.c, spec.k, 1)
    if isinstance(spec, PoolSpec):
        outs = math.prod(operand_shapes(spec)[1])
        return outs * spec.k * spec.k + (outs if spec.op == "avg" else 0)
    if isinstance(spec, ElementwiseSpec):
        return math.prod(spec.shape) * _ELEMENTWISE_FLOPS[spec.op]
    if isinstance(spec, SoftmaxSpec):
        per = {"max": 1, "exp": 2, "sum": 1, "div": 1, "full": 5}[spec.part]
        return spec.rows * spec.cols * per
    if isinstance(spec, LayerNormSpec):
        # per element: mean add; variance sub, mul, add; normalize sub, add, rsqrt, mul; and
        # one divide per row for each mean
        per, per_row = {"mean": (1, 1), "var": (3, 1), "norm": (4, 0), "full": (8, 2)}[spec.part]
        return spec.rows * (spec.cols * per + per_row)
    if isinstance(spec, ElementwiseChainSpec):
        return math.prod(spec.shape) * sum(_ELEMENTWISE_FLOPS[op] for op in spec.ops)
    if isinstance(spec, MatmulBiasReluSpec):
        return 2 * spec.m * spec.n * spec.k + 2 * spec.m * spec.n
    if isinstance(spec, ContractionSpec):
        return 2 * math.prod(spec.extents[i] for i in spec.loops)
    raise TypeError(f"not a program spec: {spec!r}")


def footprint_bytes(spec: Spec) -> int:
    """Bytes of the function's arguments and result (intermediates not counted)."""
    args, res = operand_shapes(spec)
    return _F32_BYTES * sum(math.prod(s) for s in [*args, res])
