"""Whole models: imported from PyTorch and ONNX with the real torch-mlir, cut into programs that
the real pipeline compiles, and replayed against the model's own output on the same input."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch_mlir", reason="the models extra: pip install '.[models]'")
torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from mlirrl_jax.models.cut import ModelError, cut_module  # noqa: E402
from mlirrl_jax.models.execute import replay  # noqa: E402
from mlirrl_jax.models.importer import ModelImport, import_model  # noqa: E402
from mlirrl_jax.programs.ir import load_program  # noqa: E402

ZOO = Path(__file__).parent.parent / "examples" / "models" / "zoo.py"
pytestmark = pytest.mark.measures  # every import compiles and runs the cut programs


def _model_file(tmp_path: Path, body: str, name: str = "net") -> str:
    """A Python file with a factory `make` returning the module `body` defines as `Net`."""
    path = tmp_path / f"{name}.py"
    path.write_text("import torch\nfrom torch import nn\n\n" + textwrap.dedent(body))
    return f"{path}:make"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlirrl_jax.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_a_small_pytorch_model_imports_into_programs_that_compute_it(tmp_path):
    """Conv, bias, ReLU, linear: every layer a program `load_program` takes, and the programs
    compiled and replayed in the model's order give PyTorch's own output."""
    out = tmp_path / "small"
    result = _cli("import-model", f"{ZOO}:small_net", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "agrees with the model's own output" in result.stdout
    imported = ModelImport.load(out)
    assert imported.check_ok and imported.check_error < 1e-5
    assert all(layer.status == "program" for layer in imported.layers)
    kinds = {kind for layer in imported.layers for kind in layer.ops}
    assert {"conv_2d_nchw_fchw", "matmul"} <= kinds
    for layer in imported.layers:  # each program on its own, as a user's file
        program = load_program(out / layer.path)
        assert program.ops and program.flops >= 0
    assert imported.left_out == {"tensor.pad": 1}  # the convolution's padding, named
    assert "tensor.pad" in (out / "report.md").read_text()


STRIDED = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.down = nn.Conv2d(8, 16, 1, stride=2)

    def forward(self, x):
        return self.down(torch.relu(self.bn(self.stem(x))))


def make():
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 1.5)
    return net
"""


def test_strided_convolutions_are_cut_as_a_gather_and_a_contraction(tmp_path, runner):
    """A stride-2 convolution becomes a gather (im2col) and a contraction inside its layer's
    program; the cut still computes the model, the same layer as it was is kept for XLA, the
    heuristic's schedule of it (the gather left unvectorized) verifies, and so does XLA's
    translation of the gather. `--strided-conv direct` keeps the convolutions."""
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.measure.baselines import measure_xla
    from mlirrl_jax.transform import vectorizable

    source = _model_file(tmp_path, STRIDED)
    out = tmp_path / "gathered"
    result = import_model(source, out, input_shape=[1, 3, 32, 32], say=lambda *_: None)
    assert result.check_ok and result.gathered == 2 and result.strided == "im2col"
    gathered = [layer for layer in result.layers if "gather" in layer.ops]
    assert len(gathered) == 2
    assert not any("conv_2d_nchw_fchw" in layer.ops for layer in result.layers)
    assert "cut as a gather (im2col)" in (out / "report.md").read_text()
    for layer in gathered:
        program = load_program(out / layer.path)
        direct = load_program(out / layer.direct_path)
        assert [op.name for op in direct.ops if "conv" in op.name] == ["linalg.conv_2d_nchw_fchw"]
        assert program.flops >= direct.flops  # the same multiply-adds, and the copy
        (gather,) = [op for op in program.ops if not vectorizable(op)]  # only the gather
        assert gather.name == "linalg.generic" and len(gather.loops) == 6
        schedule = heuristic_schedule(program, 1)
        assert all(t.kind != "vectorize" for t in schedule.transforms_of(gather.id)), (
            schedule.describe()
        )
        m = runner.measure(program, schedule, threads=1)
        assert m.ok and m.verified, m.summary()
        xla = measure_xla(program, 1)
        assert xla is not None and xla.ok and xla.verified, xla.summary()
    plain = import_model(
        source, tmp_path / "direct", [1, 3, 32, 32], strided="direct", say=lambda *_: None
    )
    assert plain.check_ok and plain.gathered == 0
    assert sum("conv_2d_nchw_fchw" in layer.ops for layer in plain.layers) == 2
    with pytest.raises(ModelError, match="strided convolutions as 'sideways'"):
        import_model(source, tmp_path / "bad", [1, 3, 32, 32], strided="sideways")


def test_the_check_catches_a_program_that_computes_something_else(tmp_path):
    """The replay is a real check: a layer whose program is changed no longer gives the
    model's output."""
    out = tmp_path / "small"
    import_model(f"{ZOO}:small_net", out, say=lambda *_: None)
    plan = json.loads((out / "steps.json").read_text())
    weights = dict(np.load(out / "weights.npz"))
    example, expected = np.load(out / "input.npy"), np.load(out / "output.npy")
    from mlirrl_jax.measure.reference import evaluate

    programs = {}

    def run(name, operands, scale=1.0):
        if name not in programs:
            programs[name] = load_program(out / "layers" / f"{name}.mlir", name)
        outputs = evaluate(programs[name], operands)
        return [o.astype(np.float32) * (scale if "matmul" in name else 1.0) for o in outputs]

    (good,) = replay(plan["steps"], {plan["inputs"][0]: example}, weights, plan["outputs"], run)
    np.testing.assert_allclose(good, expected, rtol=1e-4, atol=1e-5)
    (bad,) = replay(
        plan["steps"],
        {plan["inputs"][0]: example},
        weights,
        plan["outputs"],
        lambda n, o: run(n, o, scale=1.01),
    )
    assert np.abs(bad - expected).max() > 1e-3


def _onnx_model(path: Path) -> None:
    """Conv (with bias), ReLU, flatten, Gemm: built with onnx.helper, random weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    fc = numpy_helper.from_array(rng.standard_normal((5, 4 * 6 * 6)).astype(np.float32), "fc")
    fb = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "fb")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        initializer=[w, b, fc, fb],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_a_small_onnx_model_imports_into_programs_that_compute_it(tmp_path):
    path = tmp_path / "small.onnx"
    _onnx_model(path)
    imported = import_model(str(path), tmp_path / "onnx", say=lambda *_: None)
    assert imported.input_shape == [1, 2, 6, 6]  # the model's own
    assert imported.check_ok, imported.check_error
    kinds = {kind for layer in imported.layers for kind in layer.ops}
    assert any(k.startswith("conv_2d") for k in kinds) and "matmul" in kinds


def test_an_op_the_project_cannot_take_is_named(tmp_path):
    """A sort lowers to torch-mlir's own `tm_tensor.sort`, not Linalg: the import keeps the
    rest, names the op in its report and says that the cut cannot be checked because of it."""
    source = _model_file(
        tmp_path,
        """
        class Net(nn.Module):
            def forward(self, x):
                return torch.relu(torch.sort(x, dim=-1).values)

        def make():
            return Net()
        """,
    )
    result = _cli("import-model", source, "--out", str(tmp_path / "sort"), "--input-shape", "4,16")
    assert result.returncode == 1, result.stderr  # imported, but not checked
    assert "tm_tensor.sort" in result.stdout
    imported = ModelImport.load(tmp_path / "sort")
    assert imported.left_out == {"tm_tensor.sort": 1}
    assert not imported.check_ok and "tm_tensor.sort" in imported.check_note
    assert "tm_tensor.sort" in (tmp_path / "sort" / "report.md").read_text()


def test_an_op_torch_mlir_cannot_lower_is_named(tmp_path):
    source = _model_file(
        tmp_path,
        """
        class Net(nn.Module):
            def forward(self, x):
                return torch.linalg.inv(x)

        def make():
            return Net()
        """,
    )
    with pytest.raises(ModelError, match="the lowering failed: .*with_effects"):
        import_model(source, tmp_path / "inv", input_shape=[4, 4], say=lambda *_: None)
    assert not (tmp_path / "inv" / "model.json").exists()


def test_a_model_beyond_the_environments_limits_is_cut_not_refused(tmp_path):
    """Twelve linear layers (far more ops than one program may hold) and a nine-dimensional
    element-wise layer (more loops than an op may have): every layer is kept; the one beyond
    the limits is marked unscheduled, with the limit named, and still computes its part."""
    source = _model_file(
        tmp_path,
        """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.Sequential(*[nn.Linear(16, 16) for _ in range(12)])

            def forward(self, x):
                y = torch.relu(self.layers(x)).reshape(1, 2, 1, 2, 1, 2, 1, 2, 2)
                return torch.tanh(y) * 2.0

        def make():
            torch.manual_seed(0)
            return Net()
        """,
    )
    imported = import_model(source, tmp_path / "deep", input_shape=[2, 16], say=lambda *_: None)
    assert imported.check_ok, imported.check_error
    assert imported.occurrences >= 12
    statuses = {layer.status for layer in imported.layers}
    assert statuses <= {"program", "unscheduled"} and "unscheduled" in statuses
    beyond = [layer for layer in imported.layers if layer.status == "unscheduled"]
    assert all("beyond the environment" in layer.reason for layer in beyond)
    linear = [layer for layer in imported.layers if "matmul" in layer.ops]
    assert sum(layer.count for layer in linear) == 12 and len(linear) < 12  # one shape, counted


def test_a_bad_source_is_refused_by_name(tmp_path):
    with pytest.raises(ModelError, match="no such file"):
        import_model(str(tmp_path / "none.py") + ":make", tmp_path / "x")
    with pytest.raises(ModelError, match="FILE.py:FACTORY"):
        import_model("resnet18", tmp_path / "x")
    with pytest.raises(ModelError, match="does not parse"):
        cut_module("func.func @f(")


@pytest.mark.trains
def test_optimize_model_composes_the_layers_and_resumes(tmp_path):
    """The small model optimized at one thread: composed times per method, PyTorch eager beside
    them, the search on the heaviest layer, the best schedules replayed against the model; a
    rerun measures nothing again."""
    model, out = tmp_path / "small", tmp_path / "opt"
    import_model(f"{ZOO}:small_net", model, say=lambda *_: None)
    args = ["optimize-model", str(model), "--out", str(out), "--budget", "1"]
    args += ["--run", "data/agent", "--no-compile", "--no-xla", "--search-top", "1"]
    args += ["--search-budget", "2"]
    result = _cli(*args)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    composed = summary["composed_ms"]["1"]
    assert composed["agent"] > 0 and composed["unscheduled"] >= composed["agent"] * 0.5
    assert summary["torch_ms"]["1"]["eager"] > 0
    assert summary["replay_error"]["1"] < 1e-4
    assert (out / "time_by_layer.png").stat().st_size > 1000
    assert "PyTorch eager" in (out / "table.md").read_text()
    rows = (out / "layers.jsonl").read_text()
    searched = [json.loads(line) for line in rows.splitlines() if json.loads(line)["searched"]]
    assert len(searched) == 1  # the heaviest layer, in a row after its first
    assert searched[0]["tuned_ms"] <= searched[0]["agent_ms"]
    assert len(rows.splitlines()) == len(ModelImport.load(model).layers) + 1
    (out / "summary.json").unlink()
    again = _cli(*args)
    assert again.returncode == 0, again.stderr
    assert (out / "layers.jsonl").read_text() == rows  # resumed: nothing measured twice
    assert (out / "summary.json").is_file()
