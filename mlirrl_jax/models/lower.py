"""A model lowered to Linalg on tensors by torch-mlir, in a process of its own.

Run as `python -m mlirrl_jax.models.lower REQUEST.json OUT_DIR`; `models.importer` starts it.
torch-mlir bundles an MLIR of its own, not the pinned bindings' MLIR, so the two never share a
process: this one writes the module as text, and the project's parser reads that text.

A request names the model (`source`: "torchvision:NAME", "FILE.py:FACTORY" or "FILE.onnx") and
its example input shape (`input_shape`; an ONNX model's own shapes where omitted). Weights
(`dense_resource` blobs) go to `weights.npz`, out of the text, which is printed in MLIR's
generic form, so that an op of a dialect the pinned bindings lack (torch-mlir's `tm_tensor`)
still parses, to be named: the programs cut from it take
them as arguments, and `models.execute` reads them to check the cut against the model's own
output.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np


def torch_module(source: str):
    """The PyTorch module a source names: "torchvision:NAME" (random weights) or
    "FILE.py:FACTORY" (FACTORY() is called)."""
    if source.startswith("torchvision:"):
        import torchvision

        name = source.split(":", 1)[1]
        factory = getattr(torchvision.models, name, None)
        if factory is None:
            raise SystemExit(f"torchvision has no model {name!r}")
        return factory(weights=None)
    path, _, factory = source.rpartition(":")
    spec = importlib.util.spec_from_file_location("user_model", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, factory):
        raise SystemExit(f"{path} has no {factory!r}")
    return getattr(module, factory)()


def example_input(shape: list[int], seed: int = 0) -> np.ndarray:
    """The example input the model's own output is computed on (float32, fixed seed)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def lower_torch(source: str, input_shape: list[int]) -> tuple[str, np.ndarray, np.ndarray]:
    import torch
    from torch_mlir import fx

    model = torch_module(source).eval()
    example = example_input(input_shape)
    with torch.no_grad():
        output = model(torch.from_numpy(example)).numpy()
        module = fx.export_and_import(
            model, torch.from_numpy(example), output_type="linalg-on-tensors", func_name="forward"
        )
    return module.operation.get_asm(print_generic_op_form=True), example, output


def lower_onnx(path: str, input_shape: list[int] | None) -> tuple[str, np.ndarray, np.ndarray]:
    import onnx
    from torch_mlir import ir
    from torch_mlir.compiler_utils import (
        OutputType,
        lower_mlir_module,
        run_pipeline_with_repro_report,
    )
    from torch_mlir.dialects import torch as torch_d
    from torch_mlir.extras import onnx_importer

    model = onnx.load(path)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    # the importer checked the shape given against the model's own (`importer._check_onnx`)
    for dim, size in zip(dims, input_shape or [], strict=False):
        dim.ClearField("dim_param")
        dim.dim_value = size
    model = onnx.shape_inference.infer_shapes(model)
    example = example_input([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
    from onnx.reference import ReferenceEvaluator

    output = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: example})[0]
    context = ir.Context()
    torch_d.register_dialect(context)
    info = onnx_importer.ModelInfo(model)
    module = info.create_module(context=context).operation
    onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
    run_pipeline_with_repro_report(
        module,
        "builtin.module(torch-onnx-to-torch-backend-pipeline)",
        "ONNX to the torch backend",
    )
    lowered = lower_mlir_module(False, OutputType.LINALG_ON_TENSORS, module)
    return lowered.operation.get_asm(print_generic_op_form=True), example, output


def split_resources(text: str) -> tuple[str, dict[str, np.ndarray]]:
    """The module's text without its `dialect_resources` section, and each resource's bytes
    (the blob after its 4-byte alignment header)."""
    start = text.find("{-#")
    if start < 0:
        return text, {}
    blobs = {}
    for key, hex_data in re.findall(r'([\w.]+): "0x([0-9A-Fa-f]*)"', text[start:]):
        blobs[key] = np.frombuffer(bytes.fromhex(hex_data[8:]), dtype=np.uint8)
    return text[:start], blobs


def main(request_path: str, out_dir: str) -> None:
    """Write into `out_dir`: `lowered.mlir` (no weights), `weights.npz` (each resource's
    bytes), `input.npy` and `output.npy` (the model's own output on that input)."""
    request = json.loads(Path(request_path).read_text())
    source, shape = request["source"], request.get("input_shape")
    if source.endswith(".onnx"):
        text, example, output = lower_onnx(source, shape)
    else:
        if not shape:
            raise SystemExit("a PyTorch model needs an example input shape (--input-shape)")
        text, example, output = lower_torch(source, shape)
    out = Path(out_dir)
    text, blobs = split_resources(text)
    np.savez(out / "weights.npz", **blobs)
    np.save(out / "input.npy", example)
    np.save(out / "output.npy", np.asarray(output, dtype=np.float32))
    (out / "lowered.mlir").write_text(text)  # last: its presence says the rest is there


if __name__ == "__main__":
    main(*sys.argv[1:3])
