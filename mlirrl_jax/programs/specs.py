"""The small frozen shape specs of the benchmark programs and their names (`generate` renders
them to MLIR; `sizes` gives their operand shapes, FLOP counts and footprints)."""

from __future__ import annotations

from dataclasses import dataclass

from mlirrl_jax.errors import ConfigError

Shape = tuple[int, ...]

# -inf as the f32 bit pattern, so the text round-trips exactly.
NEG_INF = "0xFF800000"


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
# Every spec below is a frozen dataclass with the same members (its checks, `kind`, `name`):
# alike by design. Each names one program family, and the names are pinned by the suites'
# hashes, so they stay written out one by one.
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


LAYERNORM_PARTS = ("mean", "var", "norm", "full")
LAYERNORM_EPS = "1.0e-05"  # the epsilon added to the variance, as the MLIR text writes it


@dataclass(frozen=True)
class LayerNormSpec:
    """Layer normalization over the last dim of (rows, cols), without the affine scale and
    shift: one piece (row mean, row variance, normalize by both) or the chain."""

    part: str  # one of LAYERNORM_PARTS
    rows: int
    cols: int

    def __post_init__(self) -> None:
        if self.part not in LAYERNORM_PARTS:
            raise ConfigError(f"{self!r}: part must be one of {LAYERNORM_PARTS}")
        _positive(self, self.rows, self.cols)

    @property
    def kind(self) -> str:
        return "layernorm" if self.part == "full" else f"layernorm_{self.part}"

    @property
    def name(self) -> str:
        return f"{self.kind}_r{self.rows}_c{self.cols}"


# ops of an element-wise chain: add and mul take a new input, relu and gelu one operand
CHAIN_OPS = ("add", "mul", "relu", "gelu")
CHAIN_BINARY_OPS = ("add", "mul")


@dataclass(frozen=True)
class ElementwiseChainSpec:
    """Two or three element-wise ops in a row, one `linalg.generic` each, over one shape: each
    op applies to the previous op's result (the first to input X)."""

    ops: tuple[str, ...]  # each one of CHAIN_OPS
    shape: Shape

    def __post_init__(self) -> None:
        if len(self.ops) not in (2, 3) or any(op not in CHAIN_OPS for op in self.ops):
            raise ConfigError(f"{self!r}: ops must be 2 or 3 of {CHAIN_OPS}")
        if not self.shape:
            raise ConfigError(f"{self!r}: shape must have at least one dimension")
        _positive(self, *self.shape)

    @property
    def kind(self) -> str:
        return "elementwise_chain"

    @property
    def name(self) -> str:
        return f"chain_{'_'.join(self.ops)}_{'x'.join(map(str, self.shape))}"


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
    | LayerNormSpec
    | ElementwiseChainSpec
    | MatmulBiasReluSpec
    | ConvBiasReluSpec
    | ContractionSpec
)
