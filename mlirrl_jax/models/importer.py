"""`import_model`: a PyTorch or ONNX model, lowered to Linalg and cut into programs.

The source is a Python file and a factory (`zoo.py:resnet18`), a torchvision model
(`torchvision:resnet18`, random weights) or an ONNX file (`model.onnx`). torch-mlir lowers it in
a child process (`models.lower`), `models.cut` cuts the Linalg-on-tensors text into programs,
and the cut is checked: its programs, compiled unscheduled and replayed in the model's order
(`models.execute`), must give the model's own output on the same input. The import's folder:

- `model.json`: the source, the input shape, the layers (each distinct shape once, with its
  count, status and reason), the ops left out and the check's result (`ModelImport`);
- `layers/NAME.mlir`: one program per distinct layer shape, which `load_program` accepts;
- `steps.json`: the model as steps over the layers, for the replay;
- `lowered.mlir`, `weights.npz`, `input.npy`, `output.npy`: what the lowering gave;
- `report.md`: the layers as a table, and what was left out and why.

Everything is written before `model.json`, which is written last: a folder holding it is whole.
An import is identified by a hash of its cut (`cut_hash`: the steps and the layers' programs),
recorded in `model.json` and checked whenever the folder is loaded. An import goes into a folder
of its own: one holding an import is refused, or with `replace` emptied first, never rewritten
in part.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlirrl_jax.models.cut import MAX_GROUP, MOVES, Layer, ModelError, cut_module
from mlirrl_jax.models.rewrite import STRIDED_FORMS, default_min_row
from mlirrl_jax.models.steps import steps_of
from mlirrl_jax.records import Record
from mlirrl_jax.runfolder import LOCK, clear_folder, write_atomic

LOWER_TIMEOUT_S = 900.0
CHECK_RTOL = 1e-3  # the replay against the model's own output, relative to its largest value
WHY_LEFT_OUT = {
    name: "data movement between layers: left out of the composed time" for name in MOVES
}


@dataclass
class ModelImport(Record):
    """What `import_model` wrote (`model.json`)."""

    source: str
    input_shape: list[int]
    layers: list[Layer] = field(default_factory=list)
    left_out: dict[str, int] = field(default_factory=dict)  # op -> count, not in any layer
    why_left_out: dict[str, str] = field(default_factory=dict)
    views: int = 0  # reshapes and casts: no cost
    dropped_asserts: int = 0
    strided: str = "direct"  # how strided convolutions were cut (`models.rewrite`)
    gathered: int = 0  # strided convolutions cut as a gather and a contraction
    min_row: int | None = None  # the narrowest output row gathered (this machine's half vector)
    occurrences: int = 0  # layer computations in the model, counts included
    check_error: float | None = None  # the replay's largest relative difference
    check_ok: bool | None = None  # None: not checked
    check_note: str | None = None  # why the replay could not run
    lower_s: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    cut_hash: str | None = None  # the import's identity (`cut_hash`)

    _NESTED = {"layers": Layer}

    @classmethod
    def load(cls, folder: str | os.PathLike) -> ModelImport:
        """The import in `folder`, refused where its files are not those it recorded."""
        path = Path(folder) / "model.json"
        if not path.is_file():
            raise ModelError(f"{folder}: no imported model (model.json) here; run import-model")
        imported = cls.from_json(json.loads(path.read_text()))
        found = cut_hash(folder, imported.layers)
        if imported.cut_hash not in (None, found):
            raise ModelError(
                f"{folder}: its steps or layers changed after the import (cut {found}, imported "
                f"as {imported.cut_hash}): import the model again"
            )
        imported.cut_hash = found  # an import written before hashes were recorded
        return imported


def cut_hash(folder: str | os.PathLike, layers: list[Layer]) -> str:
    """A hash of an import's cut: its steps and its layers' programs (direct forms included)."""
    folder = Path(folder)
    try:
        digest = hashlib.sha256((folder / "steps.json").read_bytes())
        for layer in sorted(layers, key=lambda layer: layer.name):
            for path in filter(None, (layer.path, layer.direct_path)):
                digest.update(f"\0{path}\0".encode())
                digest.update((folder / path).read_bytes())
    except FileNotFoundError as exc:
        raise ModelError(f"{folder}: {exc.filename} is missing: import the model again") from None
    return digest.hexdigest()[:16]


def models_available(
    modules: tuple[str, ...] = ("torch_mlir", "torch"),
    what: str = "importing models",
    otherwise: str = "",
) -> None:
    """Refuse, with what to install (or `otherwise` do), when a module of the models' extra
    that `what` needs is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelError(
            f"{what} needs {' and '.join(missing)}: pip install 'mlirrl-jax[models]' "
            "(on Linux, `pip install torch --index-url https://download.pytorch.org/whl/cpu` "
            f"first keeps the CPU build){otherwise}"
        )


def _default_shape(source: str) -> list[int] | None:
    """A Python source's `INPUT_SHAPES[factory]`, if the file declares one."""
    path, _, factory = source.rpartition(":")
    if not path.endswith(".py"):
        return None
    text = Path(path).read_text()
    if "INPUT_SHAPES" not in text:
        return None
    spec = importlib.util.spec_from_file_location("model_shapes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shape = getattr(module, "INPUT_SHAPES", {}).get(factory)
    return list(shape) if shape else None


def check_source(source: str) -> None:
    """Refuse a source that names no model, before anything starts."""
    if source.startswith("torchvision:"):
        if importlib.util.find_spec("torchvision") is None:
            raise ModelError(f"{source}: torchvision is not installed (pip install torchvision)")
        return
    path = source if source.endswith(".onnx") else source.rpartition(":")[0]
    if not source.endswith(".onnx") and (":" not in source or not path.endswith(".py")):
        raise ModelError(f"{source!r}: expected FILE.py:FACTORY, torchvision:NAME or FILE.onnx")
    if not Path(path).is_file():
        raise ModelError(f"{path}: no such file")


def _dims(shape: list) -> str:
    return "x".join("?" if size is None else str(size) for size in shape)


def _check_onnx(path: str, given: list[int] | None) -> None:
    """Refuse a file that holds no ONNX model, and an input shape that contradicts (or does
    not fix) the model's own."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends: named, not a traceback
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ModelError(f"{path}: not an ONNX model ({why})") from None
    if not model.graph.input:
        empty = " (the file is empty)" if Path(path).stat().st_size == 0 else ""
        raise ModelError(f"{path}: not an ONNX model with an input to lower{empty}")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    own = [d.dim_value or None for d in dims]
    if given is None and None in own:
        raise ModelError(
            f"{path}: its input's shape ({_dims(own)}) is not fixed; give one (--input-shape)"
        )
    if given is not None and (
        len(given) != len(own) or any(o not in (None, g) for o, g in zip(own, given, strict=True))
    ):
        raise ModelError(
            f"{path}: --input-shape {_dims(given)} contradicts the model's input {_dims(own)}"
        )


def _take_folder(out: Path, replace: bool) -> None:
    """Refuse a folder that holds anything: an import is never rewritten in part. With
    `replace`, an import (or a part of one) there is removed whole first."""
    if not out.is_dir() or not [e for e in out.iterdir() if e.name != LOCK]:
        return
    if (out / "model.json").is_file():
        held = "an import"
    elif (out / "request.json").is_file():
        held = "a part of an import (no model.json)"
    else:
        raise ModelError(f"{out} holds files that are not an import: choose another folder")
    if not replace:
        raise ModelError(
            f"{out} already holds {held}: pass --replace to remove it whole and import again, "
            "or choose another folder"
        )
    clear_folder(out)


def _lower(source: str, shape: list[int] | None, out: Path, say) -> float:
    request = out / "request.json"
    write_atomic(request, json.dumps({"source": source, "input_shape": shape}))
    start = time.perf_counter()
    say(f"lowering {source} to Linalg with torch-mlir (in a child process)")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mlirrl_jax.models.lower", str(request), str(out)],
            capture_output=True,
            text=True,
            timeout=LOWER_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ModelError(f"{source}: lowering took over {LOWER_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise ModelError(f"{source}: the lowering failed: {_reason(done.stderr)}")
    return time.perf_counter() - start


def _reason(stderr: str) -> str:
    """The lines of a failed lowering that say why (torch-mlir names the op it cannot lower)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    telling = [
        line
        for line in lines
        if "error" in line.lower() or "legalize" in line or "unsupported" in line.lower()
    ]
    chosen = (telling or lines)[-4:]
    return " | ".join(line[:300] for line in chosen) or "no message"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "torch-mlir", "onnx"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def import_model(
    source: str,
    out: str | os.PathLike,
    input_shape: list[int] | None = None,
    max_group: int = MAX_GROUP,
    strided: str = STRIDED_FORMS[0],
    check: bool = True,
    replace: bool = False,
    say=print,
) -> ModelImport:
    """Lower, cut and check a model into `out` (see the module's documentation); `replace`:
    an import already in `out` is removed whole first, else refused."""
    check_source(source)
    if strided not in STRIDED_FORMS:
        raise ModelError(f"strided convolutions as {strided!r}: expected one of {STRIDED_FORMS}")
    onnx_source = source.endswith(".onnx")
    models_available(("torch_mlir", "torch", "onnx") if onnx_source else ("torch_mlir", "torch"))
    if onnx_source:
        _check_onnx(source, input_shape)
    elif input_shape is None:
        input_shape = _default_shape(source)
        if input_shape is None:
            raise ModelError(
                f"{source}: give the example input's shape (--input-shape 1,3,224,224)"
            )
    out = Path(out)
    _take_folder(out, replace)
    out.mkdir(parents=True, exist_ok=True)
    lower_s = _lower(source, input_shape, out, say)  # writes request.json first
    (out / "layers").mkdir(exist_ok=True)
    lowered = (out / "lowered.mlir").read_text()
    min_row = default_min_row() if strided == "im2col" else None
    cut = cut_module(lowered, max_group, strided, min_row)
    if cut.literals:  # weights the lowering printed as literals (an ONNX model's), beside the rest
        weights = dict(np.load(out / "weights.npz")) | cut.literals
        with open(out / "weights.npz.tmp", "wb") as f:
            np.savez(f, **weights)
        os.replace(out / "weights.npz.tmp", out / "weights.npz")
    for layer in cut.layers:
        layer.path = f"layers/{layer.name}.mlir"
        write_atomic(out / layer.path, cut.texts[layer.name])
    if cut.gathered:
        _write_direct_forms(cut, lowered, max_group, out)
    write_atomic(
        out / "steps.json",
        json.dumps(
            {
                "inputs": cut.inputs,
                "outputs": cut.outputs,
                "steps": [step.to_json() for step in cut.steps],
            }
        ),
    )
    result = ModelImport(
        source=source,
        input_shape=list(input_shape or cut.input_shapes[0]),
        layers=cut.layers,
        left_out=cut.left_out,
        why_left_out={
            name: WHY_LEFT_OUT.get(name, "not a Linalg op: left out of the composed time")
            for name in cut.left_out
        },
        views=cut.views,
        dropped_asserts=cut.dropped_asserts,
        strided=strided,
        gathered=cut.gathered,
        min_row=min_row,
        occurrences=sum(layer.count for layer in cut.layers),
        lower_s=round(lower_s, 1),
        versions=_versions(),
        cut_hash=cut_hash(out, cut.layers),
    )
    say(
        f"{len(cut.layers)} distinct layers ({result.occurrences} in the model), "
        f"{sum(cut.left_out.values())} ops left out, {cut.views} views"
    )
    if check:
        try:
            result.check_error = check_cut(out, say=say)
            result.check_ok = result.check_error <= CHECK_RTOL
        except ModelError as exc:  # an op the replay cannot compute, a layer refused: named
            result.check_ok, result.check_note = False, str(exc)
            say(f"the cut could not be checked: {exc}")
    write_atomic(out / "report.md", report(result))
    write_atomic(out / "model.json", json.dumps(result.to_json(), indent=1))
    return result


def _write_direct_forms(cut, lowered: str, max_group: int, out: Path) -> None:
    """Beside each gathered layer, the same layer with its convolution as it was
    (`Layer.direct_path`): the two cuts take the same steps, layer for layer."""
    direct = cut_module(lowered, max_group, "direct")
    by_name = {layer.name: layer for layer in cut.layers}

    def layer_steps(steps):
        return [step.layer for step in steps if step.kind == "layer"]

    pairs = [
        (a, b)
        for a, b in zip(layer_steps(cut.steps), layer_steps(direct.steps), strict=True)
        if a != b
    ]
    direct_ops = {layer.name: layer.ops for layer in direct.layers}
    for name, other in dict(pairs).items():
        layer = by_name[name]
        if "gather" in layer.ops and "conv_2d_nchw_fchw" in direct_ops[other]:
            layer.direct_path = f"layers/{name}.direct.mlir"
            write_atomic(out / layer.direct_path, direct.texts[other])


def check_cut(out: str | os.PathLike, scripts: dict[str, str] | None = None, say=print) -> float:
    """Replay the imported model through its programs compiled by the pipeline (each with its
    schedule's script from `scripts`, else unscheduled); the largest difference from the model's
    own output, relative to its largest value."""
    from mlirrl_jax.models.execute import agreement, compiled_runner, replay
    from mlirrl_jax.programs.ir import ProgramError, load_program

    out = Path(out)
    plan = json.loads((out / "steps.json").read_text())
    runners = {}

    def run_layer(name: str, operands):
        if name not in runners:
            try:
                program = load_program(out / "layers" / f"{name}.mlir", name)
            except ProgramError as exc:
                raise ModelError(
                    f"layer {name} is not a program the project takes: {exc}"
                ) from None
            runners[name] = compiled_runner(program, (scripts or {}).get(name))
        return runners[name](*operands)

    weights = dict(np.load(out / "weights.npz"))
    example = np.load(out / "input.npy")
    start = time.perf_counter()
    (actual,) = replay(
        steps_of(plan),
        {plan["inputs"][0]: example},
        weights,
        plan["outputs"],
        run_layer,
    )
    error = agreement(actual, np.load(out / "output.npy"))
    say(
        f"checked: the programs replayed in the model's order give its own output within "
        f"{error:.1e} (relative; {len(runners)} programs compiled, "
        f"{time.perf_counter() - start:.0f} s)"
    )
    return error


def report(result: ModelImport) -> str:
    """The import as Markdown: the layers, what was left out and why."""
    lines = [
        f"# {result.source}, input {'x'.join(map(str, result.input_shape))}",
        "",
        f"{len(result.layers)} distinct layers, {result.occurrences} layer computations in the "
        f"model; {result.views} views (no cost).",
    ]
    if result.gathered:
        lines.append(
            f"{result.gathered} strided convolution(s) cut as a gather (im2col) and a "
            "contraction, the gather inside the layer's program (`--strided-conv im2col`; "
            f"those with output rows of {result.min_row} or more); XLA's baseline times the "
            "convolution as it was."
        )
    if result.check_note:
        lines.append(f"The cut could not be checked against the model: {result.check_note}")
    elif result.check_ok is not None:
        verdict = "agrees with" if result.check_ok else "DOES NOT agree with"
        lines.append(
            f"The cut {verdict} the model's own output (largest relative difference "
            f"{result.check_error:.1e})."
        )
    lines += ["", "| layer | ops | count | MFLOP | status | reason |", "|---|---|---|---|---|---|"]
    for layer in result.layers:
        mflop = f"{layer.flops / 1e6:.1f}" if layer.flops is not None else "-"
        lines.append(
            f"| {layer.name} | {'+'.join(layer.ops)} | {layer.count} | {mflop} | "
            f"{layer.status} | {layer.reason or ''} |"
        )
    lines += ["", "## Left out of the programs", ""]
    if not result.left_out:
        lines.append("Nothing.")
    for name, count in sorted(result.left_out.items()):
        lines.append(f"- `{name}` x{count}: {result.why_left_out.get(name, '')}")
    if result.dropped_asserts:
        lines.append(
            f"- `cf.assert` x{result.dropped_asserts}: torch-mlir's run-time checks inside "
            "Linalg bodies, removed (they compute no value)"
        )
    return "\n".join(lines) + "\n"
