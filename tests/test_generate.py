"""Tests of the Linalg program generator and the built-in suite dl-v0."""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
from collections import Counter
from math import erf

import mlir
import numpy as np
import pytest
from mlir import execution_engine, ir, passmanager, runtime

from mlirrl_jax.programs import suites
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
    SoftmaxSpec,
    Spec,
    conv_out,
    flops,
    operand_shapes,
    render,
)
from mlirrl_jax.programs.sampling import AWKWARD_EXTENTS

# Pinned for the published suite dl-v0: if one of these fails, the suite changed. Do not update
# the pins; restore the old programs and publish the change as a new suite version instead.
DL_V0_CONTENT_SHA256 = "415ba978901670eb2c288eed460cabb3edc478cfa95b1ff87364b1997cc4bb7b"
DL_V0_METADATA_SHA256 = "e564c0872b754346e1bfa46650fbd948db3ad6295800c25f9857961e30f8414c"
SHAPES_V0_CONTENT_SHA256 = "c18c07eea923d2139109a9138d39fc83d8d9e5f28febe5fe2fb8fcb177ea1d03"
SHAPES_V1_CONTENT_SHA256 = "a72006a1921865806632b0c7761cb991b6d58c2475440f8e34172ff63a7a59d0"
SHAPES_V2_CONTENT_SHA256 = "b2e6df5589dbaa593434311ff50155a6dc9c6e09ce7145410309409cc82af888"
SHAPES_V3_CONTENT_SHA256 = "1cf6b23e612ccf7a0c5aabab1e08fbeff6e19f34100d49117ac603403bfdc948"

GENERALIZE = "builtin.module(linalg-generalize-named-ops)"
# The sequential lowering of shared/reference/mlir_probe.py (no schedule).
LOWER = (
    "builtin.module(canonicalize,cse,eliminate-empty-tensors,"
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "buffer-deallocation-pipeline,canonicalize,cse,canonicalize,loop-invariant-code-motion,"
    "func.func(convert-linalg-to-loops),convert-vector-to-scf,expand-strided-metadata,"
    "lower-affine,scf-forall-to-for,finalize-memref-to-llvm,convert-scf-to-cf,"
    "convert-vector-to-llvm,finalize-memref-to-llvm,convert-math-to-llvm,convert-arith-to-llvm,"
    "convert-index-to-llvm,convert-ub-to-llvm,convert-arith-to-llvm,convert-func-to-llvm,"
    "convert-cf-to-llvm,reconcile-unrealized-casts)"
)
C_RUNNER_UTILS = os.path.join(list(mlir.__path__)[0], "lib", "libmlir_c_runner_utils.so")
ALLOWED_OPS = {"arith.constant", "tensor.empty", "func.return"}

# One small spec per generator kind (and per variant that renders differently).
KIND_SAMPLES: list[Spec] = [
    MatmulSpec(24, 16, 8),
    BatchMatmulSpec(3, 8, 16, 4),
    Conv2dSpec("nhwc", 2, 11, 10, 3, 5, 3, 2, 2),
    Conv2dSpec("nchw", 2, 11, 10, 3, 5, 3, 2, 2),
    DepthwiseSpec(1, 10, 11, 4, 3, 2, 1),
    PoolSpec("max", 1, 10, 11, 4, 3, 2, 2),
    PoolSpec("sum", 1, 9, 9, 4, 2, 2),
    PoolSpec("avg", 1, 10, 11, 4, 3, 1, 2),
    ElementwiseSpec("add", (3, 4, 5)),
    ElementwiseSpec("relu", (2, 3, 4, 5)),
    ElementwiseSpec("gelu", (64,)),
    *(SoftmaxSpec(part, 5, 7) for part in SOFTMAX_PARTS),
    *(LayerNormSpec(part, 5, 7) for part in LAYERNORM_PARTS),
    ElementwiseChainSpec(("mul", "add", "relu"), (2, 3, 5)),
    ElementwiseChainSpec(("gelu", "mul"), (3, 7)),
    MatmulBiasReluSpec(5, 6, 7),
    ConvBiasReluSpec(1, 9, 9, 3, 4, 3, 2),
    *(ContractionSpec(p, tuple(range(2, 2 + len(v.lattice)))) for p, v in LQCD_PATTERNS.items()),
]


def _func_op(module: ir.Module) -> ir.Operation:
    funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    assert len(funcs) == 1
    return funcs[0]


def _result_shape(text: str) -> list[int]:
    with ir.Context():
        fn = _func_op(ir.Module.parse(text))
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        return list(ir.RankedTensorType(ftype.results[0]).shape)


def _check_program(text: str, name: str) -> None:
    """Parses, checks the program format, generalizes and lowers `text`."""
    with ir.Context():
        module = ir.Module.parse(text)
        fn = _func_op(module)
        assert ir.StringAttr(fn.attributes["sym_name"]).value == name
        assert "sym_visibility" not in fn.attributes
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        assert len(ftype.results) >= 1
        for t in [*ftype.inputs, *ftype.results]:
            tensor = ir.RankedTensorType(t)
            assert tensor.has_static_shape and str(tensor.element_type) == "f32"
        for op in fn.regions[0].blocks[0].operations:
            assert op.operation.name in ALLOWED_OPS or op.operation.name.startswith("linalg.")
        passmanager.PassManager.parse(GENERALIZE).run(module.operation)
        # after generalization every Linalg op, fills included, is a linalg.generic
        for op in _func_op(module).regions[0].blocks[0].operations:
            op = op.operation
            iterators = str(op.attributes["iterator_types"]) if op.name == "linalg.generic" else ""
            if "reduction" not in iterators:
                continue
            n_outs = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))[-1]
            for init in list(op.operands)[-n_outs:]:
                # a reduction must accumulate into a filled tensor, never a bare tensor.empty
                assert getattr(init.owner, "name", None) != "tensor.empty", name
        lowered = ir.Module.parse(text)
        passmanager.PassManager.parse(LOWER).run(lowered.operation)


def _run(spec: Spec, inputs: list[np.ndarray]) -> np.ndarray:
    """JIT-compiles the unscheduled program and runs it on `inputs`."""
    with ir.Context():
        module = ir.Module.parse(render(spec))
        fn = _func_op(module)
        fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        rank = ir.RankedTensorType(ftype.results[0]).rank
        passmanager.PassManager.parse(LOWER).run(module.operation)
        engine = execution_engine.ExecutionEngine(module, opt_level=2, shared_libs=[C_RUNNER_UTILS])
        out = runtime.make_nd_memref_descriptor(rank, ctypes.c_float)()
        args = [
            ctypes.pointer(ctypes.pointer(runtime.get_ranked_memref_descriptor(a))) for a in inputs
        ]
        # a C-interface function returning a memref takes the result descriptor first
        engine.invoke(spec.name, ctypes.pointer(ctypes.pointer(out)), *args)
        return runtime.ranked_memref_to_numpy([out]).copy()


def _windows(x: np.ndarray, k: int, s: int, d: int) -> np.ndarray:
    """All k*k strided, dilated NHWC windows of x, stacked on a new first axis."""
    oh, ow = conv_out(x.shape[1], k, s, d), conv_out(x.shape[2], k, s, d)
    return np.stack(
        [
            x[:, i * d : i * d + s * (oh - 1) + 1 : s, j * d : j * d + s * (ow - 1) + 1 : s, :]
            for i in range(k)
            for j in range(k)
        ]
    )


def _conv_nhwc(x: np.ndarray, w: np.ndarray, s: int, d: int) -> np.ndarray:
    k = w.shape[0]
    return sum(
        np.einsum("nhwc,cf->nhwf", win, w[i // k, i % k])
        for i, win in enumerate(_windows(x, k, s, d))
    )


def _gelu(x: np.ndarray) -> np.ndarray:
    """The exact (erf) GELU."""
    return np.vectorize(lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))))(x)


def _layernorm_reference(part: str, args: list[np.ndarray]) -> np.ndarray:
    x = args[0]
    if part == "mean":
        return x.mean(1)
    if part == "var":
        return ((x - args[1][:, None]) ** 2).mean(1)
    if part == "norm":
        return (x - args[1][:, None]) / np.sqrt(args[2][:, None] + 1e-5)
    mean = x.mean(1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(1, keepdims=True) + 1e-5)


def _reference(spec: Spec, args: list[np.ndarray]) -> np.ndarray:
    """NumPy result of `spec` on `args`."""
    if isinstance(spec, MatmulSpec | BatchMatmulSpec):
        return args[0] @ args[1]
    if isinstance(spec, MatmulBiasReluSpec):
        return np.maximum(args[0] @ args[1] + args[2], 0)
    if isinstance(spec, Conv2dSpec) and spec.layout == "nhwc":
        return _conv_nhwc(args[0], args[1], spec.stride, spec.dilation)
    if isinstance(spec, Conv2dSpec):
        x, w = args[0].transpose(0, 2, 3, 1), args[1].transpose(2, 3, 1, 0)
        return _conv_nhwc(x, w, spec.stride, spec.dilation).transpose(0, 3, 1, 2)
    if isinstance(spec, ConvBiasReluSpec):
        return np.maximum(_conv_nhwc(args[0], args[1], spec.stride, spec.dilation) + args[2], 0)
    if isinstance(spec, DepthwiseSpec):
        wins = _windows(args[0], spec.k, spec.stride, spec.dilation)
        return sum(win * args[1].reshape(-1, spec.c)[i] for i, win in enumerate(wins))
    if isinstance(spec, PoolSpec):
        wins = _windows(args[0], spec.k, spec.stride, spec.dilation)
        return {"max": wins.max(0), "sum": wins.sum(0), "avg": wins.mean(0)}[spec.op]
    if isinstance(spec, ElementwiseSpec) and spec.op == "gelu":
        return _gelu(args[0])
    if isinstance(spec, ElementwiseSpec):
        return args[0] + args[1] if spec.op == "add" else np.maximum(args[0], 0)
    if isinstance(spec, SoftmaxSpec):
        x = args[0]
        if spec.part == "max":
            return x.max(1)
        if spec.part == "sum":
            return x.sum(1)
        if spec.part == "exp":
            return np.exp(x - args[1][:, None])
        if spec.part == "div":
            return x / args[1][:, None]
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    if isinstance(spec, LayerNormSpec):
        return _layernorm_reference(spec.part, args)
    if isinstance(spec, ElementwiseChainSpec):
        value, second_inputs = args[0], iter(args[1:])
        for op in spec.ops:
            if op == "add":
                value = value + next(second_inputs)
            elif op == "mul":
                value = value * next(second_inputs)
            else:
                value = np.maximum(value, 0) if op == "relu" else _gelu(value)
        return value
    if isinstance(spec, ContractionSpec):
        pat = LQCD_PATTERNS[spec.pattern]
        return np.einsum(f"{pat.lhs},{pat.rhs}->{pat.out}", *args)
    raise TypeError(spec)


# ----------------------------------------------------------------------------- generator
@pytest.mark.parametrize("spec", KIND_SAMPLES, ids=lambda s: s.name)
def test_kind_parses_generalizes_and_lowers(spec: Spec) -> None:
    _check_program(render(spec), spec.name)


@pytest.mark.parametrize("spec", KIND_SAMPLES, ids=lambda s: s.name)
def test_kind_computes_its_reference(spec: Spec) -> None:
    with ir.Context():
        fn = _func_op(ir.Module.parse(render(spec)))
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        shapes = [list(ir.RankedTensorType(t).shape) for t in ftype.inputs]
    rng = np.random.default_rng(0)
    args = [rng.random(s, dtype=np.float32) - 0.5 for s in shapes]
    if isinstance(spec, SoftmaxSpec) and spec.part == "div":
        args[1] += 1.0  # keep the divisor away from zero
    if isinstance(spec, LayerNormSpec) and spec.part == "norm":
        args[2] += 1.0  # a variance is not negative
    got = _run(spec, args)
    # gelu is the tanh approximation: within 1e-3 of the exact erf form
    ops = spec.ops if isinstance(spec, ElementwiseChainSpec) else (getattr(spec, "op", None),)
    atol = 1e-3 if "gelu" in ops else 1e-4
    np.testing.assert_allclose(got, _reference(spec, args), rtol=1e-4, atol=atol)


def test_every_kind_has_a_sample() -> None:
    kinds = {s.kind for s in KIND_SAMPLES}
    assert kinds >= {e.kind for e in suites.suite()} | {e.kind for e in suites.suite("shapes-v3")}
    assert {"pool_max", "pool_sum", "pool_avg", "conv2d_nhwc", "conv2d_nchw"} <= kinds


def test_window_output_size_matches_direct_count() -> None:
    for size in range(1, 24):
        for k in range(1, 6):
            for s in range(1, 4):
                for d in range(1, 4):
                    # output positions o whose last tap o*s + d*(k-1) stays inside the input
                    direct = sum(1 for o in range(size) if o * s + d * (k - 1) < size)
                    assert max(conv_out(size, k, s, d), 0) == direct, (size, k, s, d)


@pytest.mark.parametrize(
    "spec",
    [
        Conv2dSpec("nhwc", 1, 58, 58, 64, 128, 3, 2, 1),
        Conv2dSpec("nchw", 1, 230, 229, 3, 64, 7, 2, 1),
        Conv2dSpec("nhwc", 2, 21, 20, 8, 8, 3, 3, 2),
        ConvBiasReluSpec(1, 17, 16, 4, 8, 5, 2, 3),
        DepthwiseSpec(1, 114, 113, 32, 3, 2, 1),
        DepthwiseSpec(1, 30, 31, 16, 5, 1, 3),
        PoolSpec("max", 1, 114, 114, 64, 3, 2),
        PoolSpec("avg", 1, 15, 16, 8, 3, 3, 2),
        PoolSpec("sum", 1, 7, 7, 8, 7, 1),
    ],
    ids=lambda s: s.name,
)
def test_rendered_window_output_shape(spec: Spec) -> None:
    s, d = spec.stride, spec.dilation

    def out(size: int) -> int:
        return sum(1 for o in range(size) if o * s + d * (spec.k - 1) < size)

    oh, ow = out(spec.h), out(spec.w)
    channels = spec.f if isinstance(spec, Conv2dSpec | ConvBiasReluSpec) else spec.c
    nchw = isinstance(spec, Conv2dSpec) and spec.layout == "nchw"
    expected = [spec.n, channels, oh, ow] if nchw else [spec.n, oh, ow, channels]
    assert _result_shape(render(spec)) == expected


def test_window_that_does_not_fit_is_rejected() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        Conv2dSpec("nhwc", 1, 4, 4, 3, 8, 3, 1, 2)
    with pytest.raises(ValueError):
        PoolSpec("min", 1, 8, 8, 3, 2, 2)
    with pytest.raises(ValueError):
        ContractionSpec("su3_mul", (4, 4, 4))


def test_names_and_flops() -> None:
    assert MatmulSpec(256, 256, 256).name == "matmul_m256_n256_k256"
    conv = Conv2dSpec("nhwc", 1, 34, 34, 32, 64, 3)
    assert conv.name == "conv2d_nhwc_n1_h34_w34_c32_f64_k3_s1_d1"
    assert flops(MatmulSpec(256, 256, 256)) == 2 * 256**3
    assert flops(conv) == 2 * 32 * 32 * 64 * 3 * 3 * 32
    assert flops(ContractionSpec("su3_mul", (8, 8))) == 2 * 3 * 3 * 8 * 8 * 3 * 4
    assert render(conv) == render(Conv2dSpec("nhwc", 1, 34, 34, 32, 64, 3))


# ----------------------------------------------------------------------------- suite dl-v0
def test_suite_programs_parse_generalize_and_lower() -> None:
    for entry in suites.suite("dl-v0"):
        _check_program(entry.text, entry.name)


def test_suite_names_unique_and_uris_well_formed() -> None:
    entries = suites.suite()
    assert len({e.name for e in entries}) == len(entries)
    assert all(e.uri == f"suite://dl-v0/{e.name}" for e in entries)
    assert 250 <= len(entries) <= 350


def test_suite_split() -> None:
    entries = suites.suite()
    train, test = suites.split("dl-v0", "train"), suites.split("dl-v0", "test")
    assert len(train) >= 150 and len(train) + len(test) == len(entries)
    held_out = suites.HELD_OUT_MODEL
    assert held_out not in {e.model for e in train}
    assert any(e.model == held_out for e in test)
    for model in {e.model for e in entries} - {held_out}:
        splits = Counter(e.split for e in entries if e.model == model)
        assert splits["train"] > splits["test"], model
    assert any(e.model == "sampled" for e in test)
    assert {e.kind for e in train} == {e.kind for e in entries}


def test_suite_metadata_and_caps() -> None:
    models = {"resnet18", "resnet50", "mobilenetv2", "vgg16", "bert", "gpt2", "lqcd", "sampled"}
    entries = suites.suite()
    assert {e.model for e in entries} == models
    for e in entries:
        assert e.kind == e.spec.kind and e.split in suites.SPLITS and e.layer
        assert e.flops == flops(e.spec) <= suites.MAX_FLOPS
        assert suites.baseline_seconds(e.spec) <= suites.MAX_BASELINE_S
    scaled = [e for e in entries if "scaled" in e.layer]
    assert scaled and all(e.model in models - {"sampled", "lqcd"} for e in scaled)


def test_suite_is_pinned() -> None:
    assert suites.content_hash("dl-v0") == DL_V0_CONTENT_SHA256
    meta = "".join(f"{e.uri} {e.kind} {e.model} {e.split}\n" for e in suites.suite())
    assert hashlib.sha256(meta.encode()).hexdigest() == DL_V0_METADATA_SHA256


def test_shapes_suite_is_pinned_and_disjoint_from_dl_v0() -> None:
    assert suites.content_hash("shapes-v0") == SHAPES_V0_CONTENT_SHA256
    shapes = suites.suite("shapes-v0")
    assert len(shapes) == 450 and {e.model for e in shapes} == {"sampled"}
    assert not {e.name for e in shapes} & {e.name for e in suites.suite("dl-v0")}
    assert all(e.uri.startswith("suite://shapes-v0/") for e in shapes)
    assert all(suites.get(e.uri) is e for e in shapes[:20])
    # wider than dl-v0: channel counts dl-v0 never samples
    assert max(e.spec.c for e in shapes if e.kind.startswith("conv2d")) > 256


def test_network_shapes_suite_is_pinned_and_disjoint() -> None:
    assert suites.content_hash("shapes-v1") == SHAPES_V1_CONTENT_SHA256
    shapes = suites.suite("shapes-v1")
    assert len(shapes) == 650 and {e.model for e in shapes} == {"sampled"}
    earlier = {e.name for name in ("dl-v0", "shapes-v0") for e in suites.suite(name)}
    assert not {e.name for e in shapes} & earlier
    assert all(e.uri.startswith("suite://shapes-v1/") for e in shapes)
    # network grids: conv widths are powers of two or their 0.75x / 1.5x variants
    widths = {e.spec.c for e in shapes if e.kind.startswith("conv2d")}
    assert widths <= {
        int(b * m) for b in (16, 32, 64, 128, 256, 512, 1024, 2048) for m in (1, 1.5, 0.75)
    }
    assert all(suites.baseline_seconds(e.spec) <= suites.MAX_BASELINE_S for e in shapes)


def test_cnn_stage_shapes_suite_is_pinned_and_disjoint() -> None:
    assert suites.content_hash("shapes-v2") == SHAPES_V2_CONTENT_SHA256
    shapes = suites.suite("shapes-v2")
    assert len(shapes) == 1540 and {e.model for e in shapes} == {"sampled"}
    earlier = {e.name for name in ("dl-v0", "shapes-v0", "shapes-v1") for e in suites.suite(name)}
    assert not {e.name for e in shapes} & earlier
    assert all(e.uri.startswith("suite://shapes-v2/") for e in shapes)
    # CNN-stage windows: 1x1 or 3x3, stride 1 or 2, never dilated
    convs = [e.spec for e in shapes if e.kind.startswith("conv2d") or e.kind == "conv_bias_relu"]
    assert len(convs) == 800
    assert {(c.k, c.stride, c.dilation) for c in convs} == {
        (k, s, 1) for k in (1, 3) for s in (1, 2)
    }
    assert all(suites.baseline_seconds(e.spec) <= suites.MAX_BASELINE_S for e in shapes)


def test_awkward_shapes_suite_is_pinned_disjoint_and_covers_what_users_bring() -> None:
    assert suites.content_hash("shapes-v3") == SHAPES_V3_CONTENT_SHA256
    shapes = suites.suite("shapes-v3")
    assert len(shapes) == 1440 and {e.model for e in shapes} == {"sampled"}
    assert len(suites.split("shapes-v3", "train")) == 1227
    others = {
        e.name for name in suites.list_suites() if name != "shapes-v3" for e in suites.suite(name)
    }
    assert not {e.name for e in shapes} & others
    assert all(e.uri.startswith("suite://shapes-v3/") for e in shapes)
    kinds = {e.kind for e in shapes}
    assert {"elementwise_chain", "layernorm", "softmax", "pool_avg", "batch_matmul"} <= kinds
    assert {f"layernorm_{part}" for part in ("mean", "var", "norm")} <= kinds
    # windows strided and dilated at once, in both layouts, fused and depthwise too
    both = {
        e.kind
        for e in shapes
        if hasattr(e.spec, "dilation") and min(e.spec.stride, e.spec.dilation) > 1
    }
    assert {"conv2d_nchw", "conv2d_nhwc", "conv_bias_relu", "depthwise"} <= both
    assert max(e.spec.stride for e in shapes if e.kind.startswith("conv2d")) == 4
    assert max(e.spec.dilation for e in shapes if e.kind.startswith("conv2d")) == 6
    pools = [e.spec for e in shapes if e.kind.startswith("pool")]
    assert {p.layout for p in pools} == {"nhwc", "nchw"} and any(p.k == p.h for p in pools)
    extents = {d for e in shapes for shape in operand_shapes(e.spec)[0] for d in shape}
    assert set(AWKWARD_EXTENTS) <= extents
    assert all(suites.baseline_seconds(e.spec) <= suites.MAX_BASELINE_S for e in shapes)


def test_the_suites_train_on_3000_programs_and_shapes_v3_holds_no_test_program() -> None:
    train = {e.name for name in suites.list_suites() for e in suites.split(name, "train")}
    assert len(train) >= 3000
    # awkward-v0 is all test: its programs are among the held-out ones
    held_out = {
        e.name
        for name in suites.list_suites()
        if name != "shapes-v3"
        for e in suites.split(name, "test")
    }
    assert {e.name for e in suites.suite("awkward-v0")} <= held_out
    assert not {e.name for e in suites.suite("shapes-v3")} & held_out


def test_get_and_errors() -> None:
    entry = suites.suite()[0]
    assert suites.get(entry.uri) is entry
    assert suites.list_suites() == [
        "dl-v0",
        "shapes-v0",
        "shapes-v1",
        "shapes-v2",
        "awkward-v0",
        "models-v0",
        "shapes-v3",
    ]
    with pytest.raises(suites.UnknownProgramError) as err:
        suites.get(entry.uri + "0")
    assert isinstance(err.value, KeyError)
    assert entry.uri + "0" in str(err.value) and entry.uri in str(err.value)
    with pytest.raises(KeyError, match="unknown program URI"):
        suites.get("suite://dl-v9/nothing")
    with pytest.raises(ValueError, match="unknown suite"):
        suites.suite("dl-v9")
    with pytest.raises(ValueError, match="split must be"):
        suites.split("dl-v0", "validation")


def test_the_awkward_suite_covers_its_extents_and_kinds_at_two_batch_sizes() -> None:
    from mlirrl_jax.programs.ir import parse_program

    entries = suites.suite("awkward-v0")
    assert all(e.split == "test" for e in entries)
    kinds = {e.kind for e in entries}
    assert {"matmul", "conv2d_nhwc", "conv2d_nchw", "depthwise", "pool_max", "add", "relu"} <= kinds
    extents = set()
    for e in entries:
        program = parse_program(e.text, e.uri)
        extents |= {loop.extent for op in program.ops for loop in op.loops}
    assert {7, 13, 14, 26, 27, 28, 54, 56, 112, 147} <= extents
    for kind in kinds - {"matmul"}:  # batch 1 and batch 32
        batches = {
            e.spec.shape[0] if hasattr(e.spec, "shape") else e.spec.n
            for e in entries
            if e.kind == kind
        }
        assert {1, 32} <= batches, (kind, batches)
