"""MLIR text -> Program: loops, access matrices, graph, and clear refusals."""

import pytest

from mlirrl_jax.programs.ir import ProgramError, load_program, parse_program
from tests.conftest import CONV, MATMUL


def test_matmul_structure(matmul):
    fill, mm = matmul.ops
    assert fill.kind == "fill" and mm.kind == "matmul"
    assert mm.extents == (64, 96, 128)
    assert [lp.iterator for lp in mm.loops] == ["parallel", "parallel", "reduction"]
    a, b, c = mm.operands
    assert a.access == ((1, 0, 0), (0, 0, 1)) and a.source == ("arg", 0)
    assert b.access == ((0, 0, 1), (0, 1, 0)) and b.source == ("arg", 1)
    assert c.is_output and c.source == ("op", (0, 0))
    assert mm.arith_counts == {"mul": 1, "add": 1}
    assert matmul.edges == [(0, 1, 2)]
    assert matmul.returns == [("op", (1, 0))]
    assert mm.flops == 2 * 64 * 96 * 128


def test_strided_conv_access_matrix():
    text = CONV.replace("strides = dense<1>", "strides = dense<2>").replace(
        "1x16x16x32", "1x8x8x32"
    )
    conv = parse_program(text, "conv_s2").ops[1]
    assert conv.extents == (1, 8, 8, 32, 3, 3, 16)
    image = conv.operands[0]
    assert image.access[1] == (0, 2, 0, 0, 1, 0, 0)  # oh * 2 + kh
    assert image.access[2] == (0, 0, 2, 0, 0, 1, 0)


def test_chain_graph(mm_bias_relu):
    assert [op.kind for op in mm_bias_relu.ops] == ["fill", "matmul", "elementwise"]
    assert mm_bias_relu.producers(2) == [1]
    assert mm_bias_relu.consumers(0) == [1]
    bias = mm_bias_relu.ops[2].operands[1]
    assert bias.access == ((0, 1),) and bias.source == ("arg", 2)
    assert mm_bias_relu.ops[2].arith_counts == {"add": 1, "max": 1}


def test_hash_ignores_function_name():
    assert (
        parse_program(MATMUL, "a").hash == parse_program(MATMUL.replace("@matmul", "@other")).hash
    )
    assert parse_program(MATMUL).hash != parse_program(CONV).hash


def test_load_from_file(tmp_path):
    path = tmp_path / "mine.mlir"
    path.write_text(MATMUL)
    program = load_program(path)
    assert program.name == "mine" and len(program.ops) == 2


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32>",
            "does not parse",
        ),
        (
            "func.func @f(%a: tensor<?xf32>) -> tensor<?xf32> {\n"
            "  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],"
            ' iterator_types = ["parallel"]} ins(%a : tensor<?xf32>) outs(%a : tensor<?xf32>) {\n'
            "  ^bb0(%x: f32, %o: f32):\n    linalg.yield %x : f32\n  } -> tensor<?xf32>\n"
            "  return %r : tensor<?xf32>\n}",
            "dynamic shape",
        ),
        (
            "func.func @f(%a: tensor<4x8xf32>) -> tensor<32xf32> {\n"
            "  %c = tensor.collapse_shape %a [[0, 1]] : tensor<4x8xf32> into tensor<32xf32>\n"
            "  return %c : tensor<32xf32>\n}",
            "tensor.collapse_shape is not supported",
        ),
        (
            "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }",
            "no Linalg op",
        ),
        (MATMUL + MATMUL.replace("@matmul", "@again"), "exactly one public func.func"),
        (
            MATMUL.replace(
                "%init = linalg.fill ins(%zero : f32) outs(%e : tensor<64x96xf32>)"
                " -> tensor<64x96xf32>",
                "%init = tensor.empty() : tensor<64x96xf32>",
            ),
            "uninitialised",
        ),
    ],
)
def test_bad_input_is_refused_with_a_reason(text, words):
    with pytest.raises(ProgramError, match=words):
        parse_program(text, "bad")


def test_missing_file_and_unknown_source(tmp_path):
    with pytest.raises(ProgramError, match="no such file"):
        load_program(tmp_path / "absent.mlir")
    with pytest.raises(ProgramError, match="cannot read program"):
        load_program("not a program")


def test_normalized_kernel_parses_back_to_the_same_program(mm_bias_relu):
    again = parse_program(mm_bias_relu.mlir, "again")
    assert again.hash == mm_bias_relu.hash
    assert again.inputs == mm_bias_relu.inputs and again.outputs == mm_bias_relu.outputs
    assert again.edges == mm_bias_relu.edges and again.returns == mm_bias_relu.returns
