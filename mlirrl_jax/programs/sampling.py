"""Random program shapes for the sampled part of the suites: per kind, a spec drawn within
ranges (`SampleRanges`: the wide ones, the networks' sizes, the CNN stages', dl-v0's).
Draws depend only on the generator: the suites' pinned hashes guard them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from mlirrl_jax.errors import ConfigError

# the spec types this module builds (each builder of specs imports the same list)
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
