"""Probes of `import-model` and `optimize-model` (`probes.py` runs them): each case reproduces a
reported defect's recipe through real `mlirrl-jax` processes, on the tiny models of
`examples/models/zoo.py`. `optimize-model` runs without the PyTorch and XLA baselines
(`--no-torch --no-xla`) where the case is not about them: they take time and change nothing
the case looks at."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO = "examples/models/zoo.py"
TIMEOUT_S = 300
QUICK = ["--budget", "1", "--no-torch", "--no-xla"]  # for cases not about the baselines


def cli(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    """A real `mlirrl-jax` process from the repository's root, and the command as typed."""
    done = subprocess.run(
        [sys.executable, "-m", "mlirrl_jax.cli", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return done, shlex.join(["mlirrl-jax", *map(str, args)])


def said(done: subprocess.CompletedProcess, *needles: str) -> str:
    """The exit status and the last line of its output (or of the lines holding `needles`)."""
    lines = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line.strip()]
    telling = [line for line in lines if any(n in line for n in needles)] if needles else []
    return f"exit {done.returncode}: {(telling or lines or [''])[-1].strip()[:300]}"


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> bool:
    """Exit 2 with one `error:` line holding every needle, and no traceback."""
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return (
        done.returncode == 2
        and last.startswith("error: ")
        and all(n in last for n in needles)
        and "Traceback" not in done.stderr
    )


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def stale_cut_refused(out: Path) -> dict:
    """1: an import replaced under a run of optimize-model, which is then resumed."""
    model, opt = out / "R", out / "O"
    first, c1 = cli("import-model", f"{ZOO}:small_net", "--out", model, "--max-group", "1")
    optimize = ["optimize-model", model, "--out", opt, "--budget", "2", "--threads", "1"]
    optimize += ["--no-torch", "--no-xla"]
    ran, c2 = cli(*optimize)
    again, c3 = cli("import-model", f"{ZOO}:small_net", "--out", model)
    replaced, c4 = cli("import-model", f"{ZOO}:small_net", "--out", model, "--replace")
    resumed, c5 = cli(*optimize)
    old, new = _json(opt / "settings.json").get("cut_hash"), _json(model / "model.json")
    layers = {Path(layer["path"]).name for layer in new.get("layers", [])}
    files = {p.name for p in (model / "layers").glob("*")} if model.is_dir() else set()
    held = (
        first.returncode == 0
        and ran.returncode == 0
        and one_line_error(again, "already holds an import", "--replace")
        and replaced.returncode == 0
        and files == layers
        and old is not None
        and old != new.get("cut_hash")
        and one_line_error(resumed, old, str(new.get("cut_hash")))
    )
    return {
        "command": "; ".join([c1, c2, c3, c4, c5]),
        "expected": "a re-import into an import's folder is refused unless --replace, which "
        "replaces it whole; the resumed optimize-model refuses the other cut, naming both hashes",
        "got": f"re-import {said(again)}; --replace exit {replaced.returncode}, "
        f"{len(files)} layer files for {len(layers)} layers; resume {said(resumed)}",
        "held": held,
    }


def split_layer_counted_once(out: Path) -> dict:
    """3: a Conv3d whose fused layer is beyond the environment's tables, optimized."""
    model, opt = out / "C", out / "O"
    imported, c1 = cli("import-model", f"{ZOO}:conv3d_net", "--out", model)
    ran, c2 = cli("optimize-model", model, "--out", opt, *QUICK)
    layers = {
        layer["name"]: layer["count"] for layer in _json(model / "model.json").get("layers", [])
    }
    steps = _json(model / "steps.json").get("steps", [])
    runs = Counter(step["layer"] for step in steps if step["kind"] == "layer")
    rows = {}
    if (opt / "layers.jsonl").is_file():
        for line in (opt / "layers.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows[row["layer"]] = row["unscheduled_ms"]
    composed = _json(opt / "summary.json").get("composed_ms", {}).get("1", {}).get("unscheduled")
    replayed = sum(rows.get(name, float("nan")) for name in runs.elements())
    held = (
        imported.returncode == 0
        and ran.returncode == 0
        and layers == dict(runs)
        and composed is not None
        and abs(composed - replayed) <= 1e-9 * max(1.0, replayed)
    )
    return {
        "command": f"{c1}; {c2}",
        "expected": "each layer's count is the number of steps that run it, and the composed "
        "unscheduled time is the sum over the computations the model's replay runs",
        "got": f"exit {imported.returncode}, {ran.returncode}; layers {layers} against steps "
        f"{dict(runs)}; composed {composed} ms against the steps' {replayed:.6f} ms",
        "held": held,
    }


def _onnx_model(path: Path) -> None:
    """Conv, ReLU, flatten, Gemm on a fixed 1x2x6x6 input, random weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((5, 4 * 6 * 6)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        initializer=[w, fc],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def failed_check_not_optimized(out: Path) -> dict:
    """4: a shape that contradicts a static ONNX input; a folder whose check could not run."""
    onnx_path = out / "small.onnx"
    _onnx_model(onnx_path)
    shape, c1 = cli("import-model", onnx_path, "--out", out / "X", "--input-shape", "1,2,7,7")
    model, opt = out / "S", out / "O"
    imported, c2 = cli("import-model", f"{ZOO}:sort_net", "--out", model)
    refused, c3 = cli("optimize-model", model, "--out", opt, *QUICK)
    forced, c4 = cli("optimize-model", model, "--out", opt, *QUICK, "--force")
    warning = _json(opt / "summary.json").get("warning") or ""
    table = (opt / "table.md").read_text() if (opt / "table.md").is_file() else ""
    held = (
        one_line_error(shape, "1x2x7x7", "1x2x6x6")
        and not (out / "X").exists()
        and imported.returncode == 1
        and one_line_error(refused, "could not be checked", "--force")
        and forced.returncode == 0
        and warning.startswith("WARNING")
        and f"**{warning}**" in table
        and warning in forced.stderr
    )
    return {
        "command": "; ".join([c1, c2, c3, c4]),
        "expected": "the contradicting shape is refused naming both shapes; a folder whose check "
        "could not run is refused unless --force, and then table.md, summary.json and the log "
        "carry a warning",
        "got": f"shape {said(shape)}; without --force {said(refused)}; with --force exit "
        f"{forced.returncode}, warning: {warning[:120]!r}",
        "held": held,
    }


def left_out_op_composed_without(out: Path) -> dict:
    """8: a model with torch.sort, which the replay cannot compute, optimized to the end."""
    model, opt = out / "S", out / "O"
    imported, c1 = cli("import-model", f"{ZOO}:sort_net", "--out", model)
    ran, c2 = cli("optimize-model", model, "--out", opt, *QUICK, "--force")
    summary = _json(opt / "summary.json")
    table = (opt / "table.md").read_text() if (opt / "table.md").is_file() else ""
    named = any("tm_tensor.sort" in line for line in summary.get("leaves_out", []))
    held = (
        imported.returncode == 1  # imported; its check could not run past the sort
        and ran.returncode == 0
        and named
        and summary.get("composed_ms", {}).get("1", {}).get("agent", 0) > 0
        and "tm_tensor.sort" in (summary.get("replay_note") or "")
        and "| could not run |" in table
    )
    return {
        "command": f"{c1}; {c2}",
        "expected": "the model is composed without the sort, which is named in what the "
        "composed time leaves out, and the table says the replay of the schedules could not run",
        "got": f"{said(ran, 'could not be replayed', 'error')}; leaves out "
        f"{summary.get('leaves_out', ['-'])[0]!r}; replay note {summary.get('replay_note')!r}",
        "held": held,
    }


def nonzero_named(out: Path) -> dict:
    """9a: a module using torch.nonzero."""
    done, command = cli("import-model", f"{ZOO}:nonzero_net", "--out", out / "N")
    return {
        "command": command,
        "expected": "one line naming the op and value the cut cannot take, no traceback",
        "got": said(done),
        "held": one_line_error(done, "tensor.extract", "fixed shape") and not (out / "N").exists(),
    }


def empty_onnx_named(out: Path) -> dict:
    """9c: an empty .onnx file."""
    path = out / "empty.onnx"
    path.write_bytes(b"")
    done, command = cli("import-model", path, "--out", out / "E")
    return {
        "command": f"touch {path}; {command}",
        "expected": "one line naming the file and that it holds no ONNX model",
        "got": said(done),
        "held": one_line_error(done, str(path), "not an ONNX model", "empty"),
    }


def empty_size_refused(out: Path) -> dict:
    """13c: --input-shape 1,,32."""
    done, command = cli(
        "import-model", f"{ZOO}:small_net", "--out", out / "M", "--input-shape", "1,,32"
    )
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return {
        "command": command,
        "expected": "refused (exit 2), naming the shape and its missing size",
        "got": said(done),
        "held": done.returncode == 2 and "'1,,32': a size is missing" in last,
    }


def unscheduled_rows_say_why(out: Path) -> dict:
    """13d: optimize-model's table for a layer beyond the environment's tables."""
    model, opt = out / "C", out / "O"
    imported, c1 = cli("import-model", f"{ZOO}:conv3d_net", "--out", model)
    ran, c2 = cli("optimize-model", model, "--out", opt, *QUICK)
    beyond = [
        layer
        for layer in _json(model / "model.json").get("layers", [])
        if layer["status"] == "unscheduled"
    ]
    table = (opt / "table.md").read_text() if (opt / "table.md").is_file() else ""
    rows = []
    for layer in beyond:
        row = next((line for line in table.splitlines() if f"| {layer['name']} |" in line), "")
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        shown = len(cells) > 6 and cells[4:7] == ["-", "-", "-"]
        rows.append(shown and f"- {layer['name']}: {layer['reason']}" in table)
    return {
        "command": f"{c1}; {c2}",
        "expected": "the layer beyond the tables shows '-' for the heuristic, the agent and the "
        "search, and the table names why it is unscheduled",
        "got": f"exit {imported.returncode}, {ran.returncode}; {len(beyond)} unscheduled "
        f"layer(s); shown with '-' and the reason: {rows}",
        "held": imported.returncode == 0 and ran.returncode == 0 and bool(rows) and all(rows),
    }


def missing_torch_said(out: Path) -> dict:
    """13e: optimize-model where torch cannot be imported (fault injection: the child's
    `sys.modules["torch"] = None`, as without the models extra)."""
    model = out / "M"
    imported, c1 = cli("import-model", f"{ZOO}:small_net", "--out", model)
    blocked = 'import sys; sys.modules["torch"] = None; from mlirrl_jax.cli import main; '
    blocked += "sys.exit(main(sys.argv[1:]))"
    args = ["optimize-model", str(model), "--out", str(out / "O")]
    done = subprocess.run(
        [sys.executable, "-c", blocked, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return {
        "command": f"{c1}; {shlex.join(['python', '-c', blocked, *args])}",
        "expected": "one line up front: the PyTorch baselines need torch, what to install, or "
        "--no-torch; nothing measured",
        "got": said(done),
        "held": imported.returncode == 0
        and one_line_error(done, "needs torch", "--no-torch")
        and not (out / "O").exists(),
    }


CASES = [
    ("1", "a resumed optimize-model composes a stale cut", stale_cut_refused),
    ("3", "a split layer is counted twice", split_layer_counted_once),
    ("4", "a model whose cut does not compute the model is optimized", failed_check_not_optimized),
    ("8", "optimize-model cannot finish with a left-out op", left_out_op_composed_without),
    ("9a", "torch.nonzero gives a traceback", nonzero_named),
    ("9c", "an empty .onnx gives an IndexError", empty_onnx_named),
    ("13c", "--input-shape 1,,32 is accepted", empty_size_refused),
    ("13d", "refused layers show scheduled times, no reason", unscheduled_rows_say_why),
    ("13e", "optimize-model does not say torch is missing", missing_torch_said),
]
