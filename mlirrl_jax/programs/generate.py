"""Render Linalg benchmark programs (MLIR text) from small frozen shape specs.

Every program is one public `func.func` over statically shaped f32 tensors that returns one
tensor. Its body holds only `arith.constant`, `tensor.empty`, Linalg ops and `func.return`;
convolution and pooling inputs are already padded, and every reduction accumulates into a
filled tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlirrl_jax.programs.mlir_text import (
    NEG_INF_CONSTANT,
    ZERO,
    empty,
    filled,
    func,
    generic,
    ids,
    named,
    window_attrs,
)
from mlirrl_jax.programs.sizes import flops, footprint_bytes, operand_shapes

# the spec types it renders, re-exported: callers import specs and rendering from here
from mlirrl_jax.programs.specs import (
    CHAIN_BINARY_OPS,
    CHAIN_OPS,
    LAYERNORM_EPS,
    LAYERNORM_PARTS,
    LQCD_PATTERNS,
    NEG_INF,
    SOFTMAX_PARTS,
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
    conv_out,
)


# ----------------------------------------------------------------------------- renderers
def render_matmul(spec: MatmulSpec) -> str:
    """`linalg.matmul` into a zero-filled accumulator."""
    (a, b), c = operand_shapes(spec)
    body = [ZERO, *filled("init", "zero", c)]
    body.append(named("r", "linalg.matmul", [("A", a), ("B", b)], ("init", c)))
    return func(spec.name, [("A", a), ("B", b)], body, "r", c)


def render_batch_matmul(spec: BatchMatmulSpec) -> str:
    """`linalg.batch_matmul` into a zero-filled accumulator."""
    (a, b), c = operand_shapes(spec)
    body = [ZERO, *filled("init", "zero", c)]
    body.append(named("r", "linalg.batch_matmul", [("A", a), ("B", b)], ("init", c)))
    return func(spec.name, [("A", a), ("B", b)], body, "r", c)


def render_conv2d(spec: Conv2dSpec) -> str:
    """`linalg.conv_2d_nhwc_hwcf` or `linalg.conv_2d_nchw_fchw` into a zero-filled output."""
    (i, w), o = operand_shapes(spec)
    op = "linalg.conv_2d_nhwc_hwcf" if spec.layout == "nhwc" else "linalg.conv_2d_nchw_fchw"
    body = [ZERO, *filled("init", "zero", o)]
    attrs = window_attrs(spec.stride, spec.dilation)
    body.append(named("r", op, [("I", i), ("W", w)], ("init", o), attrs))
    return func(spec.name, [("I", i), ("W", w)], body, "r", o)


def render_depthwise(spec: DepthwiseSpec) -> str:
    """`linalg.depthwise_conv_2d_nhwc_hwc` into a zero-filled output."""
    (i, w), o = operand_shapes(spec)
    body = [ZERO, *filled("init", "zero", o)]
    attrs = window_attrs(spec.stride, spec.dilation)
    op = "linalg.depthwise_conv_2d_nhwc_hwc"
    body.append(named("r", op, [("I", i), ("W", w)], ("init", o), attrs))
    return func(spec.name, [("I", i), ("W", w)], body, "r", o)


def render_pool(spec: PoolSpec) -> str:
    """NHWC or NCHW pooling; avg is a sum pool followed by a generic dividing by the window
    size."""
    (i,), o = operand_shapes(spec)
    layout = spec.layout
    win = (spec.k, spec.k)
    attrs = window_attrs(spec.stride, spec.dilation)
    # the window operand only carries the window shape: its values are never read
    body = [empty("win", win)]
    if spec.op == "max":
        body += [NEG_INF_CONSTANT, *filled("init", "ninf", o)]
        body.append(
            named("r", f"linalg.pooling_{layout}_max", [("I", i), ("win", win)], ("init", o), attrs)
        )
        return func(spec.name, [("I", i)], body, "r", o)
    body += [ZERO, *filled("init", "zero", o)]
    res = "r" if spec.op == "sum" else "s"
    body.append(
        named(res, f"linalg.pooling_{layout}_sum", [("I", i), ("win", win)], ("init", o), attrs)
    )
    if spec.op == "avg":
        dims, ident = ids(4)
        body.append(f"%count = arith.constant {float(spec.k * spec.k)!r} : f32")
        body.append(empty("avg_e", o))
        body += generic(
            "r",
            dims,
            ["parallel"] * 4,
            [("s", o, ident)],
            ("avg_e", o, ident),
            ["%q = arith.divf %in0, %count : f32"],
            "q",
        )
    return func(spec.name, [("I", i)], body, "r", o)


_GELU_BODY = [
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    "%c0 = arith.constant 0.5 : f32",
    "%c1 = arith.constant 1.0 : f32",
    "%c2 = arith.constant 0.797884583 : f32",
    "%c3 = arith.constant 0.044715 : f32",
    "%x2 = arith.mulf %in0, %in0 : f32",
    "%x3 = arith.mulf %x2, %in0 : f32",
    "%t0 = arith.mulf %c3, %x3 : f32",
    "%t1 = arith.addf %in0, %t0 : f32",
    "%t2 = arith.mulf %c2, %t1 : f32",
    "%t3 = math.tanh %t2 : f32",
    "%t4 = arith.addf %c1, %t3 : f32",
    "%t5 = arith.mulf %in0, %t4 : f32",
    "%y = arith.mulf %c0, %t5 : f32",
]


# each element-wise op's body, yielding %y (relu reads the function's %zero)
_ELEMENTWISE_BODIES = {
    "add": ["%y = arith.addf %in0, %in1 : f32"],
    "mul": ["%y = arith.mulf %in0, %in1 : f32"],
    "relu": ["%y = arith.maximumf %in0, %zero : f32"],
    "gelu": _GELU_BODY,
}


def render_elementwise(spec: ElementwiseSpec) -> str:
    """An all-parallel `linalg.generic` writing into a fresh tensor."""
    args, o = operand_shapes(spec)
    names = ["A", "B"] if spec.op == "add" else ["X"]
    dims, ident = ids(len(o))
    body = [ZERO] if spec.op == "relu" else []
    body.append(empty("out", o))
    op_body = _ELEMENTWISE_BODIES[spec.op]
    ins = [(n, s, ident) for n, s in zip(names, args, strict=True)]
    body += generic("r", dims, ["parallel"] * len(o), ins, ("out", o, ident), op_body, "y")
    return func(spec.name, list(zip(names, args, strict=True)), body, "r", o)


def render_elementwise_chain(spec: ElementwiseChainSpec) -> str:
    """One all-parallel `linalg.generic` per op, each into a fresh tensor and reading the one
    before; add and mul also read the next of the inputs B1, B2."""
    args, o = operand_shapes(spec)
    names = ["X", *(f"B{i}" for i in range(1, len(args)))]
    dims, ident = ids(len(o))
    body = [ZERO] if "relu" in spec.ops else []
    previous, second_inputs = "X", iter(names[1:])
    for i, op in enumerate(spec.ops):
        ins = [(previous, o, ident)]
        if op in CHAIN_BINARY_OPS:
            ins.append((next(second_inputs), o, ident))
        step = f"step{i}"
        body.append(empty(f"{step}_e", o))
        out = (f"{step}_e", o, ident)
        body += generic(step, dims, ["parallel"] * len(o), ins, out, _ELEMENTWISE_BODIES[op], "y")
        previous = step
    return func(spec.name, list(zip(names, args, strict=True)), body, previous, o)


_ROW, _ALL = "d0", "d0, d1"
_PAR2, _RED2 = ["parallel", "parallel"], ["parallel", "reduction"]


# The softmax parts below share one frame (a filled result, then a generic over rows and
# columns), each with its own body: written out, as the MLIR they render.
def _softmax_max(x: str, rc: Shape) -> list[str]:
    return [
        *filled("mx0", "ninf", rc[:1]),
        *generic(
            "mx",
            ["d0", "d1"],
            _RED2,
            [(x, rc, _ALL)],
            ("mx0", rc[:1], _ROW),
            ["%m = arith.maximumf %in0, %acc : f32"],
            "m",
        ),
    ]


def _softmax_exp(x: str, mx: str, rc: Shape) -> list[str]:
    return [
        empty("ex_e", rc),
        *generic(
            "ex",
            ["d0", "d1"],
            _PAR2,
            [(x, rc, _ALL), (mx, rc[:1], _ROW)],
            ("ex_e", rc, _ALL),
            ["%dx = arith.subf %in0, %in1 : f32", "%ev = math.exp %dx : f32"],
            "ev",
        ),
    ]


def _softmax_sum(ex: str, rc: Shape) -> list[str]:
    return [
        *filled("sm0", "zero", rc[:1]),
        *generic(
            "sm",
            ["d0", "d1"],
            _RED2,
            [(ex, rc, _ALL)],
            ("sm0", rc[:1], _ROW),
            ["%sv = arith.addf %in0, %acc : f32"],
            "sv",
        ),
    ]


def _softmax_div(ex: str, sm: str, rc: Shape) -> list[str]:
    return [
        empty("dv_e", rc),
        *generic(
            "dv",
            ["d0", "d1"],
            _PAR2,
            [(ex, rc, _ALL), (sm, rc[:1], _ROW)],
            ("dv_e", rc, _ALL),
            ["%q = arith.divf %in0, %in1 : f32"],
            "q",
        ),
    ]


def render_softmax(spec: SoftmaxSpec) -> str:
    """One piece of a row softmax (max, exp(x - max), sum, divide) or the 4-generic chain."""
    args, o = operand_shapes(spec)
    rc = (spec.rows, spec.cols)
    part = spec.part
    if part == "max":
        body, res, names = [NEG_INF_CONSTANT, *_softmax_max("X", rc)], "mx", ["X"]
    elif part == "exp":
        body, res, names = _softmax_exp("X", "M", rc), "ex", ["X", "M"]
    elif part == "sum":
        body, res, names = [ZERO, *_softmax_sum("E", rc)], "sm", ["E"]
    elif part == "div":
        body, res, names = _softmax_div("E", "S", rc), "dv", ["E", "S"]
    else:
        body = [NEG_INF_CONSTANT, ZERO, *_softmax_max("X", rc), *_softmax_exp("X", "mx", rc)]
        body += [*_softmax_sum("ex", rc), *_softmax_div("ex", "sm", rc)]
        res, names = "dv", ["X"]
    return func(spec.name, list(zip(names, args, strict=True)), body, res, o)


def _row_mean(
    res: str, rc: Shape, ins: Sequence[tuple[str, Shape, str]], body: Sequence[str]
) -> list[str]:
    """The mean over each row of (rows, cols) of the value `body` yields as %acc_next from
    `ins`: a sum into a zero-filled row vector, then a divide by the function's %cols."""
    rows = rc[:1]
    return [
        *filled(f"{res}_sum0", "zero", rows),
        *generic(
            f"{res}_sum", ["d0", "d1"], _RED2, ins, (f"{res}_sum0", rows, _ROW), body, "acc_next"
        ),
        empty(f"{res}_e", rows),
        *generic(
            res,
            ["d0"],
            ["parallel"],
            [(f"{res}_sum", rows, _ROW)],
            (f"{res}_e", rows, _ROW),
            ["%q = arith.divf %in0, %cols : f32"],
            "q",
        ),
    ]


def _layernorm_mean(x: str, rc: Shape) -> list[str]:
    return _row_mean("mean", rc, [(x, rc, _ALL)], ["%acc_next = arith.addf %in0, %acc : f32"])


def _layernorm_var(x: str, mean: str, rc: Shape) -> list[str]:
    return _row_mean(
        "var",
        rc,
        [(x, rc, _ALL), (mean, rc[:1], _ROW)],
        [
            "%dx = arith.subf %in0, %in1 : f32",
            "%sq = arith.mulf %dx, %dx : f32",
            "%acc_next = arith.addf %sq, %acc : f32",
        ],
    )


def _layernorm_norm(x: str, mean: str, var: str, rc: Shape) -> list[str]:
    return [
        empty("norm_e", rc),
        *generic(
            "norm",
            ["d0", "d1"],
            _PAR2,
            [(x, rc, _ALL), (mean, rc[:1], _ROW), (var, rc[:1], _ROW)],
            ("norm_e", rc, _ALL),
            [
                "%dx = arith.subf %in0, %in1 : f32",
                "%ve = arith.addf %in2, %eps : f32",
                "%rs = math.rsqrt %ve : f32",
                "%ny = arith.mulf %dx, %rs : f32",
            ],
            "ny",
        ),
    ]


def render_layernorm(spec: LayerNormSpec) -> str:
    """One piece of a row layer norm (mean, variance given the mean, (x - mean) / sqrt(var +
    eps)) or the chain of all three; each mean is a sum and then a divide, as torch-mlir
    lowers them."""
    args, o = operand_shapes(spec)
    rc = (spec.rows, spec.cols)
    cols = f"%cols = arith.constant {float(spec.cols)!r} : f32"
    eps = f"%eps = arith.constant {LAYERNORM_EPS} : f32"
    part = spec.part
    if part == "mean":
        body, res, names = [ZERO, cols, *_layernorm_mean("X", rc)], "mean", ["X"]
    elif part == "var":
        body, res, names = [ZERO, cols, *_layernorm_var("X", "M", rc)], "var", ["X", "M"]
    elif part == "norm":
        body, res, names = [eps, *_layernorm_norm("X", "M", "V", rc)], "norm", ["X", "M", "V"]
    else:
        body = [ZERO, cols, eps, *_layernorm_mean("X", rc), *_layernorm_var("X", "mean", rc)]
        body += _layernorm_norm("X", "mean", "var", rc)
        res, names = "norm", ["X"]
    return func(spec.name, list(zip(names, args, strict=True)), body, res, o)


def _bias_relu(res: str, x: str, bias: str, o: Shape) -> list[str]:
    """relu(x + bias) with the bias broadcast along the last dimension."""
    dims, ident = ids(len(o))
    return [
        empty(f"{res}_e", o),
        *generic(
            res,
            dims,
            ["parallel"] * len(o),
            [(x, o, ident), (bias, o[-1:], dims[-1])],
            (f"{res}_e", o, ident),
            ["%b = arith.addf %in0, %in1 : f32", "%y = arith.maximumf %b, %zero : f32"],
            "y",
        ),
    ]


def render_matmul_bias_relu(spec: MatmulBiasReluSpec) -> str:
    """`linalg.matmul`, then a generic adding a row-broadcast bias and applying relu."""
    (a, b, bias), c = operand_shapes(spec)
    body = [ZERO, *filled("init", "zero", c)]
    body.append(named("mm", "linalg.matmul", [("A", a), ("B", b)], ("init", c)))
    body += _bias_relu("r", "mm", "bias", c)
    return func(spec.name, [("A", a), ("B", b), ("bias", bias)], body, "r", c)


def render_conv_bias_relu(spec: ConvBiasReluSpec) -> str:
    """`linalg.conv_2d_nhwc_hwcf`, then a generic adding a per-channel bias and applying relu."""
    (i, w, bias), o = operand_shapes(spec)
    body = [ZERO, *filled("init", "zero", o)]
    attrs = window_attrs(spec.stride, spec.dilation)
    body.append(named("cv", "linalg.conv_2d_nhwc_hwcf", [("I", i), ("W", w)], ("init", o), attrs))
    body += _bias_relu("r", "cv", "bias", o)
    return func(spec.name, [("I", i), ("W", w), ("bias", bias)], body, "r", o)


def render_contraction(spec: ContractionSpec) -> str:
    """A multiply-accumulate `linalg.generic` over the pattern's loops into a zero-filled output."""
    pat = LQCD_PATTERNS[spec.pattern]
    (lhs, rhs), o = operand_shapes(spec)
    loops = spec.loops
    iters = ["parallel" if i in pat.out else "reduction" for i in loops]
    body = [ZERO, *filled("init", "zero", o)]
    body += generic(
        "r",
        loops,
        iters,
        [("U", lhs, ", ".join(pat.lhs)), ("V", rhs, ", ".join(pat.rhs))],
        ("init", o, ", ".join(pat.out)),
        ["%p = arith.mulf %in0, %in1 : f32", "%y = arith.addf %acc, %p : f32"],
        "y",
    )
    return func(spec.name, [("U", lhs), ("V", rhs)], body, "r", o)


_RENDERERS = {
    MatmulSpec: render_matmul,
    BatchMatmulSpec: render_batch_matmul,
    Conv2dSpec: render_conv2d,
    DepthwiseSpec: render_depthwise,
    PoolSpec: render_pool,
    ElementwiseSpec: render_elementwise,
    SoftmaxSpec: render_softmax,
    LayerNormSpec: render_layernorm,
    ElementwiseChainSpec: render_elementwise_chain,
    MatmulBiasReluSpec: render_matmul_bias_relu,
    ConvBiasReluSpec: render_conv_bias_relu,
    ContractionSpec: render_contraction,
}


def render(spec: Spec) -> str:
    """MLIR text of the program described by `spec`."""
    fn = _RENDERERS.get(type(spec))
    if fn is None:
        raise TypeError(f"not a program spec: {spec!r}")
    return fn(spec)


__all__ = [
    "CHAIN_BINARY_OPS",
    "CHAIN_OPS",
    "LAYERNORM_EPS",
    "LAYERNORM_PARTS",
    "BatchMatmulSpec",
    "ContractionSpec",
    "Conv2dSpec",
    "ConvBiasReluSpec",
    "DepthwiseSpec",
    "ElementwiseChainSpec",
    "ElementwiseSpec",
    "LQCD_PATTERNS",
    "LayerNormSpec",
    "MatmulBiasReluSpec",
    "MatmulSpec",
    "NEG_INF",
    "PoolSpec",
    "SOFTMAX_PARTS",
    "Shape",
    "SoftmaxSpec",
    "Spec",
    "conv_out",
    "flops",
    "footprint_bytes",
    "operand_shapes",
    "render",
    "render_batch_matmul",
    "render_contraction",
    "render_conv2d",
    "render_conv_bias_relu",
    "render_depthwise",
    "render_elementwise",
    "render_elementwise_chain",
    "render_layernorm",
    "render_matmul",
    "render_matmul_bias_relu",
    "render_pool",
    "render_softmax",
]
