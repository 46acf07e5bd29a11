"""The models-v0 suite: imported models' layers as versioned train programs (no PyTorch needed)."""

import pytest

from mlirrl_jax import splits
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.analysis import decomposable, window_loops
from mlirrl_jax.programs.ir import load_program

# the published suite: a change to its programs needs a new version (models-v1)
MODELS_V0_CONTENT_SHA256 = "03ce3b733f901cb69c0a4bd1a61bd771e01bcd8ab0145a95f3c3d5f7d453e4d6"


def test_models_v0_is_pinned_and_holds_the_three_models():
    assert suites.content_hash("models-v0") == MODELS_V0_CONTENT_SHA256
    entries = suites.suite("models-v0")
    assert {e.model for e in entries} == {"resnet18", "mobilenetv2", "bert"}
    assert len({e.uri for e in entries}) == len(entries) == 125
    kinds = " ".join(e.uri for e in entries)
    for op in ("conv_2d_nchw_fchw", "depthwise_conv_2d_nchw_chw", "batch_matmul", "matmul"):
        assert op in kinds


def test_models_v0_programs_load_fit_the_environment_and_stay_out_of_test():
    entries = suites.suite("models-v0")
    programs = [load_program(e.uri) for e in entries]
    encode_programs(programs)  # every one within the environment's tables
    assert all(splits.split_of(e.uri) == splits.TRAIN for e in entries)
    test_hashes = {
        load_program(e.uri).hash
        for name in suites.list_suites()
        if name != "models-v0"
        for e in suites.split(name, "test")
    }
    assert not test_hashes & {p.hash for p in programs}
    resnet_stem = next(e for e in entries if e.model == "resnet18")
    assert resnet_stem.flops == 238_436_352 and "x1 in the model" in resnet_stem.layer


@pytest.mark.measures
def test_model_layers_with_rank_0_inputs_and_depthwise_nchw_windows_measure(runner):
    """A ReLU6's bounds come as rank-0 tensors; a depthwise NCHW convolution has no 1-D form
    to decompose to, so the heuristic tiles it without vectorizing. Both verify and time."""
    clamp = load_program("suite://models-v0/mobilenetv2_002_generic+generic+generic_57bbb6560283")
    assert any(t.shape == () for t in clamp.inputs)
    depthwise = load_program(
        "suite://models-v0/mobilenetv2_003_depthwise_conv_2d_nchw_chw+generic+generic+generic_74975926d039"
    )
    (window,) = [op for op in depthwise.ops if op.name == "linalg.depthwise_conv_2d_nchw_chw"]
    assert window_loops(window) and not decomposable(window)
    for program in (clamp, depthwise):
        for threads in (1, 2):
            m = runner.measure(program, heuristic_schedule(program, threads), threads=threads)
            assert m.ok and m.verified, m.summary()
    assert "decompose" not in heuristic_schedule(depthwise, 1).describe()
