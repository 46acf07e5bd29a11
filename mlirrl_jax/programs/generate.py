"""Render Linalg benchmark programs (MLIR text) from small frozen shape specs.

Every program is one public `func.func` over statically shaped f32 tensors that returns one
tensor. Its body holds only `arith.constant`, `tensor.empty`, Linalg ops and `func.return`;
convolution and pooling inputs are already padded, and every reduction accumulates into a
filled tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mlirrl_jax.errors import ConfigError

Shape = tuple[int, ...]

# -inf as the f32 bit pattern, so the text round-trips exactly.
NEG_INF = "0xFF800000"
_F32_BYTES = 4


def conv_out(size: int, kernel: int, stride: int, dilation: int) -> int:
    """Output extent of a valid (unpadded) strided, dilated window over `size` elements."""
    return (size - dilation * (kernel - 1) - 1) // stride + 1


def _positive(spec: object, *values: int) -> None:
    if any(v < 1 for v in values):
        raise ConfigError(f"{spec!r}: every extent must be >= 1")


def _windowed(spec: object, h: int, w: int, k: int, s: int, d: int) -> tuple[int, int]:
    oh, ow = conv_out(h, k, s, d), conv_out(w, k, s, d)
    if oh < 1 or ow < 1:
        raise ConfigError(f"{spec!r}: the {k}x{k} window (dilation {d}) does not fit in {h}x{w}")
    return oh, ow


# ----------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class MatmulSpec:
    """C[m, n] = A[m, k] @ B[k, n]."""

    m: int
    n: int
    k: int

    def __post_init__(self) -> None:
        _positive(self, self.m, self.n, self.k)

    @property
    def kind(self) -> str:
        return "matmul"

    @property
    def name(self) -> str:
        return f"matmul_m{self.m}_n{self.n}_k{self.k}"


@dataclass(frozen=True)
class BatchMatmulSpec:
    """C[b, m, n] = A[b, m, k] @ B[b, k, n]."""

    b: int
    m: int
    n: int
    k: int

    def __post_init__(self) -> None:
        _positive(self, self.b, self.m, self.n, self.k)

    @property
    def kind(self) -> str:
        return "batch_matmul"

    @property
    def name(self) -> str:
        return f"batch_matmul_b{self.b}_m{self.m}_n{self.n}_k{self.k}"


@dataclass(frozen=True)
class Conv2dSpec:
    """2-D convolution of an already padded input (h, w) with a k x k filter, c -> f channels."""

    layout: str  # "nhwc" (linalg.conv_2d_nhwc_hwcf) or "nchw" (linalg.conv_2d_nchw_fchw)
    n: int
    h: int
    w: int
    c: int
    f: int
    k: int
    stride: int = 1
    dilation: int = 1

    def __post_init__(self) -> None:
        if self.layout not in ("nhwc", "nchw"):
            raise ConfigError(f"{self!r}: layout must be 'nhwc' or 'nchw'")
        _positive(self, self.n, self.h, self.w, self.c, self.f, self.k, self.stride, self.dilation)
        _windowed(self, self.h, self.w, self.k, self.stride, self.dilation)

    @property
    def kind(self) -> str:
        return f"conv2d_{self.layout}"

    @property
    def out_hw(self) -> tuple[int, int]:
        return _windowed(self, self.h, self.w, self.k, self.stride, self.dilation)

    @property
    def name(self) -> str:
        return (
            f"conv2d_{self.layout}_n{self.n}_h{self.h}_w{self.w}_c{self.c}_f{self.f}"
            f"_k{self.k}_s{self.stride}_d{self.dilation}"
        )


@dataclass(frozen=True)
class DepthwiseSpec:
    """Depthwise NHWC convolution (one k x k filter per channel) of an already padded input."""

    n: int
    h: int
    w: int
    c: int
    k: int
    stride: int = 1
    dilation: int = 1

    def __post_init__(self) -> None:
        _positive(self, self.n, self.h, self.w, self.c, self.k, self.stride, self.dilation)
        _windowed(self, self.h, self.w, self.k, self.stride, self.dilation)

    @property
    def kind(self) -> str:
        return "depthwise"

    @property
    def out_hw(self) -> tuple[int, int]:
        return _windowed(self, self.h, self.w, self.k, self.stride, self.dilation)

    @property
    def name(self) -> str:
        return (
            f"depthwise_n{self.n}_h{self.h}_w{self.w}_c{self.c}"
            f"_k{self.k}_s{self.stride}_d{self.dilation}"
        )


@dataclass(frozen=True)
class PoolSpec:
    """Max / sum / average pooling with a k x k window over an already padded input, NHWC
    (the default) or NCHW (`layout`; its programs' names end in `_nchw`)."""

    op: str  # "max", "sum" or "avg"
    n: int
    h: int
    w: int
    c: int
    k: int
    stride: int = 1
    dilation: int = 1
    layout: str = "nhwc"

    def __post_init__(self) -> None:
        if self.op not in ("max", "sum", "avg"):
            raise ConfigError(f"{self!r}: op must be 'max', 'sum' or 'avg'")
        if self.layout not in ("nhwc", "nchw"):
            raise ConfigError(f"{self!r}: layout must be 'nhwc' or 'nchw'")
        _positive(self, self.n, self.h, self.w, self.c, self.k, self.stride, self.dilation)
        _windowed(self, self.h, self.w, self.k, self.stride, self.dilation)

    @property
    def kind(self) -> str:
        return f"pool_{self.op}"

    @property
    def out_hw(self) -> tuple[int, int]:
        return _windowed(self, self.h, self.w, self.k, self.stride, self.dilation)

    @property
    def name(self) -> str:
        return (
            f"pool_{self.op}_n{self.n}_h{self.h}_w{self.w}_c{self.c}"
            f"_k{self.k}_s{self.stride}_d{self.dilation}"
            + ("_nchw" if self.layout == "nchw" else "")
        )


@dataclass(frozen=True)
class ElementwiseSpec:
    """An element-wise `linalg.generic`: add (two inputs), relu or gelu (tanh approximation)."""

    op: str  # "add", "relu" or "gelu"
    shape: Shape

    def __post_init__(self) -> None:
        if self.op not in ("add", "relu", "gelu"):
            raise ConfigError(f"{self!r}: op must be 'add', 'relu' or 'gelu'")
        if not self.shape:
            raise ConfigError(f"{self!r}: shape must have at least one dimension")
        _positive(self, *self.shape)

    @property
    def kind(self) -> str:
        return self.op

    @property
    def name(self) -> str:
        return f"{self.op}_{'x'.join(map(str, self.shape))}"


SOFTMAX_PARTS = ("max", "exp", "sum", "div", "full")


@dataclass(frozen=True)
class SoftmaxSpec:
    """Softmax over the last dim of (rows, cols): one piece (max, exp, sum, div) or the chain."""

    part: str  # one of SOFTMAX_PARTS
    rows: int
    cols: int

    def __post_init__(self) -> None:
        if self.part not in SOFTMAX_PARTS:
            raise ConfigError(f"{self!r}: part must be one of {SOFTMAX_PARTS}")
        _positive(self, self.rows, self.cols)

    @property
    def kind(self) -> str:
        return "softmax" if self.part == "full" else f"softmax_{self.part}"

    @property
    def name(self) -> str:
        return f"{self.kind}_r{self.rows}_c{self.cols}"


@dataclass(frozen=True)
class MatmulBiasReluSpec:
    """relu(A[m, k] @ B[k, n] + bias[n]): a matmul followed by a fusable generic."""

    m: int
    n: int
    k: int

    def __post_init__(self) -> None:
        _positive(self, self.m, self.n, self.k)

    @property
    def kind(self) -> str:
        return "matmul_bias_relu"

    @property
    def name(self) -> str:
        return f"matmul_bias_relu_m{self.m}_n{self.n}_k{self.k}"


@dataclass(frozen=True)
class ConvBiasReluSpec:
    """relu(conv_2d_nhwc_hwcf(I, W) + bias[f]) over an already padded input."""

    n: int
    h: int
    w: int
    c: int
    f: int
    k: int
    stride: int = 1
    dilation: int = 1

    def __post_init__(self) -> None:
        _positive(self, self.n, self.h, self.w, self.c, self.f, self.k, self.stride, self.dilation)
        _windowed(self, self.h, self.w, self.k, self.stride, self.dilation)

    @property
    def kind(self) -> str:
        return "conv_bias_relu"

    @property
    def out_hw(self) -> tuple[int, int]:
        return _windowed(self, self.h, self.w, self.k, self.stride, self.dilation)

    @property
    def name(self) -> str:
        return (
            f"conv_bias_relu_n{self.n}_h{self.h}_w{self.w}_c{self.c}_f{self.f}"
            f"_k{self.k}_s{self.stride}_d{self.dilation}"
        )


@dataclass(frozen=True)
class _Pattern:
    out: str
    lhs: str
    rhs: str
    lattice: str  # the index letters whose extents the spec gives, in order
    doc: str


# Index letters: a, b, c colour (3); s, r, q spin (4); m direction mu (4); x, y, z, t lattice.
_FIXED_EXTENTS = {"a": 3, "b": 3, "c": 3, "s": 4, "r": 4, "q": 4, "m": 4}

LQCD_PATTERNS: dict[str, _Pattern] = {
    "su3_mul": _Pattern(
        "abxy", "acxym", "cbxym", "xy", "C[a,b,x,y] += U[a,c,x,y,mu] V[c,b,x,y,mu]"
    ),
    "su3_mul_4d": _Pattern(
        "xyztab", "xyztmac", "xyztmcb", "xyzt", "staple sum over mu of SU(3) link products"
    ),
    "dslash_hop": _Pattern(
        "xyztsa", "mxyztab", "mxyztsb", "xyzt", "hopping term: sum over mu of U_mu(x) psi(x)"
    ),
    "gamma_apply": _Pattern(
        "xyzsa", "msr", "mxyzra", "xyz", "spin matrices gamma_mu applied to a 3-D spinor field"
    ),
    "meson_2pt": _Pattern("tsr", "xytsa", "xytra", "xyt", "two-point function summed over space"),
    "spin_color_trace": _Pattern(
        "xyzt", "xyztsra", "xyztrsa", "xyzt", "site-local spin-colour trace of two propagators"
    ),
    "prop_mul": _Pattern(
        "xysrab", "xysqac", "xyqrcb", "xy", "spin-colour matrix product of two propagators"
    ),
}


@dataclass(frozen=True)
class ContractionSpec:
    """A lattice-QCD style tensor contraction as one `linalg.generic` (5-8 loops)."""

    pattern: str  # a key of LQCD_PATTERNS
    lattice: Shape  # extents of the pattern's lattice indices, in order

    def __post_init__(self) -> None:
        pat = LQCD_PATTERNS.get(self.pattern)
        if pat is None:
            raise ConfigError(f"{self!r}: pattern must be one of {sorted(LQCD_PATTERNS)}")
        if len(self.lattice) != len(pat.lattice):
            raise ConfigError(f"{self!r}: pattern {self.pattern} needs {len(pat.lattice)} extents")
        _positive(self, *self.lattice)

    @property
    def kind(self) -> str:
        return "contraction"

    @property
    def name(self) -> str:
        return f"lqcd_{self.pattern}_l{'x'.join(map(str, self.lattice))}"

    @property
    def extents(self) -> dict[str, int]:
        pat = LQCD_PATTERNS[self.pattern]
        return {**_FIXED_EXTENTS, **dict(zip(pat.lattice, self.lattice, strict=True))}

    @property
    def loops(self) -> tuple[str, ...]:
        """Loop order: output (parallel) indices, then reduction indices by first use."""
        pat = LQCD_PATTERNS[self.pattern]
        red = [i for i in dict.fromkeys(pat.lhs + pat.rhs) if i not in pat.out]
        return tuple(pat.out) + tuple(red)


Spec = (
    MatmulSpec
    | BatchMatmulSpec
    | Conv2dSpec
    | DepthwiseSpec
    | PoolSpec
    | ElementwiseSpec
    | SoftmaxSpec
    | MatmulBiasReluSpec
    | ConvBiasReluSpec
    | ContractionSpec
)


# ----------------------------------------------------------------------------- arithmetic
def _conv_macs(n: int, oh: int, ow: int, f: int, k: int, c: int) -> int:
    return n * oh * ow * f * k * k * c


def _operand_shapes(spec: Spec) -> tuple[list[Shape], Shape]:
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
    if isinstance(spec, ContractionSpec):
        pat, ext = LQCD_PATTERNS[spec.pattern], spec.extents
        lhs, rhs, out = (tuple(ext[i] for i in idx) for idx in (pat.lhs, pat.rhs, pat.out))
        return [lhs, rhs], out
    raise TypeError(f"not a program spec: {spec!r}")


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
        outs = math.prod(_operand_shapes(spec)[1])
        return outs * spec.k * spec.k + (outs if spec.op == "avg" else 0)
    if isinstance(spec, ElementwiseSpec):
        # gelu body: 8 mul/add ops plus tanh, counted as one
        return math.prod(spec.shape) * {"add": 1, "relu": 1, "gelu": 9}[spec.op]
    if isinstance(spec, SoftmaxSpec):
        per = {"max": 1, "exp": 2, "sum": 1, "div": 1, "full": 5}[spec.part]
        return spec.rows * spec.cols * per
    if isinstance(spec, MatmulBiasReluSpec):
        return 2 * spec.m * spec.n * spec.k + 2 * spec.m * spec.n
    if isinstance(spec, ContractionSpec):
        return 2 * math.prod(spec.extents[i] for i in spec.loops)
    raise TypeError(f"not a program spec: {spec!r}")


def footprint_bytes(spec: Spec) -> int:
    """Bytes of the function's arguments and result (intermediates not counted)."""
    args, res = _operand_shapes(spec)
    return _F32_BYTES * sum(math.prod(s) for s in [*args, res])


# ----------------------------------------------------------------------------- text helpers
def _ty(shape: Sequence[int]) -> str:
    return f"tensor<{'x'.join(map(str, shape))}xf32>"


def _func(
    name: str, args: Sequence[tuple[str, Shape]], body: Sequence[str], res: str, res_shape: Shape
) -> str:
    sig = ", ".join(f"%{a}: {_ty(s)}" for a, s in args)
    lines = [f"func.func @{name}({sig}) -> {_ty(res_shape)} {{"]
    lines += [f"  {line}" for line in body]
    lines += [f"  return %{res} : {_ty(res_shape)}", "}", ""]
    return "\n".join(lines)


def _empty(res: str, shape: Shape) -> str:
    return f"%{res} = tensor.empty() : {_ty(shape)}"


def _filled(res: str, value: str, shape: Shape) -> list[str]:
    """A tensor.empty filled with the f32 scalar `%value`."""
    return [
        _empty(f"{res}_e", shape),
        f"%{res} = linalg.fill ins(%{value} : f32) outs(%{res}_e : {_ty(shape)}) -> {_ty(shape)}",
    ]


def _named(
    res: str, op: str, ins: Sequence[tuple[str, Shape]], out: tuple[str, Shape], attrs: str = ""
) -> str:
    names = ", ".join(f"%{n}" for n, _ in ins)
    types = ", ".join(_ty(s) for _, s in ins)
    attr = f" {{{attrs}}}" if attrs else ""
    return (
        f"%{res} = {op}{attr} ins({names} : {types}) "
        f"outs(%{out[0]} : {_ty(out[1])}) -> {_ty(out[1])}"
    )


def _window_attrs(stride: int, dilation: int) -> str:
    return (
        f"dilations = dense<{dilation}> : tensor<2xi64>, strides = dense<{stride}> : tensor<2xi64>"
    )


def _generic(
    res: str,
    dims: Sequence[str],
    iters: Sequence[str],
    ins: Sequence[tuple[str, Shape, str]],
    out: tuple[str, Shape, str],
    body: Sequence[str],
    result: str,
) -> list[str]:
    """A linalg.generic; each operand is (value, shape, comma-separated index expressions)."""
    d = ", ".join(dims)
    maps = ", ".join(f"affine_map<({d}) -> ({e})>" for _, _, e in [*ins, out])
    it = ", ".join(f'"{i}"' for i in iters)
    names = ", ".join(f"%{n}" for n, _, _ in ins)
    types = ", ".join(_ty(s) for _, s, _ in ins)
    bb = ", ".join([f"%in{i}: f32" for i in range(len(ins))] + ["%acc: f32"])
    return [
        f"%{res} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{it}]}}",
        f"    ins({names} : {types}) outs(%{out[0]} : {_ty(out[1])}) {{",
        f"  ^bb0({bb}):",
        *(f"    {line}" for line in body),
        f"    linalg.yield %{result} : f32",
        f"  }} -> {_ty(out[1])}",
    ]


def _ids(rank: int) -> tuple[list[str], str]:
    dims = [f"d{i}" for i in range(rank)]
    return dims, ", ".join(dims)


_ZERO = "%zero = arith.constant 0.0 : f32"
_NEG_INF = f"%ninf = arith.constant {NEG_INF} : f32"


# ----------------------------------------------------------------------------- renderers
def render_matmul(spec: MatmulSpec) -> str:
    """`linalg.matmul` into a zero-filled accumulator."""
    (a, b), c = _operand_shapes(spec)
    body = [_ZERO, *_filled("init", "zero", c)]
    body.append(_named("r", "linalg.matmul", [("A", a), ("B", b)], ("init", c)))
    return _func(spec.name, [("A", a), ("B", b)], body, "r", c)


def render_batch_matmul(spec: BatchMatmulSpec) -> str:
    """`linalg.batch_matmul` into a zero-filled accumulator."""
    (a, b), c = _operand_shapes(spec)
    body = [_ZERO, *_filled("init", "zero", c)]
    body.append(_named("r", "linalg.batch_matmul", [("A", a), ("B", b)], ("init", c)))
    return _func(spec.name, [("A", a), ("B", b)], body, "r", c)


def render_conv2d(spec: Conv2dSpec) -> str:
    """`linalg.conv_2d_nhwc_hwcf` or `linalg.conv_2d_nchw_fchw` into a zero-filled output."""
    (i, w), o = _operand_shapes(spec)
    op = "linalg.conv_2d_nhwc_hwcf" if spec.layout == "nhwc" else "linalg.conv_2d_nchw_fchw"
    body = [_ZERO, *_filled("init", "zero", o)]
    attrs = _window_attrs(spec.stride, spec.dilation)
    body.append(_named("r", op, [("I", i), ("W", w)], ("init", o), attrs))
    return _func(spec.name, [("I", i), ("W", w)], body, "r", o)


def render_depthwise(spec: DepthwiseSpec) -> str:
    """`linalg.depthwise_conv_2d_nhwc_hwc` into a zero-filled output."""
    (i, w), o = _operand_shapes(spec)
    body = [_ZERO, *_filled("init", "zero", o)]
    attrs = _window_attrs(spec.stride, spec.dilation)
    op = "linalg.depthwise_conv_2d_nhwc_hwc"
    body.append(_named("r", op, [("I", i), ("W", w)], ("init", o), attrs))
    return _func(spec.name, [("I", i), ("W", w)], body, "r", o)


def render_pool(spec: PoolSpec) -> str:
    """NHWC or NCHW pooling; avg is a sum pool followed by a generic dividing by the window
    size."""
    (i,), o = _operand_shapes(spec)
    layout = spec.layout
    win = (spec.k, spec.k)
    attrs = _window_attrs(spec.stride, spec.dilation)
    # the window operand only carries the window shape: its values are never read
    body = [_empty("win", win)]
    if spec.op == "max":
        body += [_NEG_INF, *_filled("init", "ninf", o)]
        body.append(
            _named(
                "r", f"linalg.pooling_{layout}_max", [("I", i), ("win", win)], ("init", o), attrs
            )
        )
        return _func(spec.name, [("I", i)], body, "r", o)
    body += [_ZERO, *_filled("init", "zero", o)]
    res = "r" if spec.op == "sum" else "s"
    body.append(
        _named(res, f"linalg.pooling_{layout}_sum", [("I", i), ("win", win)], ("init", o), attrs)
    )
    if spec.op == "avg":
        dims, ident = _ids(4)
        body.append(f"%count = arith.constant {float(spec.k * spec.k)!r} : f32")
        body.append(_empty("avg_e", o))
        body += _generic(
            "r",
            dims,
            ["parallel"] * 4,
            [("s", o, ident)],
            ("avg_e", o, ident),
            ["%q = arith.divf %in0, %count : f32"],
            "q",
        )
    return _func(spec.name, [("I", i)], body, "r", o)


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


def render_elementwise(spec: ElementwiseSpec) -> str:
    """An all-parallel `linalg.generic` writing into a fresh tensor."""
    args, o = _operand_shapes(spec)
    names = ["A", "B"] if spec.op == "add" else ["X"]
    dims, ident = _ids(len(o))
    body = [_ZERO] if spec.op == "relu" else []
    body.append(_empty("out", o))
    op_body = {
        "add": ["%y = arith.addf %in0, %in1 : f32"],
        "relu": ["%y = arith.maximumf %in0, %zero : f32"],
        "gelu": _GELU_BODY,
    }[spec.op]
    ins = [(n, s, ident) for n, s in zip(names, args, strict=True)]
    body += _generic("r", dims, ["parallel"] * len(o), ins, ("out", o, ident), op_body, "y")
    return _func(spec.name, list(zip(names, args, strict=True)), body, "r", o)


_ROW, _ALL = "d0", "d0, d1"
_PAR2, _RED2 = ["parallel", "parallel"], ["parallel", "reduction"]


def _softmax_max(x: str, rc: Shape) -> list[str]:
    return [
        *_filled("mx0", "ninf", rc[:1]),
        *_generic(
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
        _empty("ex_e", rc),
        *_generic(
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
        *_filled("sm0", "zero", rc[:1]),
        *_generic(
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
        _empty("dv_e", rc),
        *_generic(
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
    args, o = _operand_shapes(spec)
    rc = (spec.rows, spec.cols)
    part = spec.part
    if part == "max":
        body, res, names = [_NEG_INF, *_softmax_max("X", rc)], "mx", ["X"]
    elif part == "exp":
        body, res, names = _softmax_exp("X", "M", rc), "ex", ["X", "M"]
    elif part == "sum":
        body, res, names = [_ZERO, *_softmax_sum("E", rc)], "sm", ["E"]
    elif part == "div":
        body, res, names = _softmax_div("E", "S", rc), "dv", ["E", "S"]
    else:
        body = [_NEG_INF, _ZERO, *_softmax_max("X", rc), *_softmax_exp("X", "mx", rc)]
        body += [*_softmax_sum("ex", rc), *_softmax_div("ex", "sm", rc)]
        res, names = "dv", ["X"]
    return _func(spec.name, list(zip(names, args, strict=True)), body, res, o)


def _bias_relu(res: str, x: str, bias: str, o: Shape) -> list[str]:
    """relu(x + bias) with the bias broadcast along the last dimension."""
    dims, ident = _ids(len(o))
    return [
        _empty(f"{res}_e", o),
        *_generic(
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
    (a, b, bias), c = _operand_shapes(spec)
    body = [_ZERO, *_filled("init", "zero", c)]
    body.append(_named("mm", "linalg.matmul", [("A", a), ("B", b)], ("init", c)))
    body += _bias_relu("r", "mm", "bias", c)
    return _func(spec.name, [("A", a), ("B", b), ("bias", bias)], body, "r", c)


def render_conv_bias_relu(spec: ConvBiasReluSpec) -> str:
    """`linalg.conv_2d_nhwc_hwcf`, then a generic adding a per-channel bias and applying relu."""
    (i, w, bias), o = _operand_shapes(spec)
    body = [_ZERO, *_filled("init", "zero", o)]
    attrs = _window_attrs(spec.stride, spec.dilation)
    body.append(_named("cv", "linalg.conv_2d_nhwc_hwcf", [("I", i), ("W", w)], ("init", o), attrs))
    body += _bias_relu("r", "cv", "bias", o)
    return _func(spec.name, [("I", i), ("W", w), ("bias", bias)], body, "r", o)


def render_contraction(spec: ContractionSpec) -> str:
    """A multiply-accumulate `linalg.generic` over the pattern's loops into a zero-filled output."""
    pat = LQCD_PATTERNS[spec.pattern]
    (lhs, rhs), o = _operand_shapes(spec)
    loops = spec.loops
    iters = ["parallel" if i in pat.out else "reduction" for i in loops]
    body = [_ZERO, *_filled("init", "zero", o)]
    body += _generic(
        "r",
        loops,
        iters,
        [("U", lhs, ", ".join(pat.lhs)), ("V", rhs, ", ".join(pat.rhs))],
        ("init", o, ", ".join(pat.out)),
        ["%p = arith.mulf %in0, %in1 : f32", "%y = arith.addf %acc, %p : f32"],
        "y",
    )
    return _func(spec.name, [("U", lhs), ("V", rhs)], body, "r", o)


_RENDERERS = {
    MatmulSpec: render_matmul,
    BatchMatmulSpec: render_batch_matmul,
    Conv2dSpec: render_conv2d,
    DepthwiseSpec: render_depthwise,
    PoolSpec: render_pool,
    ElementwiseSpec: render_elementwise,
    SoftmaxSpec: render_softmax,
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
