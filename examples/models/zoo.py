"""Models to import, in plain PyTorch: `mlirrl-jax import-model examples/models/zoo.py:resnet18`.

ResNet-18 and MobileNetV2 follow torchvision's definitions layer for layer (the same shapes,
strides and channel counts; random weights), so that no torchvision install is needed;
`bert_layer` is one BERT-base encoder layer (hidden 768, 12 heads, feed-forward 3072) at a
sequence of 128 tokens. Each factory returns a module in eval mode; batch-norm layers use their
running statistics, as in inference. The tiny models at the end each show one case the import
must handle: a layer beyond the environment's tables, an op that is not Linalg, a size that
depends on the data.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.down is None else self.down(x)
        return torch.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int = 1, relu: bool = True):
    layers = [
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if relu:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv_bn(cin, hidden, 1, 1)]
        layers += [
            _conv_bn(hidden, hidden, 3, stride, groups=hidden),
            _conv_bn(hidden, cout, 1, 1, relu=False),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion, channels, repeats, first stride), as in the paper and torchvision
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1)]
    SETTINGS += [(6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, cin = [_conv_bn(3, 32, 3, 2)], 32
        for expand, cout, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(_conv_bn(cin, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class EncoderLayer(nn.Module):
    """A BERT encoder layer: self-attention, add & norm, feed-forward (GELU), add & norm."""

    def __init__(self, hidden: int = 768, heads: int = 12, ff: int = 3072):
        super().__init__()
        self.heads, self.head = heads, hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.ff1, self.ff2 = nn.Linear(hidden, ff), nn.Linear(ff, hidden)

    def _split(self, x):
        batch, tokens, _ = x.shape
        return x.reshape(batch, tokens, self.heads, self.head).transpose(1, 2)

    def forward(self, x):
        batch, tokens, hidden = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.transpose(1, 2).reshape(batch, tokens, hidden)
        x = self.norm1(x + self.out(context))
        return self.norm2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class SmallNet(nn.Module):
    """Conv, bias, ReLU, linear: the smallest model with each kind of layer the tests need."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 1, 1)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


class Conv3dNet(nn.Module):
    """A 3-D convolution with bias and ReLU: the convolution's nine loops are beyond the
    environment's tables, so the cut splits it from its ReLU."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, 1, 1)

    def forward(self, x):
        return torch.relu(self.conv(x))


class SortNet(nn.Module):
    """Each row sorted, then a linear layer: the sort lowers to torch-mlir's own
    `tm_tensor.sort`, not to Linalg."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(torch.sort(x, dim=-1).values)


class NonzeroNet(nn.Module):
    """The positive entries' positions: `torch.nonzero`'s result has a size computed from the
    data."""

    def forward(self, x):
        return torch.nonzero(x > 0).sum()


def _eval(model: nn.Module, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    for module in model.modules():  # non-trivial batch-norm statistics, fixed by the seed
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    return model.eval()


def resnet18() -> nn.Module:
    """ResNet-18 (input 1x3x224x224)."""
    torch.manual_seed(0)
    return _eval(ResNet18())


def mobilenet_v2() -> nn.Module:
    """MobileNetV2 (input 1x3x224x224)."""
    torch.manual_seed(0)
    return _eval(MobileNetV2())


def bert_layer() -> nn.Module:
    """One BERT-base encoder layer (input 1x128x768)."""
    torch.manual_seed(0)
    return _eval(EncoderLayer())


def small_net() -> nn.Module:
    """A convolution with bias, ReLU and a linear layer (input 1x3x8x8)."""
    torch.manual_seed(0)
    return _eval(SmallNet())


def conv3d_net() -> nn.Module:
    """A 3-D convolution with bias and ReLU (input 1x2x4x8x8)."""
    torch.manual_seed(0)
    return _eval(Conv3dNet())


def sort_net() -> nn.Module:
    """A sort and a linear layer (input 2x16)."""
    torch.manual_seed(0)
    return _eval(SortNet())


def nonzero_net() -> nn.Module:
    """`torch.nonzero` (input 4x4)."""
    return _eval(NonzeroNet())


# the example input shape of each factory, read by `import-model` when none is given
INPUT_SHAPES = {
    "resnet18": (1, 3, 224, 224),
    "mobilenet_v2": (1, 3, 224, 224),
    "bert_layer": (1, 128, 768),
    "small_net": (1, 3, 8, 8),
    "conv3d_net": (1, 2, 4, 8, 8),
    "sort_net": (2, 16),
    "nonzero_net": (4, 4),
}
