"""XLA and NumPy baselines: JAX translations match the reference; measurements are records."""

import numpy as np
import pytest

from mlirrl_jax.measure.baselines import measure_numpy, measure_xla
from mlirrl_jax.measure.reference import compare, evaluate, random_inputs, tolerance
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.measure.to_jax import jax_function
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import parse_program

QUICK = TimingMethod(min_repeats=3, min_time_s=0.01)

SPECS = [
    g.MatmulSpec(16, 24, 32),
    g.BatchMatmulSpec(2, 8, 12, 16),
    g.Conv2dSpec("nhwc", 1, 11, 11, 4, 8, 3, stride=2),
    g.Conv2dSpec("nchw", 1, 12, 12, 4, 8, 3, dilation=2),
    g.DepthwiseSpec(1, 12, 12, 8, 3, stride=2),
    g.PoolSpec("max", 1, 9, 9, 8, 3, stride=2),
    g.PoolSpec("avg", 1, 9, 9, 8, 2, stride=1, dilation=2),
    g.ElementwiseSpec("add", (8, 16)),
    g.ElementwiseSpec("relu", (1, 6, 6, 8)),
    g.ElementwiseSpec("gelu", (8, 16)),
    g.MatmulBiasReluSpec(16, 32, 24),
    g.ConvBiasReluSpec(1, 10, 10, 4, 8, 3, stride=2),
    g.SoftmaxSpec("full", 8, 32),
    g.LayerNormSpec("full", 8, 32),
    g.ElementwiseChainSpec(("mul", "add", "relu"), (4, 8)),
    g.ContractionSpec("su3_mul", (2, 2)),
    g.ContractionSpec("gamma_apply", (2, 2, 2)),
]

# out[j, i] = A[2i + 1, j] * b[i] + 1 and out2[j] = max over i of A[i, j]: a strided, offset,
# transposed read, a broadcast, and a max reduction, returned together
STRIDED_TRANSPOSED_MAX = """
#strided = affine_map<(i, j) -> (2 * i + 1, j)>
#row = affine_map<(i, j) -> (i)>
#transposed = affine_map<(i, j) -> (j, i)>
#plain = affine_map<(i, j) -> (i, j)>
#column = affine_map<(i, j) -> (j)>
func.func @mixed(%A: tensor<9x6xf32>, %b: tensor<4xf32>) -> (tensor<6x4xf32>, tensor<6xf32>) {
  %one = arith.constant 1.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %e = tensor.empty() : tensor<6x4xf32>
  %r = linalg.generic {indexing_maps = [#strided, #row, #transposed],
                       iterator_types = ["parallel", "parallel"]}
       ins(%A, %b : tensor<9x6xf32>, tensor<4xf32>) outs(%e : tensor<6x4xf32>) {
  ^bb0(%a: f32, %x: f32, %o: f32):
    %p = arith.mulf %a, %x : f32
    %s = arith.addf %p, %one : f32
    linalg.yield %s : f32
  } -> tensor<6x4xf32>
  %e2 = tensor.empty() : tensor<6xf32>
  %init = linalg.fill ins(%ninf : f32) outs(%e2 : tensor<6xf32>) -> tensor<6xf32>
  %m = linalg.generic {indexing_maps = [#plain, #column],
                       iterator_types = ["reduction", "parallel"]}
       ins(%A : tensor<9x6xf32>) outs(%init : tensor<6xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %y = arith.maximumf %acc, %a : f32
    linalg.yield %y : f32
  } -> tensor<6xf32>
  return %r, %m : tensor<6x4xf32>, tensor<6xf32>
}
"""

# acc = acc / 2 + x: a reduction that is no combine(acc, f(x)), so no jnp reduction computes it
DECAYING_SUM = """
#in = affine_map<(i, k) -> (i, k)>
#out = affine_map<(i, k) -> (i)>
func.func @decay(%X: tensor<4x8xf32>) -> tensor<4xf32> {
  %zero = arith.constant 0.0 : f32
  %half = arith.constant 0.5 : f32
  %e = tensor.empty() : tensor<4xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %r = linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "reduction"]}
       ins(%X : tensor<4x8xf32>) outs(%init : tensor<4xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %d = arith.mulf %acc, %half : f32
    %s = arith.addf %d, %x : f32
    linalg.yield %s : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


def _program(spec):
    return parse_program(g.render(spec), spec.name)


def _check_against_reference(program):
    function = jax_function(program)
    assert function is not None, f"{program.name} has no JAX translation"
    inputs = random_inputs(program, seed=3)
    outputs = function(*inputs)
    references = evaluate(program, inputs)
    assert len(outputs) == len(references) == len(program.outputs)
    for output, reference, t in zip(outputs, references, program.outputs):
        assert output.shape == t.shape and str(output.dtype) == "float32"
        matches, error = compare(np.asarray(output), reference, tolerance(program))
        assert matches, f"{program.name}: error {error:.3g}"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_translation_matches_the_reference(spec):
    _check_against_reference(_program(spec))


def test_strided_transposed_reads_and_several_results_match_the_reference():
    _check_against_reference(parse_program(STRIDED_TRANSPOSED_MAX, "mixed"))


def test_a_reduction_without_a_combiner_has_no_translation():
    program = parse_program(DECAYING_SUM, "decay")
    assert evaluate(program, random_inputs(program, 0))[0].shape == (4,)  # the reference has one
    assert jax_function(program) is None
    assert measure_xla(program, threads=1, method=QUICK) is None


def test_xla_measurement_is_verified_and_reuses_the_output_buffer(matmul):
    m = measure_xla(matmul, threads=1, method=QUICK)
    assert m.status == "ok" and m.verified, m.error
    assert m.median_s > 0 and m.min_s <= m.median_s and m.repeats >= 3
    assert m.max_error <= m.tolerance and m.gflops > 0
    assert m.threads == 1 and m.runtime == "xla" and m.schedule == {"baseline": "xla"}
    baseline = m.fingerprint["baseline"]
    assert baseline["cores"] and len(baseline["cores"]) == 1
    assert baseline["output_buffer_reused"]
    assert baseline["nproc"] == "1"  # the size of XLA's intra-op thread pool


def test_numpy_measurement_of_a_matmul_and_none_for_other_programs(matmul, conv):
    m = measure_numpy(matmul, threads=1, method=QUICK)
    assert m.status == "ok" and m.verified and m.median_s > 0, m.error
    assert all(pool["num_threads"] == 1 for pool in m.fingerprint["baseline"]["blas"])
    assert measure_numpy(conv, threads=1, method=QUICK) is None


@pytest.mark.parametrize(
    "fault, timeout_s, status, words",
    [
        (None, 0.01, "timeout", "no result within"),  # the child cannot even start in 10 ms
        ("crash", 60, "crash", "SIGABRT"),
        ("wrong_output", 60, "wrong_output", "differs from the reference"),
    ],
)
def test_faults_in_the_child_become_records(matmul, fault, timeout_s, status, words):
    # the crash and the wrong output are injected on purpose (a test-only request flag)
    m = measure_xla(matmul, threads=1, method=QUICK, timeout_s=timeout_s, inject_fault=fault)
    assert m.status == status and words in m.error
    assert m.median_s is None and not m.verified
