"""The layers of real networks in the suites: VGG-16, ResNet-18 and -50, MobileNetV2,
transformer encoders and decoders, and lattice QCD contractions, as specs added to a suite's
`Builder` (layer shapes as torchvision and the papers give them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

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


class Builder(Protocol):
    """What the layer tables are added to (the suites' builder): a spec of a model's layer,
    or one made smaller until it fits the suite's size caps."""

    def add(self, model: str, layer: str, spec: Spec) -> bool: ...

    def add_scaled(
        self, model: str, layer: str, make: Callable[[int], Spec], size: int, what: str
    ) -> None: ...


# ----------------------------------------------------------------------------- model layers
# Convolution layers as (layer, input size before padding, c_in, c_out, kernel, stride, pad).
ConvLayer = tuple[str, int, int, int, int, int, int]

# Layer tables are data: their rows look alike by nature.
VGG16_CONVS: list[ConvLayer] = [
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

# each network's conv layers, one tuple per layer in the same shape: data, not code
RESNET18_CONVS: list[ConvLayer] = [
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
RESNET50_CONVS: list[ConvLayer] = [
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
MOBILENETV2_STAGES = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def add_conv(
    b: Builder,
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


def add_vgg16(b: Builder) -> None:
    for conv in VGG16_CONVS:
        add_conv(b, "vgg16", conv, bias_relu=True)
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


def add_resnet(b: Builder, model: str, convs: list[ConvLayer], stage_channels: list[int]) -> None:
    for conv in convs:
        # folded batch norm + relu follows every conv but the downsample and the expanding 1x1
        fused = "downsample" not in conv[0] and "conv3" not in conv[0]
        add_conv(b, model, conv, bias_relu=fused)
    b.add(model, "maxpool", PoolSpec("max", 1, 114, 114, 64, 3, 2))
    b.add(model, "avgpool", PoolSpec("avg", 1, 7, 7, stage_channels[-1], 7, 1))
    for stage, (hw, c) in enumerate(zip([56, 28, 14, 7], stage_channels, strict=True), 1):
        shape = (1, hw, hw, c)
        b.add(model, f"layer{stage} residual add", ElementwiseSpec("add", shape))
        b.add(model, f"layer{stage} relu", ElementwiseSpec("relu", shape))
    b.add(model, "fc", MatmulSpec(1, 1000, stage_channels[-1]))
    b.add(model, "fc, batch 32", MatmulSpec(32, 1000, stage_channels[-1]))


def add_mobilenetv2(b: Builder) -> None:
    model = "mobilenetv2"
    add_conv(b, model, ("features.0", 224, 3, 32, 3, 2, 1), bias_relu=True)
    hw, cin = 112, 32
    for stage, (t, cout, n, s) in enumerate(MOBILENETV2_STAGES, 1):
        # later repeats of a block have the shapes of the second one
        for block in range(min(n, 2)):
            stride = s if block == 0 else 1
            hidden = cin * t
            name = f"stage{stage}.block{block}"
            if t != 1:
                expand = (f"{name}.expand", hw, cin, hidden, 1, 1, 0)
                add_conv(b, model, expand, layouts=("nhwc",), bias_relu=True)
            b.add(
                model,
                f"{name}.depthwise",
                DepthwiseSpec(1, hw + 2, hw + 2, hidden, 3, stride),
            )
            hw = (hw - 1) // stride + 1
            add_conv(b, model, (f"{name}.project", hw, hidden, cout, 1, 1, 0), layouts=("nhwc",))
            if block > 0:
                b.add(model, f"{name} residual add", ElementwiseSpec("add", (1, hw, hw, cout)))
            cin = cout
    add_conv(b, model, ("features.18", 7, 320, 1280, 1, 1, 0), bias_relu=True)
    b.add(model, "avgpool", PoolSpec("avg", 1, 7, 7, 1280, 7, 1))
    b.add(model, "classifier", MatmulSpec(1, 1000, 1280))
    b.add(model, "relu6 (as relu) 112x112x96", ElementwiseSpec("relu", (1, 112, 112, 96)))


def add_transformer(
    b: Builder, model: str, hidden: int, heads: int, ffn: int, seqs: list[int]
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


def add_decode(b: Builder, model: str, hidden: int, heads: int, ffn: int, ctx: list[int]) -> None:
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


def add_lqcd(b: Builder) -> None:
    for pattern, pat in LQCD_PATTERNS.items():
        for lattice in _LQCD_LATTICES[len(pat.lattice)]:
            b.add("lqcd", pat.doc, ContractionSpec(pattern, lattice))


# ----------------------------------------------------------------------------- sampled shapes
