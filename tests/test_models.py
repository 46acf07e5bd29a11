"""Whole models: imported from PyTorch and ONNX with the real torch-mlir, cut into programs that
the real pipeline compiles, and replayed against the model's own output on the same input."""

import json
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch_mlir", reason="the models extra: pip install '.[models]'")
torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from mlirrl_jax.models.cut import ModelError, cut_module  # noqa: E402
from mlirrl_jax.models.execute import replay  # noqa: E402
from mlirrl_jax.models.importer import ModelImport, import_model  # noqa: E402
from mlirrl_jax.models.optimize import ModelOptimizeError, optimize_model  # noqa: E402
from mlirrl_jax.models.report import compose  # noqa: E402
from mlirrl_jax.models.rows import LayerRow  # noqa: E402
from mlirrl_jax.models.steps import steps_of  # noqa: E402
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


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The zoo's small model imported once by the command line: its folder (not to be changed)
    and the command's result."""
    out = tmp_path_factory.mktemp("small") / "import"
    return out, _cli("import-model", f"{ZOO}:small_net", "--out", str(out))


SORTED = """
class Net(nn.Module):
    def forward(self, x):
        return torch.relu(torch.sort(x, dim=-1).values)

def make():
    return Net()
"""


@pytest.fixture(scope="module")
def sorted_import(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A sort (torch-mlir's own `tm_tensor.sort`, no Linalg op) and a ReLU on nine dimensions
    (beyond the environment's tables), imported once by the command line."""
    folder = tmp_path_factory.mktemp("sorted")
    out = folder / "import"
    shape = "1,2,1,2,1,2,1,2,4"
    return out, _cli(
        "import-model", _model_file(folder, SORTED), "--out", str(out), "--input-shape", shape
    )


@pytest.fixture(scope="module")
def forced(sorted_import, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`optimize-model --force` on the sorted import, whose check could not run (no layer is
    one the agent takes: nothing is proposed, each layer is timed unscheduled)."""
    out = tmp_path_factory.mktemp("forced") / "opt"
    args = ["optimize-model", str(sorted_import[0]), "--out", str(out), "--run", "data/agent"]
    return out, _cli(*args, "--no-torch", "--no-xla", "--force")


def test_a_small_pytorch_model_imports_into_programs_that_compute_it(small):
    """Conv, bias, ReLU, linear: every layer a program `load_program` takes, and the programs
    compiled and replayed in the model's order give PyTorch's own output."""
    out, result = small
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
    from mlirrl_jax.programs.analysis import vectorizable

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


def test_the_check_catches_a_program_that_computes_something_else(small):
    """The replay is a real check: a layer whose program is changed no longer gives the
    model's output."""
    out = small[0]
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

    (good,) = replay(steps_of(plan), {plan["inputs"][0]: example}, weights, plan["outputs"], run)
    np.testing.assert_allclose(good, expected, rtol=1e-4, atol=1e-5)
    (bad,) = replay(
        steps_of(plan),
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


def test_an_op_the_project_cannot_take_is_named(sorted_import):
    """A sort lowers to torch-mlir's own `tm_tensor.sort`, not Linalg: the import keeps the
    rest, names the op in its report and says that the cut cannot be checked because of it."""
    out, result = sorted_import
    assert result.returncode == 1, result.stderr  # imported, but not checked
    assert "tm_tensor.sort" in result.stdout
    imported = ModelImport.load(out)
    assert imported.left_out == {"tm_tensor.sort": 1}
    assert not imported.check_ok and "tm_tensor.sort" in imported.check_note
    assert "tm_tensor.sort" in (out / "report.md").read_text()


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


DEEP = """
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
"""


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> tuple[ModelImport, Path]:
    """Twelve linear layers and a nine-dimensional tail (tanh, then a product), imported once."""
    folder = tmp_path_factory.mktemp("deep")
    out = folder / "import"
    return import_model(_model_file(folder, DEEP), out, [2, 16], say=lambda *_: None), out


def test_a_model_beyond_the_environments_limits_is_cut_not_refused(deep):
    """Twelve linear layers (far more ops than one program may hold) and a nine-dimensional
    element-wise layer (more loops than an op may have): every layer is kept; the one beyond
    the limits is marked unscheduled, with the limit named, and still computes its part."""
    imported = deep[0]
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
def test_optimize_model_composes_the_layers_and_resumes_only_the_same_import(small, tmp_path):
    """The small model optimized at one thread: composed times per method, PyTorch eager beside
    them, the search on the heaviest layer, the best schedules replayed against the model; a
    rerun measures nothing again. The model imported again, cut otherwise, replaces the old
    import whole, and a rerun then refuses to compose the new cut with the old one's rows,
    naming both imports' hashes."""
    model, out = tmp_path / "small", tmp_path / "opt"
    shutil.copytree(small[0], model)
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
    # the search starts from the layer's measurements: none of its schedules measured twice
    path = out / "measurements" / "1" / f"{searched[0]['layer']}.jsonl"
    hashes = [json.loads(line)["schedule_hash"] for line in path.read_text().splitlines()]
    assert len(hashes) == len(set(hashes)) == searched[0]["measured"]
    assert len(rows.splitlines()) == len(ModelImport.load(model).layers) + 1
    (out / "summary.json").unlink()
    again = _cli(*args)
    assert again.returncode == 0, again.stderr
    assert (out / "layers.jsonl").read_text() == rows  # resumed: nothing measured twice
    assert (out / "summary.json").is_file()
    old = ModelImport.load(model).cut_hash
    new = import_model(f"{ZOO}:small_net", model, max_group=1, replace=True, say=lambda *_: None)
    assert new.cut_hash != old
    assert {p.name for p in (model / "layers").iterdir()} == {
        Path(layer.path).name for layer in new.layers
    }
    refused = _cli(*args)
    assert refused.returncode == 2
    assert f"another import (cut {old})" in refused.stderr
    assert f"holds cut {new.cut_hash}" in refused.stderr
    assert (out / "layers.jsonl").read_text() == rows


def test_an_import_into_a_folder_holding_one_is_refused_unless_replaced(small, tmp_path):
    """An import is never rewritten in part: a folder holding one is refused (it stays as it
    was), and `replace` removes only an import, never a folder of other files."""
    folder = tmp_path / "small"
    shutil.copytree(small[0], folder)
    with pytest.raises(ModelError, match="already holds an import: pass --replace"):
        import_model(f"{ZOO}:small_net", folder, max_group=1)
    assert ModelImport.load(folder).cut_hash == ModelImport.load(small[0]).cut_hash
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ModelError, match="holds files that are not an import"):
        import_model(f"{ZOO}:small_net", other, replace=True)
    assert (other / "notes.txt").read_text() == "mine"


def test_an_import_whose_files_changed_is_refused_naming_both_hashes(small, tmp_path):
    folder = tmp_path / "small"
    shutil.copytree(small[0], folder)
    recorded = ModelImport.load(folder)
    assert json.loads((folder / "model.json").read_text())["cut_hash"] == recorded.cut_hash
    layer = folder / recorded.layers[-1].path
    layer.write_text(layer.read_text() + "\n")
    with pytest.raises(ModelError, match=rf"cut [0-9a-f]{{16}}, imported as {recorded.cut_hash}"):
        ModelImport.load(folder)


def test_each_layer_computation_is_composed_exactly_once_as_the_replay_runs_it(deep):
    """A group beyond the environment's tables (the tanh and the product) is cut into layers
    of their own and is no layer itself: each layer's count is the number of steps that run
    it, so the composed time is the sum over the computations the replay really runs."""
    from mlirrl_jax.measure.reference import evaluate

    imported, out = deep
    plan = json.loads((out / "steps.json").read_text())
    runs = Counter(step["layer"] for step in plan["steps"] if step["kind"] == "layer")
    assert {layer.name: layer.count for layer in imported.layers} == runs
    times = {layer.name: 2.0**i for i, layer in enumerate(imported.layers)}  # distinct sums
    rows = [
        LayerRow(layer.name, 1, layer.count, layer.flops, unscheduled_ms=times[layer.name])
        for layer in imported.layers
    ]
    composed, _ = compose([row.to_json() for row in rows])
    ran = []

    def run(name, operands):
        ran.append(name)
        program = load_program(out / "layers" / f"{name}.mlir", name)
        return [o.astype(np.float32) for o in evaluate(program, operands)]

    weights = dict(np.load(out / "weights.npz"))
    example = {plan["inputs"][0]: np.load(out / "input.npy")}
    (output,) = replay(steps_of(plan), example, weights, plan["outputs"], run)
    np.testing.assert_allclose(output, np.load(out / "output.npy"), rtol=1e-4, atol=1e-5)
    assert composed["unscheduled"] == sum(times[name] for name in ran)


def test_an_import_whose_check_could_not_run_is_optimized_only_with_force(sorted_import, tmp_path):
    with pytest.raises(ModelOptimizeError, match=r"could not be checked .*tm_tensor.sort.*--force"):
        optimize_model(sorted_import[0], tmp_path / "opt", run="data/agent")
    assert not (tmp_path / "opt").exists()


def test_a_forced_run_warns_in_every_report(forced):
    out, result = forced
    assert result.returncode == 0, result.stderr
    warning = json.loads((out / "summary.json").read_text())["warning"]
    assert warning.startswith("WARNING: the import's cut could not be checked")
    assert "tm_tensor.sort" in warning and "--force" in warning
    assert f"**{warning}**" in (out / "table.md").read_text()
    assert warning in result.stderr  # the log
    assert warning in result.stdout  # the table's head, printed


def test_an_op_the_replay_cannot_compute_is_left_out_named_and_the_run_ends(forced):
    """The sort is left out of the composed time, as the import said, and named there; the
    best schedules' replay cannot run past it, which the table says instead of failing."""
    out, result = forced
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["leaves_out"][0].startswith("the ops in no layer (tm_tensor.sort x1")
    assert summary["composed_ms"]["1"]["unscheduled"] > 0
    assert summary["replay_error"] == {} and "tm_tensor.sort" in summary["replay_note"]
    table = (out / "table.md").read_text()
    assert "| could not run |" in table
    assert "could not be replayed through the model" in table and "tm_tensor.sort x1" in table


def test_a_layer_beyond_the_agent_shows_no_scheduled_time_and_why(forced, sorted_import):
    out, _ = forced
    table = (out / "table.md").read_text()
    layers = ModelImport.load(sorted_import[0]).layers
    assert layers and all(layer.status == "unscheduled" for layer in layers)  # nine loops
    for layer in layers:
        row = next(line for line in table.splitlines() if line.startswith(f"| {layer.name} |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[3] != "-" and cells[4:7] == ["-", "-", "-"]  # unscheduled; no schedule
        assert f"- {layer.name}: {layer.reason}" in table


def test_optimize_model_without_torch_says_so_before_measuring(small, tmp_path):
    """The PyTorch baselines need torch: without it (fault injection: torch made unimportable
    in the child, as where the models extra is not installed), one line says so, and what to
    do, before anything is measured."""
    blocked = 'import sys; sys.modules["torch"] = None; from mlirrl_jax.cli import main; '
    blocked += "sys.exit(main(sys.argv[1:]))"
    out = tmp_path / "opt"
    args = ["optimize-model", str(small[0]), "--out", str(out), "--run", "data/agent"]
    done = subprocess.run(
        [sys.executable, "-c", blocked, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: timing PyTorch eager and torch.compile needs torch: ")
    assert "--no-torch" in last and "Traceback" not in done.stderr
    assert not out.exists()


def test_an_input_shape_that_contradicts_an_onnx_models_own_is_refused(tmp_path):
    path = tmp_path / "small.onnx"
    _onnx_model(path)
    for given in ([1, 2, 7, 7], [2, 6, 6]):
        shape = "x".join(map(str, given))
        with pytest.raises(ModelError, match=f"{shape} contradicts the model's input 1x2x6x6"):
            import_model(str(path), tmp_path / "out", input_shape=given)
    assert not (tmp_path / "out").exists()


def test_a_file_that_holds_no_onnx_model_is_refused_by_name(tmp_path):
    empty, garbage = tmp_path / "empty.onnx", tmp_path / "garbage.onnx"
    empty.write_bytes(b"")
    garbage.write_bytes(b"\xff" * 64)
    with pytest.raises(ModelError, match=r"empty\.onnx: not an ONNX model .*the file is empty"):
        import_model(str(empty), tmp_path / "out")
    with pytest.raises(ModelError, match=r"garbage\.onnx: not an ONNX model"):
        import_model(str(garbage), tmp_path / "out")


def test_a_size_computed_from_the_data_is_refused_in_one_line():
    """`torch.nonzero` lowers to a scalar read from a tensor, which sizes the next tensor: the
    cut names the op and the value it cannot take."""
    text = """
    func.func @forward(%arg0: tensor<4xi64>) -> tensor<?xi64> {
      %c0 = arith.constant 0 : index
      %n = tensor.extract %arg0[%c0] : tensor<4xi64>
      %i = arith.index_cast %n : i64 to index
      %s = tensor.extract_slice %arg0[0] [%i] [1] : tensor<4xi64> to tensor<?xi64>
      return %s : tensor<?xi64>
    }
    """
    with pytest.raises(ModelError, match=r"^tensor.extract gives %\w+ of type i64: only tensors"):
        cut_module(text, strided="direct")


def test_an_input_shape_with_a_missing_size_is_refused_by_name(capsys):
    from mlirrl_jax.cli import build_parser

    for text in ("1,,32", "1,32,"):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(
                ["import-model", "m.onnx", "--out", "x", "--input-shape", text]
            )
        assert exited.value.code == 2
        assert f"{text!r}: a size is missing" in capsys.readouterr().err
