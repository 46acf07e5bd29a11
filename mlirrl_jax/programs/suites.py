"""Versioned built-in benchmark suites of Linalg programs with a fixed train/test split.

A published suite never changes: its programs come from fixed layer lists and shapes sampled
from a fixed-seed generator, and tests pin a hash of every (uri, text) pair. A new or changed
program list needs a new suite version (dl-v1, ...).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlirrl_jax.errors import ConfigError, Error

# the spec types this module builds (each builder of specs imports the same list)
from mlirrl_jax.programs.generate import (
    BatchMatmulSpec,
    Conv2dSpec,
    ConvBiasReluSpec,
    DepthwiseSpec,
    ElementwiseSpec,
    MatmulBiasReluSpec,
    MatmulSpec,
    PoolSpec,
    Spec,
    flops,
    footprint_bytes,
    render,
)
from mlirrl_jax.programs.networks import (
    RESNET18_CONVS,
    RESNET50_CONVS,
    add_decode,
    add_lqcd,
    add_mobilenetv2,
    add_resnet,
    add_transformer,
    add_vgg16,
)
from mlirrl_jax.programs.sampling import (
    CNN_STAGE_RANGES,
    DL_V0_RANGES,
    NETWORK_RANGES,
    WIDE_RANGES,
    SampleRanges,
    sample_shapes_v3,
    sample_spec,
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


class UnknownProgramError(Error, KeyError):
    """No suite program has this URI."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


@dataclass(frozen=True)
class SuiteEntry:
    """One program of a suite, with where its shape comes from and its split."""

    uri: str
    spec: Spec | None  # None: a program kept as text (an imported model's layer, models-v0)
    model: str  # resnet18, resnet50, mobilenetv2, vgg16, bert, gpt2, lqcd or sampled
    layer: str  # the source layer, and how it was scaled down if it was
    split: str  # "train" or "test"
    source: str | None = None  # the program's text, where there is no spec
    source_flops: int | None = None  # and its FLOPs, recorded when the suite was built

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else self.uri.rsplit("/", 1)[1]

    @property
    def kind(self) -> str:
        return self.spec.kind if self.spec is not None else "model-layer"

    @property
    def flops(self) -> int:
        return flops(self.spec) if self.spec is not None else self.source_flops

    @property
    def text(self) -> str:
        return render(self.spec) if self.spec is not None else self.source


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


Draw = Callable[[str, np.random.Generator], Spec]  # (kind, generator) -> a sampled spec


def _within(ranges: SampleRanges) -> Draw:
    """`sample_spec`'s draws within `ranges`."""
    return functools.partial(sample_spec, ranges=ranges)


def _add_sampled(
    b: _Builder,
    seed: int,
    draw: Draw,
    counts: dict[str, int] = _SAMPLED_COUNTS,
    exclude: frozenset[str] = frozenset(),
) -> None:
    """`counts[kind]` sampled shapes of each kind that fit the caps; names in `exclude` (another
    suite's programs) are skipped, so a shape never sits in two suites."""
    rng = np.random.default_rng(seed)
    for kind, count in counts.items():
        added = 0
        while added < count:
            spec = draw(kind, rng)
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


# shapes-v3: the kinds users bring, weighted toward what the earlier suites lack: awkward
# extents throughout, strided and dilated convolutions, attention batch matmuls, softmax and
# layer-norm parts at token counts, and element-wise chains
_SHAPES_V3_COUNTS = {
    "matmul": 200,
    "batch_matmul": 150,
    "conv2d": 330,
    "conv_bias_relu": 150,
    "depthwise": 100,
    "pool": 80,
    "elementwise": 70,
    "elementwise_chain": 90,
    "softmax": 80,
    "layernorm": 80,
    "matmul_bias_relu": 80,
    "contraction": 30,
}


# ----------------------------------------------------------------------------- suites
@functools.cache
def _dl_v0() -> tuple[SuiteEntry, ...]:
    b = _Builder("dl-v0")
    # the held-out family goes first, so that a shape it shares with another family stays test
    add_vgg16(b)
    add_resnet(b, "resnet18", RESNET18_CONVS, [64, 128, 256, 512])
    add_resnet(b, "resnet50", RESNET50_CONVS, [256, 512, 1024, 2048])
    add_mobilenetv2(b)
    add_transformer(b, "bert", hidden=768, heads=12, ffn=3072, seqs=[64, 128, 256])
    add_transformer(b, "gpt2", hidden=1024, heads=16, ffn=4096, seqs=[64, 128])
    add_decode(b, "gpt2", hidden=1024, heads=16, ffn=4096, ctx=[256, 1024])
    add_lqcd(b)
    _add_sampled(b, seed=20261130, draw=_within(DL_V0_RANGES))
    return tuple(b.entries.values())


@functools.cache
def _shapes_v0() -> tuple[SuiteEntry, ...]:
    """Sampled shapes only, over wider ranges than dl-v0's and none of its programs: more
    distinct programs for the surrogate to learn from, split like dl-v0 by name hash."""
    b = _Builder("shapes-v0")
    dl_v0 = frozenset(e.name for e in _dl_v0())
    _add_sampled(
        b, seed=20261201, counts=_SHAPES_V0_COUNTS, draw=_within(WIDE_RANGES), exclude=dl_v0
    )
    return tuple(b.entries.values())


@functools.cache
def _shapes_v1() -> tuple[SuiteEntry, ...]:
    """Sampled network-like layers (`NETWORK_RANGES`), none of dl-v0's or shapes-v0's programs:
    the surrogate's held-out accuracy still grows with each doubling of training programs."""
    b = _Builder("shapes-v1")
    taken = frozenset(e.name for e in (*_dl_v0(), *_shapes_v0()))
    _add_sampled(
        b, seed=20261202, counts=_SHAPES_V1_COUNTS, draw=_within(NETWORK_RANGES), exclude=taken
    )
    return tuple(b.entries.values())


@functools.cache
def _shapes_v2() -> tuple[SuiteEntry, ...]:
    """Sampled CNN-stage and transformer-sized layers (`CNN_STAGE_RANGES`), none of the earlier
    suites' programs: more distinct programs, for collection with fewer schedules each."""
    b = _Builder("shapes-v2")
    taken = frozenset(e.name for e in (*_dl_v0(), *_shapes_v0(), *_shapes_v1()))
    _add_sampled(
        b, seed=20261203, counts=_SHAPES_V2_COUNTS, draw=_within(CNN_STAGE_RANGES), exclude=taken
    )
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


@functools.cache
def _models_v0() -> tuple[SuiteEntry, ...]:
    """The distinct layers of ResNet-18, MobileNetV2 and a BERT-base encoder layer at batch 1,
    imported from PyTorch (`mlirrl_jax.models.suite`; shipped as text, so no PyTorch is needed
    to use them); all train programs, none equal to a test program of another suite."""
    from mlirrl_jax.shipped import DATA

    folder = DATA / "suites" / "models-v0"
    index = json.loads((folder / "index.json").read_text())
    return tuple(
        SuiteEntry(
            f"{SCHEME}models-v0/{item['name']}",
            None,
            item["model"],
            f"{item['layer']} (x{item['count']} in the model)",
            "train",
            (folder / f"{item['name']}.mlir").read_text(),
            item["flops"],
        )
        for item in index
    )


@functools.cache
def _shapes_v3() -> tuple[SuiteEntry, ...]:
    """Sampled awkward-extent, strided and dilated, attention-sized and layer-norm programs
    (`sample_shapes_v3`), none of another suite's programs (awkward-v0's and models-v0's
    included)."""
    b = _Builder("shapes-v3")
    earlier = (_dl_v0, _shapes_v0, _shapes_v1, _shapes_v2, _awkward_v0, _models_v0)
    taken = frozenset(e.name for build in earlier for e in build())
    _add_sampled(b, seed=20261207, counts=_SHAPES_V3_COUNTS, draw=sample_shapes_v3, exclude=taken)
    return tuple(b.entries.values())


_SUITES: dict[str, Callable[[], tuple[SuiteEntry, ...]]] = {
    "dl-v0": _dl_v0,
    "shapes-v0": _shapes_v0,
    "shapes-v1": _shapes_v1,
    "shapes-v2": _shapes_v2,
    "awkward-v0": _awkward_v0,
    "models-v0": _models_v0,
    "shapes-v3": _shapes_v3,
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
