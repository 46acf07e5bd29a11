"""Random program shapes for the sampled part of the suites: per kind, a spec drawn within
ranges (`SampleRanges`: the wide ones, the networks' sizes, the CNN stages', dl-v0's), or by
shapes-v3's own draws (`sample_shapes_v3`). Draws depend only on the generator: the suites'
pinned hashes guard them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from mlirrl_jax.errors import ConfigError

# the spec types this module builds (each builder of specs imports the same list)
from mlirrl_jax.programs.generate import (
    LAYERNORM_PARTS,
    LQCD_PATTERNS,
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
)

_T = TypeVar("_T")


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


def sample_spec(kind: str, rng: np.random.Generator, ranges: SampleRanges = DL_V0_RANGES) -> Spec:
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


# shapes-v3: what users bring that the earlier grids miss. Extents that do not divide into whole
# vectors (awkward-v0's, and primes), the channel counts of mobile and efficient CNNs, strided
# and dilated windows, attention at transformer sizes, layer norms and element-wise chains.
AWKWARD_EXTENTS = (7, 13, 14, 17, 26, 27, 28, 31, 54, 56, 61, 97, 112, 127, 147)
# the stage widths of MobileNetV2/V3, EfficientNet, ShuffleNetV2, RegNet and GhostNet, an RGB
# input's 3, and awkward-v0's extents
_V3_CHANNELS = tuple(
    sorted(
        {3, 24, 36, 40, 58, 72, 88, 116, 120, 144, 152, 184, 232, 240, 368, 464, 480, 672, 696}
        | {13, 14, 27, 28, 54, 56, 112, 147}
    )
)
_V3_FEATURE_MAPS = (7, 13, 14, 17, 26, 27, 28, 31, 54, 56, 112)
# token counts: ViT patches at 7x7 and 14x14 (with and without a class token), CLIP's text, a
# ViT-L/14 at 336 (577), and powers of two
_V3_TOKENS = (49, 50, 77, 128, 196, 197, 256, 257, 384, 577)
_V3_HIDDEN = (384, 512, 768, 1000, 1024, 1280, 3072)  # transformer widths, 1000 classes
_V3_HEAD_DIMS = (32, 64, 80, 96, 128)
_V3_CHAINS = (
    ("add", "relu"),  # residual add, then ReLU (ResNet)
    ("add", "gelu"),  # bias, then GELU
    ("mul", "add"),  # scale and shift (a folded batch norm)
    ("mul", "add", "relu"),  # a folded batch norm, then ReLU
    ("gelu", "mul"),  # GEGLU: GELU of one half times the other
)


def _v3_matrix(rng: np.random.Generator) -> int:
    """An awkward extent, a token count, a transformer width or a CNN channel count."""
    return _pick(rng, _pick(rng, [AWKWARD_EXTENTS, _V3_TOKENS, _V3_HIDDEN, _V3_CHANNELS]))


def _v3_window(rng: np.random.Generator) -> tuple[int, int, int, int]:
    """Kernels 1-7 with strides up to 4 and dilations up to 6 (DeepLab's), often both > 1;
    1x1 and even kernels (patch merging) undilated."""
    k = _pick(rng, [1, 2, 3, 3, 3, 5, 7])
    s = _pick(rng, [1, 1, 2, 2, 3, 4])
    d = _pick(rng, [1, 2, 2, 3, 4, 6]) if k in (3, 5, 7) else 1
    return k, s, d, d * (k - 1) // 2


_V3_RANGES = SampleRanges(
    channels=lambda rng: _pick(rng, _V3_CHANNELS),
    wide_channels=lambda rng: _pick(rng, _V3_CHANNELS),
    matrix=_v3_matrix,
    spatial=lambda rng: _pick(rng, _V3_FEATURE_MAPS),
    window=_v3_window,
)


def _v3_activation(rng: np.random.Generator) -> Shape:
    """An activation's shape: (tokens, width), (batch, tokens, width), NHWC or NCHW."""
    rank = _pick(rng, [2, 3, 4, 4])
    if rank == 2:
        return _pick(rng, _V3_TOKENS + AWKWARD_EXTENTS), _v3_matrix(rng)
    if rank == 3:
        return _pick(rng, [2, 4, 8]), _pick(rng, _V3_TOKENS), _pick(rng, _V3_HIDDEN)
    hw, c = _pick(rng, _V3_FEATURE_MAPS), _pick(rng, _V3_CHANNELS)
    return (1, hw, hw, c) if rng.integers(2) else (1, c, hw, hw)


def sample_shapes_v3(kind: str, rng: np.random.Generator) -> Spec:
    """A spec of `kind` as shapes-v3 draws it; the kinds without draws of their own are drawn
    by `sample_spec` within shapes-v3's ranges."""
    if kind == "batch_matmul":
        heads = _pick(rng, [1, 2, 4, 8, 12, 16]) * _pick(rng, [1, 1, 2, 4])
        seq, head_dim = _pick(rng, _V3_TOKENS + AWKWARD_EXTENTS), _pick(rng, _V3_HEAD_DIMS)
        # the scores q k^T or the weighted values p v, of every token or of one decoded token
        m, n, k = _pick(rng, [(seq, seq, head_dim), (seq, head_dim, seq)])
        return BatchMatmulSpec(heads, 1 if rng.integers(4) == 0 else m, n, k)
    if kind == "depthwise":
        hw, c = _pick(rng, _V3_FEATURE_MAPS), _pick(rng, _V3_CHANNELS)
        k, s, d = _pick(rng, [3, 5, 7]), _pick(rng, [1, 2, 2]), _pick(rng, [1, 1, 2, 3])
        pad = d * (k - 1) // 2
        return DepthwiseSpec(1, hw + 2 * pad, hw + 2 * pad, c, k, s, d)
    if kind == "pool":
        op, layout = _pick(rng, ["max", "sum", "avg"]), _pick(rng, ["nhwc", "nchw"])
        hw, c = _pick(rng, _V3_FEATURE_MAPS), _pick(rng, _V3_CHANNELS)
        if hw <= 28 and rng.integers(4) == 0:  # a global pool, as classifier heads end in
            return PoolSpec(op, 1, hw, hw, c, hw, 1, layout=layout)
        k, s = _pick(rng, [2, 3]), _pick(rng, [1, 2, 2])
        return PoolSpec(op, 1, hw, hw, c, k, s, layout=layout)
    if kind == "elementwise":
        return ElementwiseSpec(_pick(rng, ["add", "relu", "gelu"]), _v3_activation(rng))
    if kind == "elementwise_chain":
        return ElementwiseChainSpec(_pick(rng, _V3_CHAINS), _v3_activation(rng))
    if kind == "softmax":
        # attention scores (batch x heads x tokens rows over tokens) or class scores
        rows = _pick(rng, [1, 2, 4, 8, 12, 16]) * _pick(rng, _V3_TOKENS + AWKWARD_EXTENTS)
        cols = _pick(rng, _V3_TOKENS + AWKWARD_EXTENTS + (1000, 1001))
        return SoftmaxSpec(_pick(rng, list(SOFTMAX_PARTS)), rows, cols)
    if kind == "layernorm":
        rows = _pick(rng, [1, 2, 4, 8]) * _pick(rng, _V3_TOKENS + AWKWARD_EXTENTS)
        cols = _pick(rng, _pick(rng, [_V3_HIDDEN, _V3_CHANNELS]))
        return LayerNormSpec(_pick(rng, list(LAYERNORM_PARTS)), rows, cols)
    if kind == "contraction":
        pattern = _pick(rng, sorted(LQCD_PATTERNS))
        rank = len(LQCD_PATTERNS[pattern].lattice)
        return ContractionSpec(
            pattern, tuple(_pick(rng, [3, 5, 6, 7, 9, 10, 14]) for _ in range(rank))
        )
    return sample_spec(kind, rng, _V3_RANGES)
