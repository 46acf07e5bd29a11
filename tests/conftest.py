"""Shared fixtures: small real programs and one measurement runner per test session."""

import os
import tempfile
from unittest import mock

import pytest

# XLA compiles the suite's computations without its slow optimizations: each test runs them
# a few times, so compiling is most of their cost (about 30% less suite time per test that
# trains or predicts); the subprocesses the tests start inherit it. Nothing the suite checks
# depends on how fast a computation runs.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# reference outputs the tests compute go to a folder of this session, not the user's cache
os.environ.setdefault("MLIRRL_REFERENCE_CACHE", tempfile.mkdtemp(prefix="mlirrl-test-reference-"))
# and stores and adapted agents the commands write by default, to one of its own
os.environ["MLIRRL_HOME"] = tempfile.mkdtemp(prefix="mlirrl-test-home-")

from mlirrl_jax.measure import profile
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import parse_program
from mlirrl_jax.shipped import user_cache_dir

# but this machine's profile stays in the user's cache folder: it is measured once per
# machine, on a quiet machine, not once per session
with mock.patch.dict(os.environ, {"MLIRRL_HOME": ""}):
    user_profiles = user_cache_dir() / "machine"
os.environ.setdefault(profile.CACHE_ENV, str(user_profiles))

MATMUL = """
func.func @matmul(%A: tensor<64x128xf32>, %B: tensor<128x96xf32>) -> tensor<64x96xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x96xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<64x96xf32>) -> tensor<64x96xf32>
  %r = linalg.matmul ins(%A, %B : tensor<64x128xf32>, tensor<128x96xf32>)
                     outs(%init : tensor<64x96xf32>) -> tensor<64x96xf32>
  return %r : tensor<64x96xf32>
}
"""

MATMUL_BIAS_RELU = """
#id = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (j)>
func.func @mm_bias_relu(%A: tensor<64x64xf32>, %B: tensor<64x128xf32>, %bias: tensor<128xf32>)
    -> tensor<64x128xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x128xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<64x128xf32>) -> tensor<64x128xf32>
  %mm = linalg.matmul ins(%A, %B : tensor<64x64xf32>, tensor<64x128xf32>)
                      outs(%init : tensor<64x128xf32>) -> tensor<64x128xf32>
  %e2 = tensor.empty() : tensor<64x128xf32>
  %r = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
       ins(%mm, %bias : tensor<64x128xf32>, tensor<128xf32>) outs(%e2 : tensor<64x128xf32>) {
  ^bb0(%x: f32, %b: f32, %o: f32):
    %s = arith.addf %x, %b : f32
    %m = arith.maximumf %s, %zero : f32
    linalg.yield %m : f32
  } -> tensor<64x128xf32>
  return %r : tensor<64x128xf32>
}
"""

CONV = """
func.func @conv(%I: tensor<1x18x18x16xf32>, %W: tensor<3x3x16x32xf32>) -> tensor<1x16x16x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x16x16x32xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<1x16x16x32xf32>) -> tensor<1x16x16x32xf32>
  %r = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
       ins(%I, %W : tensor<1x18x18x16xf32>, tensor<3x3x16x32xf32>)
       outs(%init : tensor<1x16x16x32xf32>) -> tensor<1x16x16x32xf32>
  return %r : tensor<1x16x16x32xf32>
}
"""


# one small program of every kind of op the environment schedules (multi-op ones included)
KERNEL_SPECS = [
    g.MatmulSpec(64, 96, 128),
    g.MatmulBiasReluSpec(32, 64, 48),
    g.ConvBiasReluSpec(1, 10, 10, 8, 16, 3),
    g.Conv2dSpec("nchw", 1, 11, 11, 8, 16, 3, stride=2),
    g.DepthwiseSpec(1, 14, 14, 32, 3),
    g.PoolSpec("avg", 1, 9, 9, 16, 3, stride=2),
    g.SoftmaxSpec("full", 16, 64),
    g.ContractionSpec("su3_mul", (4, 8)),
    g.ContractionSpec("spin_color_trace", (4, 4, 4, 4)),
    g.BatchMatmulSpec(2, 16, 32, 24),
]


@pytest.fixture(scope="session")
def kernel_programs():
    return [parse_program(g.render(s), s.name) for s in KERNEL_SPECS]


@pytest.fixture(scope="session")
def kernel_table(kernel_programs):
    from mlirrl_jax.env.table import encode_programs

    return encode_programs(kernel_programs)


@pytest.fixture(scope="session")
def matmul():
    return parse_program(MATMUL, "matmul")


@pytest.fixture(scope="session")
def mm_bias_relu():
    return parse_program(MATMUL_BIAS_RELU, "mm_bias_relu")


@pytest.fixture(scope="session")
def conv():
    return parse_program(CONV, "conv")


@pytest.fixture(scope="session")
def runner():
    with Runner(timeout_s=60) as r:
        yield r


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """One XLA compilation cache for the session and the processes its tests start: a
    computation compiled once (the training iteration, say) is loaded, not compiled, again."""
    from mlirrl_jax.host_devices import use_compilation_cache

    folder = use_compilation_cache(tmp_path_factory.mktemp("xla-cache"))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    yield folder


# `make test-fast` leaves out what times kernels or trains (`-m "not measures and not
# trains and not slow"`): a test that takes the session's measurement worker measures; the
# modules below as a whole measure or train (their fixtures do), and single tests elsewhere
# say so with their own marker (`test_agent.py`'s training tests do; its logic runs fast)
MEASURING_FIXTURES = {"runner"}
MODULE_MARKS = {
    "test_cost_model.py": "trains",
    "test_machine_features.py": "trains",
    "test_regrounding.py": "trains",
    "test_collect.py": "measures",
    "test_fuzz.py": "measures",
    "test_runner.py": "measures",
    "test_search.py": "measures",
    "test_validation.py": "measures",
    "test_xla.py": "measures",
}


# the modules whose fixtures take longest, first: `-n 2 --dist loadscope` hands each worker a
# whole module in collection order, so a long one started last would leave the other worker
# idle while it runs (the suite's time is the later worker's)
LONGEST_FIRST = (
    "test_regrounding.py",
    "test_models.py",
    "test_agent.py",
    "test_validation.py",
    "test_search.py",
    "test_cost_model.py",
    "test_collect.py",
    "test_cli.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: else as found
    for item in items:
        if MEASURING_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.measures)
        mark = MODULE_MARKS.get(item.path.name)
        if mark:
            item.add_marker(getattr(pytest.mark, mark))
