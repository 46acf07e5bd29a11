"""Versioned built-in benchmark suites of Linalg programs with a fixed train/test split.

A published suite never changes: its programs come from fixed layer lists and shapes sampled
from a fixed-seed generator, and tests pin a hash of every (uri, text) pair. A new or changed
program list needs a new suite version (dl-v1, ...).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from mlirrl_jax.errors import ConfigError, Error
from mlirrl_jax.programs.generate import (
    LQCD_PATTERNS,
    SOFTMAX_PARTS,
    BatchMatmulSpec,
    ContractionSpec,
    Conv2dSpec,
    ConvBiasReluSpec,
    DepthwiseSpec,
    ElementwiseSpec,
    MatmulBiasReluSpec,
    MatmulSpec,
    PoolSpec,
    SoftmaxSpec,
    Spec,
    flops,
    footprint_bytes,
    render,
)

SCHEME = "suite://"
# The caps, rates and split rule below shape dl-v0: changing them changes the published suite
# (the pinned hash test catches it), so a change needs a new suite version.
MAX_FLOPS = 1_500_000_000
MAX_BASELINE_S = 1.0  # estimated unscheduled run time, see baseline_seconds
MAX_BYTES = 64 * 2**20  # arguments + result, so that many programs can be measured side by side
HELD_OUT_MODEL = "vgg16"
TEST_PERCENT = 15  # share of shapes of the other families that go to test, by hash of the name
SPLITS = ("train", "test")
_T = TypeVar("_T")


class UnknownProgramError(Error, KeyError):
    """No suite program has this URI."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


@dataclass(frozen=True)
class SuiteEntry:
    """One program of a suite, with where its shape comes from and its split."""

    uri: str
    spec: Spec
    model: str  # resnet18, resnet50, mobilenetv2, vgg16, bert, gpt2, lqcd or sampled
    layer: str  # the source layer, and how it was scaled down if it was
    split: str  # "train" or "test"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def flops(self) -> int:
        return flops(self.spec)

    @property
    def text(self) -> str:
        return render(self.spec)


# Unscheduled (naive loop nest) speed on the 2-core dev machine (AMD EPYC, L2 1 MiB 8-way),
# measured on suite programs: 1-2.5 GFLOP/s, but 0.25-0.55 GFLOP/s when the innermost reduction
# loop walks an operand whose row stride maps its lines to few L2 sets (power-of-two widths
# such as 768, 1024, 3072), so that every column walk misses L2.
FAST_FLOPS_PER_S = 1.0e9
SLOW_FLOPS_PER_S = 0.3e9
_L2_SETS, _L2_WAYS, _LINE = 2048, 8, 64


def _l2_thrashes(stride: int, lines: int) -> bool:
    """Whether `lines` cache lines `stride` bytes apart overflow the L2 sets they fall into."""
    period = _L2_SETS * _LINE
    sets = min(_L2_SETS, period // math.gcd(stride, period))
    return lines > sets * _L2_WAYS


def _reduction_walk(spec: Spec) -> tuple[int, int] | None:
    """(stride in bytes, length) of the strided operand walk in the innermost reduction loop."""
    if isinstance(spec, MatmulSpec | MatmulBiasReluSpec | BatchMatmulSpec):
        return 4 * spec.n, spec.k  # B[k, n] down a column
    if isinstance(spec, ConvBiasReluSpec) or (
        isinstance(spec, Conv2dSpec) and spec.layout == "nhwc"
    ):
        return 4 * spec.f, spec.k * spec.k * spec.c  # W[kh, kw, c, f] over (kh, kw, c)
    return None


def baseline_seconds(spec: Spec) -> float:
    """Rough (pessimistic) run time of the unscheduled program on the 2-core dev machine."""
    walk = _reduction_walk(spec)
    slow = walk is not None and _l2_thrashes(*walk)
    return flops(spec) / (SLOW_FLOPS_PER_S if slow else FAST_FLOPS_PER_S)


def _fits(spec: Spec) -> bool:
    return (
        flops(spec) <= MAX_FLOPS
        and baseline_seconds(spec) <= MAX_BASELINE_S
        and footprint_bytes(spec) <= MAX_BYTES
    )


def _is_test(model: str, name: str) -> bool:
    if model == HELD_OUT_MODEL:
        return True
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % 100 < TEST_PERCENT


class _Builder:
    """Collects programs in order; the first model to add a shape owns it."""

    def __init__(self, suite: str) -> None:
        self.suite = suite
        self.entries: dict[str, SuiteEntry] = {}

    def add(self, model: str, layer: str, spec: Spec) -> bool:
        """Adds `spec` unless a program of that name exists; says whether it was added."""
        if not _fits(spec):
            raise ConfigError(f"{spec.name} ({layer}) exceeds the suite's size caps")
        if spec.name in self.entries:
            return False
        split = "test" if _is_test(model, spec.name) else "train"
        uri = f"{SCHEME}{self.suite}/{spec.name}"
        self.entries[spec.name] = SuiteEntry(uri, spec, model, layer, split)
        return True

    def add_scaled(
        self, model: str, layer: str, make: Callable[[int], Spec], size: int, what: str
    ) -> None:
        """Adds make(size), halving `size` (the `what` dimension) until it fits the caps."""
        scaled = size
        while not _fits(make(scaled)):
            if scaled == 1:
                raise ConfigError(f"{layer}: cannot scale {what} below 1 to fit the caps")
            scaled = max(1, scaled // 2)
        note = f" [{what} scaled {size}->{scaled} to fit the size caps]" if scaled != size else ""
        self.add(model, layer + note, make(scaled))


# ----------------------------------------------------------------------------- model layers
# Convolution layers as (layer, input size before padding, c_in, c_out, kernel, stride, pad).
ConvLayer = tuple[str, int, int, int, int, int, int]

_VGG16_CONVS: list[ConvLayer] = [
    ("features.0", 224, 3, 64, 3, 1, 1),
    ("features.2", 224, 64, 64, 3, 1, 1),
    ("features.5", 112, 64, 128, 3, 1, 1),
    ("features.7", 112, 128, 128, 3, 1, 1),
    ("features.10", 56, 128, 256, 3, 1, 1),
    ("features.12", 56, 256, 256, 3, 1, 1),
    ("features.17", 28, 256, 512, 3, 1, 1),
    ("features.19", 28, 512, 512, 3, 1, 1),
    ("features.24", 14, 512, 512, 3, 1, 1),
]

_RESNET18_CONVS: list[ConvLayer] = [
    ("conv1", 224, 3, 64, 7, 2, 3),
    ("layer1.0.conv1", 56, 64, 64, 3, 1, 1),
    ("layer2.0.conv1", 56, 64, 128, 3, 2, 1),
    ("layer2.0.conv2", 28, 128, 128, 3, 1, 1),
    ("layer2.0.downsample", 56, 64, 128, 1, 2, 0),
    ("layer3.0.conv1", 28, 128, 256, 3, 2, 1),
    ("layer3.0.conv2", 14, 256, 256, 3, 1, 1),
    ("layer3.0.downsample", 28, 128, 256, 1, 2, 0),
    ("layer4.0.conv1", 14, 256, 512, 3, 2, 1),
    ("layer4.0.conv2", 7, 512, 512, 3, 1, 1),
    ("layer4.0.downsample", 14, 256, 512, 1, 2, 0),
]

# torchvision ResNet-50 (v1.5: the stride sits on the 3x3 conv); later blocks repeat shapes.
_RESNET50_CONVS: list[ConvLayer] = [
    ("conv1", 224, 3, 64, 7, 2, 3),
    ("layer1.0.conv1", 56, 64, 64, 1, 1, 0),
    ("layer1.0.conv2", 56, 64, 64, 3, 1, 1),
    ("layer1.0.conv3", 56, 64, 256, 1, 1, 0),
    ("layer1.1.conv1", 56, 256, 64, 1, 1, 0),
    ("layer2.0.conv1", 56, 256, 128, 1, 1, 0),
    ("layer2.0.conv2", 56, 128, 128, 3, 2, 1),
    ("layer2.0.conv3", 28, 128, 512, 1, 1, 0),
    ("layer2.0.downsample", 56, 256, 512, 1, 2, 0),
    ("layer2.1.conv1", 28, 512, 128, 1, 1, 0),
    ("layer2.1.conv2", 28, 128, 128, 3, 1, 1),
    ("layer3.0.conv1", 28, 512, 256, 1, 1, 0),
    ("layer3.0.conv2", 28, 256, 256, 3, 2, 1),
    ("layer3.0.conv3", 14, 256, 1024, 1, 1, 0),
    ("layer3.0.downsample", 28, 512, 1024, 1, 2, 0),
    ("layer3.1.conv1", 14, 1024, 256, 1, 1, 0),
    ("layer4.0.conv1", 14, 1024, 512, 1, 1, 0),
    ("layer4.0.conv2", 14, 512, 512, 3, 2, 1),
    ("layer4.0.conv3", 7, 512, 2048, 1, 1, 0),
    ("layer4.0.downsample", 14, 1024, 2048, 1, 2, 0),
    ("layer4.1.conv1", 7, 2048, 512, 1, 1, 0),
]

# MobileNetV2 inverted-residual stages: (expansion t, c_out, repeats n, first stride s).
_MOBILENETV2_STAGES = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def _add_conv(
    b: _Builder,
    model: str,
    conv: ConvLayer,
    layouts: tuple[str, ...] = ("nhwc", "nchw"),
    bias_relu: bool = False,
) -> None:
    """Adds a conv layer in each layout (and as conv+bias+relu), batch 1."""
    layer, hw, c, f, k, s, pad = conv
    for layout in layouts:
        b.add_scaled(
            model,
            f"{layer} ({layout})",
            lambda x, lay=layout: Conv2dSpec(lay, 1, x + 2 * pad, x + 2 * pad, c, f, k, s),
            hw,
            "spatial size",
        )
    if bias_relu:
        b.add_scaled(
            model,
            f"{layer} + bias + relu",
            lambda x: ConvBiasReluSpec(1, x + 2 * pad, x + 2 * pad, c, f, k, s),
            hw,
            "spatial size",
        )


def _add_vgg16(b: _Builder) -> None:
    for conv in _VGG16_CONVS:
        _add_conv(b, "vgg16", conv, bias_relu=True)
    for hw, c in [(224, 64), (112, 128), (56, 256), (28, 512), (14, 512)]:
        b.add("vgg16", f"maxpool after {hw}x{hw}x{c}", PoolSpec("max", 1, hw, hw, c, 2, 2))
    for hw, c in [(224, 64), (112, 128), (56, 256)]:
        b.add("vgg16", f"relu {hw}x{hw}x{c}", ElementwiseSpec("relu", (1, hw, hw, c)))
    fcs = [
        ("classifier.0", 25088, 4096),
        ("classifier.3", 4096, 4096),
        ("classifier.6", 4096, 1000),
    ]
    for layer, k, n in fcs:
        b.add_scaled("vgg16", layer, lambda x, k=k: MatmulSpec(1, x, k), n, "out features")
    for layer, k, n in fcs[:2]:
        b.add_scaled(
            "vgg16",
            f"{layer} + relu, batch 16",
            lambda x, k=k: MatmulBiasReluSpec(16, x, k),
            n,
            "out features",
        )


def _add_resnet(b: _Builder, model: str, convs: list[ConvLayer], stage_channels: list[int]) -> None:
    for conv in convs:
        # folded batch norm + relu follows every conv but the downsample and the expanding 1x1
        fused = "downsample" not in conv[0] and "conv3" not in conv[0]
        _add_conv(b, model, conv, bias_relu=fused)
    b.add(model, "maxpool", PoolSpec("max", 1, 114, 114, 64, 3, 2))
    b.add(model, "avgpool", PoolSpec("avg", 1, 7, 7, stage_channels[-1], 7, 1))
    for stage, (hw, c) in enumerate(zip([56, 28, 14, 7], stage_channels, strict=True), 1):
        shape = (1, hw, hw, c)
        b.add(model, f"layer{stage} residual add", ElementwiseSpec("add", shape))
        b.add(model, f"layer{stage} relu", ElementwiseSpec("relu", shape))
    b.add(model, "fc", MatmulSpec(1, 1000, stage_channels[-1]))
    b.add(model, "fc, batch 32", MatmulSpec(32, 1000, stage_channels[-1]))


def _add_mobilenetv2(b: _Builder) -> None:
    model = "mobilenetv2"
    _add_conv(b, model, ("features.0", 224, 3, 32, 3, 2, 1), bias_relu=True)
    hw, cin = 112, 32
    for stage, (t, cout, n, s) in enumerate(_MOBILENETV2_STAGES, 1):
        # later repeats of a block have the shapes of the second one
        for block in range(min(n, 2)):
            stride = s if block == 0 else 1
            hidden = cin * t
            name = f"stage{stage}.block{block}"
            if t != 1:
                expand = (f"{name}.expand", hw, cin, hidden, 1, 1, 0)
                _add_conv(b, model, expand, layouts=("nhwc",), bias_relu=True)
            b.add(
                model,
                f"{name}.depthwise",
                DepthwiseSpec(1, hw + 2, hw + 2, hidden, 3, stride),
            )
            hw = (hw - 1) // stride + 1
            _add_conv(b, model, (f"{name}.project", hw, hidden, cout, 1, 1, 0), layouts=("nhwc",))
            if block > 0:
                b.add(model, f"{name} residual add", ElementwiseSpec("add", (1, hw, hw, cout)))
            cin = cout
    _add_conv(b, model, ("features.18", 7, 320, 1280, 1, 1, 0), bias_relu=True)
    b.add(model, "avgpool", PoolSpec("avg", 1, 7, 7, 1280, 7, 1))
    b.add(model, "classifier", MatmulSpec(1, 1000, 1280))
    b.add(model, "relu6 (as relu) 112x112x96", ElementwiseSpec("relu", (1, 112, 112, 96)))


def _add_transformer(
    b: _Builder, model: str, hidden: int, heads: int, ffn: int, seqs: list[int]
) -> None:
    """Projections, attention and MLP of one encoder/decoder layer at batch 1."""
    dh = hidden // heads
    for seq in seqs:
        at = f"seq {seq}"
        b.add_scaled(
            model,
            f"qkv projection, {at}",
            lambda x: MatmulSpec(x, 3 * hidden, hidden),
            seq,
            "tokens",
        )
        b.add(model, f"attention output projection, {at}", MatmulSpec(seq, hidden, hidden))
        b.add(model, f"attention scores QK^T, {at}", BatchMatmulSpec(heads, seq, seq, dh))
        b.add(model, f"attention context PV, {at}", BatchMatmulSpec(heads, seq, dh, seq))
        for part in SOFTMAX_PARTS:
            b.add(model, f"attention softmax ({part}), {at}", SoftmaxSpec(part, heads * seq, seq))
        b.add_scaled(model, f"mlp up, {at}", lambda x: MatmulSpec(x, ffn, hidden), seq, "tokens")
        b.add_scaled(
            model,
            f"mlp up + bias + relu (gelu stand-in), {at}",
            lambda x: MatmulBiasReluSpec(x, ffn, hidden),
            seq,
            "tokens",
        )
        b.add(model, f"mlp gelu, {at}", ElementwiseSpec("gelu", (seq, ffn)))
        b.add_scaled(model, f"mlp down, {at}", lambda x: MatmulSpec(x, hidden, ffn), seq, "tokens")
        b.add(model, f"residual add, {at}", ElementwiseSpec("add", (seq, hidden)))


def _add_decode(b: _Builder, model: str, hidden: int, heads: int, ffn: int, ctx: list[int]) -> None:
    """One generated token with a KV cache of `ctx` positions."""
    dh = hidden // heads
    b.add(model, "decode qkv projection", MatmulSpec(1, 3 * hidden, hidden))
    b.add(model, "decode mlp up", MatmulSpec(1, ffn, hidden))
    b.add(model, "decode mlp down", MatmulSpec(1, hidden, ffn))
    for t in ctx:
        b.add(model, f"decode scores, ctx {t}", BatchMatmulSpec(heads, 1, t, dh))
        b.add(model, f"decode context, ctx {t}", BatchMatmulSpec(heads, 1, dh, t))
        b.add(model, f"decode softmax, ctx {t}", SoftmaxSpec("full", heads, t))


_LQCD_LATTICES = {2: [(8, 8), (16, 8), (16, 16)], 3: [(4, 4, 4), (8, 8, 8), (16, 16, 8)]}
_LQCD_LATTICES[4] = [(4, 4, 4, 4), (8, 8, 8, 4), (8, 8, 8, 8), (16, 8, 8, 8)]


def _add_lqcd(b: _Builder) -> None:
    for pattern, pat in LQCD_PATTERNS.items():
        for lattice in _LQCD_LATTICES[len(pat.lattice)]:
            b.add("lqcd", pat.doc, ContractionSpec(pattern, lattice))


# ----------------------------------------------------------------------------- sampled shapes
def _mult(rng: np.random.Generator, lo: int, hi: int, step: int) -> int:
    """A multiple of `step` in [lo, hi]."""
    return step * int(rng.integers(lo // step, hi // step + 1))


def _pick(rng: np.random.Generator, options: Sequence[_T]) -> _T:
    return options[int(rng.integers(len(options)))]


def _sample_window(rng: np.random.Generator, kernels: list[int]) -> tuple[int, int, int, int]:
    """(kernel, stride, dilation, pad) with 'same'-style padding."""
    k = _pick(rng, kernels)
    s = int(rng.integers(1, 3))
    d = int(rng.integers(1, 3)) if k > 1 else 1
    return k, s, d, d * (k - 1) // 2


@dataclass(frozen=True)
class SampleRanges:
    """Where sampled shapes come from: the draws of one suite version (never change one)."""

    channels: Callable[[np.random.Generator], int]  # conv input/output channels
    wide_channels: Callable[[np.random.Generator], int]  # depthwise, pool, 4-D elementwise
    matrix: Callable[[np.random.Generator], int]  # matmul-like dims
    # conv output size (before padding); None: uniform in [7, 64], as the first suites drew it
    spatial: Callable[[np.random.Generator], int] | None = None
    # conv (kernel, stride, dilation, pad); None: `_sample_window` over kernels 1, 3, 5, 7
    window: Callable[[np.random.Generator], tuple[int, int, int, int]] | None = None


def _log_uniform_mult(rng: np.random.Generator, lo: int, hi: int, step: int) -> int:
    """A multiple of `step` in [lo, hi], log-uniform: small and large sizes equally likely."""
    value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return max(lo, min(hi, step * int(round(value / step))))


# dl-v0: uniform draws, channels up to 256
DL_V0_RANGES = SampleRanges(
    channels=lambda rng: _mult(rng, 8, 256, 8),
    wide_channels=lambda rng: _mult(rng, 16, 512, 16),
    matrix=lambda rng: _mult(rng, 16, 1024, 8),
)
# shapes-v0: log-uniform draws over a wider range (the channel counts of deep CNN stages)
WIDE_RANGES = SampleRanges(
    channels=lambda rng: _log_uniform_mult(rng, 8, 2048, 8),
    wide_channels=lambda rng: _log_uniform_mult(rng, 16, 2048, 16),
    matrix=lambda rng: _log_uniform_mult(rng, 16, 2048, 8),
)


def _network_size(rng: np.random.Generator, options: Sequence[int]) -> int:
    """One of a network's usual sizes, times 1, 1.5 or 0.75 (the widths of scaled variants)."""
    return int(_pick(rng, options) * _pick(rng, [1.0, 1.0, 1.5, 0.75]))


# shapes-v1: the grids real networks are built on: power-of-two widths (and their 0.75x, 1.5x
# variants), feature maps of 7 to 56, so that the surrogate sees many more network-like layers
NETWORK_RANGES = SampleRanges(
    channels=lambda rng: _network_size(rng, [16, 32, 64, 128, 256, 512, 1024, 2048]),
    wide_channels=lambda rng: _network_size(rng, [32, 64, 128, 256, 512, 1024]),
    matrix=lambda rng: _network_size(rng, [64, 128, 256, 512, 768, 1024, 2048]),
    spatial=lambda rng: _pick(rng, [7, 14, 14, 28, 28, 56]),
)


def _cnn_stage_window(rng: np.random.Generator) -> tuple[int, int, int, int]:
    """The windows of ResNet-style stages: mostly 1x1, else 3x3; stride 1 or 2; no dilation."""
    k = _pick(rng, [1, 1, 3])
    return k, int(rng.integers(1, 3)), 1, (k - 1) // 2


# shapes-v2: convolutions as CNN stages build them (1x1 and 3x3 windows, feature maps 7-56 on
# the power-of-two channel grid) and matrix sizes of transformer and classifier layers
CNN_STAGE_RANGES = SampleRanges(
    channels=lambda rng: _network_size(rng, [32, 64, 128, 256, 512, 1024, 2048]),
    wide_channels=lambda rng: _network_size(rng, [64, 128, 256, 512, 1024, 2048]),
    matrix=lambda rng: _network_size(rng, [16, 32, 64, 128, 256, 512, 768, 1024, 2048, 4096]),
    spatial=lambda rng: _pick(rng, [7, 14, 28, 56]),
    window=_cnn_stage_window,
)


def _sample_spec(kind: str, rng: np.random.Generator, ranges: SampleRanges = DL_V0_RANGES) -> Spec:
    r = ranges
    if kind == "matmul":
        return MatmulSpec(r.matrix(rng), r.matrix(rng), r.matrix(rng))
    if kind == "batch_matmul":
        dims = [_mult(rng, 16, 512, 8) for _ in range(3)]
        return BatchMatmulSpec(int(rng.integers(2, 17)), *dims)
    if kind in ("conv2d", "conv_bias_relu"):
        hw = r.spatial(rng) if r.spatial else int(rng.integers(7, 65))
        c, f = r.channels(rng), r.channels(rng)
        k, s, d, pad = r.window(rng) if r.window else _sample_window(rng, [1, 3, 5, 7])
        if kind == "conv_bias_relu":
            return ConvBiasReluSpec(1, hw + 2 * pad, hw + 2 * pad, c, f, k, s, d)
        layout = _pick(rng, ["nhwc", "nchw"])
        return Conv2dSpec(layout, 1, hw + 2 * pad, hw + 2 * pad, c, f, k, s, d)
    if kind == "depthwise":
        hw, c = int(rng.integers(7, 113)), r.wide_channels(rng)
        k, s, d, pad = _sample_window(rng, [3, 5])
        return DepthwiseSpec(1, hw + 2 * pad, hw + 2 * pad, c, k, s, d)
    if kind == "pool":
        hw, c = int(rng.integers(7, 113)), r.wide_channels(rng)
        k, s = _pick(rng, [2, 3]), int(rng.integers(1, 3))
        return PoolSpec(_pick(rng, ["max", "sum", "avg"]), 1, hw, hw, c, k, s)
    if kind == "elementwise":
        op = _pick(rng, ["add", "relu", "gelu"])
        if rng.integers(2):
            return ElementwiseSpec(op, (_mult(rng, 16, 2048, 16), _mult(rng, 16, 4096, 16)))
        hw = int(rng.integers(7, 113))
        return ElementwiseSpec(op, (1, hw, hw, r.wide_channels(rng)))
    if kind == "softmax":
        part = _pick(rng, list(SOFTMAX_PARTS))
        return SoftmaxSpec(part, _mult(rng, 16, 4096, 16), _mult(rng, 16, 1024, 16))
    if kind == "matmul_bias_relu":
        dims = [r.matrix(rng) for _ in range(3)]
        return MatmulBiasReluSpec(*dims)
    if kind == "contraction":
        pattern = _pick(rng, sorted(LQCD_PATTERNS))
        rank = len(LQCD_PATTERNS[pattern].lattice)
        return ContractionSpec(pattern, tuple(_pick(rng, [4, 6, 8, 12, 16]) for _ in range(rank)))
    raise ConfigError(f"no sampler for {kind}")


_SAMPLED_COUNTS = {
    "matmul": 12,
    "batch_matmul": 6,
    "conv2d": 10,
    "conv_bias_relu": 4,
    "depthwise": 5,
    "pool": 5,
    "elementwise": 5,
    "softmax": 5,
    "matmul_bias_relu": 4,
    "contraction": 6,
}


# shapes-v0: many more shapes of each kind, for cost-model training data
_SHAPES_V0_COUNTS = {
    "matmul": 70,
    "batch_matmul": 30,
    "conv2d": 110,
    "conv_bias_relu": 40,
    "depthwise": 30,
    "pool": 40,
    "elementwise": 50,
    "softmax": 30,
    "matmul_bias_relu": 30,
    "contraction": 20,
}


def _add_sampled(
    b: _Builder,
    seed: int,
    counts: dict[str, int] = _SAMPLED_COUNTS,
    ranges: SampleRanges = DL_V0_RANGES,
    exclude: frozenset[str] = frozenset(),
) -> None:
    """`counts[kind]` sampled shapes of each kind that fit the caps; names in `exclude` (another
    suite's programs) are skipped, so a shape never sits in two suites."""
    rng = np.random.default_rng(seed)
    for kind, count in counts.items():
        added = 0
        while added < count:
            spec = _sample_spec(kind, rng, ranges)
            if (
                _fits(spec)
                and spec.name not in exclude
                and b.add("sampled", f"sampled {kind}", spec)
            ):
                added += 1


# shapes-v1: network-like layers, weighted toward the kinds CNN stages are made of
_SHAPES_V1_COUNTS = {
    "matmul": 70,
    "batch_matmul": 30,
    "conv2d": 200,
    "conv_bias_relu": 120,
    "depthwise": 40,
    "pool": 40,
    "elementwise": 60,
    "softmax": 30,
    "matmul_bias_relu": 40,
    "contraction": 20,
}


# shapes-v2: many more distinct programs, each with fewer schedules (about 10 per hour-and-a-half
# of collection on 2 cores), dominated by the convolutions of CNN stages
_SHAPES_V2_COUNTS = {
    "matmul": 200,
    "batch_matmul": 60,
    "conv2d": 500,
    "conv_bias_relu": 300,
    "depthwise": 80,
    "pool": 80,
    "elementwise": 150,
    "softmax": 60,
    "matmul_bias_relu": 80,
    "contraction": 30,
}


# ----------------------------------------------------------------------------- suites
@functools.cache
def _dl_v0() -> tuple[SuiteEntry, ...]:
    b = _Builder("dl-v0")
    # the held-out family goes first, so that a shape it shares with another family stays test
    _add_vgg16(b)
    _add_resnet(b, "resnet18", _RESNET18_CONVS, [64, 128, 256, 512])
    _add_resnet(b, "resnet50", _RESNET50_CONVS, [256, 512, 1024, 2048])
    _add_mobilenetv2(b)
    _add_transformer(b, "bert", hidden=768, heads=12, ffn=3072, seqs=[64, 128, 256])
    _add_transformer(b, "gpt2", hidden=1024, heads=16, ffn=4096, seqs=[64, 128])
    _add_decode(b, "gpt2", hidden=1024, heads=16, ffn=4096, ctx=[256, 1024])
    _add_lqcd(b)
    _add_sampled(b, seed=20261130)
    return tuple(b.entries.values())


@functools.cache
def _shapes_v0() -> tuple[SuiteEntry, ...]:
    """Sampled shapes only, over wider ranges than dl-v0's and none of its programs: more
    distinct programs for the surrogate to learn from, split like dl-v0 by name hash."""
    b = _Builder("shapes-v0")
    dl_v0 = frozenset(e.name for e in _dl_v0())
    _add_sampled(b, seed=20261201, counts=_SHAPES_V0_COUNTS, ranges=WIDE_RANGES, exclude=dl_v0)
    return tuple(b.entries.values())


@functools.cache
def _shapes_v1() -> tuple[SuiteEntry, ...]:
    """Sampled network-like layers (`NETWORK_RANGES`), none of dl-v0's or shapes-v0's programs:
    the surrogate's held-out accuracy still grows with each doubling of training programs."""
    b = _Builder("shapes-v1")
    taken = frozenset(e.name for e in (*_dl_v0(), *_shapes_v0()))
    _add_sampled(b, seed=20261202, counts=_SHAPES_V1_COUNTS, ranges=NETWORK_RANGES, exclude=taken)
    return tuple(b.entries.values())


@functools.cache
def _shapes_v2() -> tuple[SuiteEntry, ...]:
    """Sampled CNN-stage and transformer-sized layers (`CNN_STAGE_RANGES`), none of the earlier
    suites' programs: more distinct programs, for collection with fewer schedules each."""
    b = _Builder("shapes-v2")
    taken = frozenset(e.name for e in (*_dl_v0(), *_shapes_v0(), *_shapes_v1()))
    _add_sampled(b, seed=20261203, counts=_SHAPES_V2_COUNTS, ranges=CNN_STAGE_RANGES, exclude=taken)
    return tuple(b.entries.values())


# awkward-v0: layers of real networks whose extents do not divide into whole vectors (7, 13,
# 14, 26, 27, 28, 54, 56, 112, 147), per op kind at batch 1 and at batch 32 (for matmuls: 32
# rows per token position). (model, layer, spec); all of them test programs.
_AWKWARD: list[tuple[str, str, Spec]] = [
    ("resnet stem as img2col", "7x7x3 patches x 56 filters", MatmulSpec(112, 56, 147)),
    ("resnet stem as img2col", "batch 32", MatmulSpec(32 * 112, 112, 147)),
    ("mlp", "14x14 tokens, 54 -> 28", MatmulSpec(196, 28, 54)),
    ("resnet18", "layer4 3x3 (7x7 maps)", Conv2dSpec("nhwc", 1, 9, 9, 512, 512, 3)),
    ("resnet18", "layer2 3x3 (28x28 maps)", Conv2dSpec("nhwc", 1, 30, 30, 64, 64, 3)),
    ("resnet", "3x3 at batch 32 (14x14 maps)", Conv2dSpec("nhwc", 32, 16, 16, 32, 56, 3)),
    ("vgg-like", "3x3, 26-wide output row", Conv2dSpec("nchw", 1, 28, 28, 64, 64, 3)),
    ("alexnet", "conv4 (13x13 maps)", Conv2dSpec("nchw", 1, 15, 15, 256, 256, 3)),
    ("resnet50", "1x1 on 28x28 maps", Conv2dSpec("nchw", 1, 28, 28, 128, 128, 1)),
    ("resnet", "3x3 at batch 32 (14x14 maps, nchw)", Conv2dSpec("nchw", 32, 16, 16, 32, 56, 3)),
    ("mobilenetv2", "3x3 depthwise (56x56 maps)", DepthwiseSpec(1, 58, 58, 144, 3)),
    ("mobilenetv2", "3x3 depthwise at batch 32", DepthwiseSpec(32, 30, 30, 96, 3)),
    ("resnet", "stem max pool 3x3/2 (112 -> 56)", PoolSpec("max", 1, 113, 113, 64, 3, 2)),
    ("resnet", "max pool 2x2/2 at batch 32 (28 -> 14)", PoolSpec("max", 32, 28, 28, 54, 2, 2)),
    ("resnet", "residual add (56x56x147)", ElementwiseSpec("add", (1, 56, 56, 147))),
    ("resnet", "residual add at batch 32", ElementwiseSpec("add", (32, 14, 14, 147))),
    ("vgg-like", "relu (112x112x27)", ElementwiseSpec("relu", (1, 112, 112, 27))),
    ("vgg-like", "relu at batch 32", ElementwiseSpec("relu", (32, 28, 28, 54))),
]


@functools.cache
def _awkward_v0() -> tuple[SuiteEntry, ...]:
    """Real-network shapes with awkward extents, for the schedule space's remainders and
    layouts; every program is a test program (nothing here is trained on)."""
    entries = {}
    for model, layer, spec in _AWKWARD:
        if spec.name in entries or footprint_bytes(spec) > MAX_BYTES:
            raise ConfigError(f"awkward-v0: {spec.name} repeats or is too large")
        entries[spec.name] = SuiteEntry(
            f"{SCHEME}awkward-v0/{spec.name}", spec, model, layer, "test"
        )
    return tuple(entries.values())


_SUITES: dict[str, Callable[[], tuple[SuiteEntry, ...]]] = {
    "dl-v0": _dl_v0,
    "shapes-v0": _shapes_v0,
    "shapes-v1": _shapes_v1,
    "shapes-v2": _shapes_v2,
    "awkward-v0": _awkward_v0,
}


def list_suites() -> list[str]:
    """Names of the built-in suites."""
    return list(_SUITES)


def suite(name: str = "dl-v0") -> list[SuiteEntry]:
    """All programs of suite `name`, in their fixed order."""
    build = _SUITES.get(name)
    if build is None:
        raise ConfigError(f"unknown suite {name!r}; known suites: {', '.join(_SUITES)}")
    return list(build())


def split(name: str, which: str) -> list[SuiteEntry]:
    """The programs of suite `name` in split `which` ("train" or "test")."""
    if which not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {which!r}")
    return [e for e in suite(name) if e.split == which]


@functools.cache
def _by_uri() -> dict[str, SuiteEntry]:
    return {e.uri: e for build in _SUITES.values() for e in build()}


def get(uri: str) -> SuiteEntry:
    """The suite program with this `suite://<suite>/<name>` URI."""
    known = _by_uri()
    if uri in known:
        return known[uri]
    close = difflib.get_close_matches(uri, list(known), n=3, cutoff=0.6)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise UnknownProgramError(f"unknown program URI {uri!r}{hint}")


def content_hash(name: str = "dl-v0") -> str:
    """SHA-256 of the ordered (uri, text) pairs of suite `name`."""
    h = hashlib.sha256()
    for e in suite(name):
        h.update(f"{e.uri}\n{e.text}\n".encode())
    return h.hexdigest()
