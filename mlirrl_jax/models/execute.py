"""Run an imported model through its cut programs, to check the cut against the model itself.

The steps of `models.cut` are replayed in order on NumPy arrays: each layer occurrence runs its
program (compiled by the project's pipeline, unscheduled or with a schedule), weights come from
the import's `weights.npz`, and what is not a Linalg op (views, `tensor.pad`, slices,
concatenation) is computed here by its MLIR definition. The model's output from this replay is
compared with the model's own output on the same input (PyTorch's, or ONNX's reference
evaluator's): agreement means that the programs, with the arguments the cut gives them, compute
the model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mlirrl_jax.models.cut import ModelError
from mlirrl_jax.models.steps import Step
from mlirrl_jax.programs.ir import Program

NUMPY_DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32}
NUMPY_DTYPES |= {"i1": np.bool_, "f16": np.float16, "i8": np.int8}


def _dtype(name: str):
    if name not in NUMPY_DTYPES:
        raise ModelError(f"element type {name} is not supported by the model's replay")
    return NUMPY_DTYPES[name]


def compiled_runner(program: Program, script: str | None = None) -> Callable:
    """A function of the program's inputs giving its outputs, JIT-compiled by the pipeline
    (with the schedule's Transform script when one is given)."""
    from mlirrl_jax.measure.compile import compile_kernel

    kernel = compile_kernel(program.mlir, script, 1, "auto")

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        inputs = [
            np.ascontiguousarray(a, dtype=_dtype(t.element_type))
            for a, t in zip(arrays, program.inputs, strict=True)
        ]
        outputs = [np.zeros(t.shape, _dtype(t.element_type)) for t in program.outputs]
        packed, keep_alive = kernel.pack([*inputs, *outputs])
        kernel.function(packed)
        del keep_alive
        return outputs

    return run


def _slice(step: Step) -> tuple:
    return tuple(
        slice(o, o + s * d, d)
        for o, s, d in zip(step.offsets, step.sizes, step.strides, strict=True)
    )


def _other(step: Step, operands: list[np.ndarray]) -> np.ndarray:
    """A step that is not a layer, by the MLIR op's definition."""
    kind = step.kind
    if kind in {"tensor.expand_shape", "tensor.collapse_shape", "tensor.reshape"}:
        return operands[0].reshape(step.shape)  # row-major, as MLIR's reassociation
    if kind in {"tensor.cast", "tensor.bitcast"}:
        return operands[0]
    if kind == "tensor.pad":
        widths = list(zip(step.low, step.high, strict=True))
        return np.pad(operands[0], widths, constant_values=step.value)
    if kind == "tensor.extract_slice":
        return np.ascontiguousarray(operands[0][_slice(step)]).reshape(step.shape)
    if kind == "tensor.insert_slice":
        out = operands[1].copy()
        region = out[_slice(step)]
        out[_slice(step)] = operands[0].reshape(region.shape)
        return out
    if kind == "tensor.concat":
        return np.concatenate(operands, axis=step.dim)
    raise ModelError(f"{kind}: not a layer, and the model's replay cannot compute it")


def replay(
    steps: list[Step],
    inputs: dict[str, np.ndarray],
    weights: dict[str, np.ndarray],
    outputs: list[str],
    run_layer: Callable[[str, list[np.ndarray]], list[np.ndarray]],
) -> list[np.ndarray]:
    """The model's outputs computed step by step; `run_layer(name, operands)` runs a layer."""
    values = dict(inputs)
    last_use = {}
    for i, step in enumerate(steps):
        for name in step.reads:
            last_use[name] = i
    for i, step in enumerate(steps):
        kind = step.kind
        try:
            operands = [values[name] for name in step.reads]
        except KeyError as exc:
            raise ModelError(f"step {i} ({kind}) reads {exc.args[0]}, never computed") from None
        if kind == "constant":
            dtype = _dtype(step.dtype)
            if step.resource is not None:
                data = weights[step.resource].view(dtype).reshape(step.shape)
            else:  # a literal: one value (a splat) or all of them
                data = np.asarray(step.values, dtype)
                data = np.broadcast_to(
                    data.reshape(-1)[0] if data.size == 1 else data.reshape(step.shape),
                    step.shape,
                )
            values[step.result] = data
        elif kind == "tensor.empty":
            values[step.result] = np.zeros(step.shape, np.float32)
        elif kind == "linalg.fill":
            values[step.result] = np.full(step.shape, step.value, operands[-1].dtype)
        elif kind == "layer":
            values[step.result] = run_layer(step.layer, operands)[0]
        else:
            values[step.result] = _other(step, operands)
        for name in step.reads:  # free what no later step reads
            if last_use.get(name) == i and name not in outputs:
                values.pop(name, None)
    return [values[name] for name in outputs]


def agreement(actual: np.ndarray, expected: np.ndarray) -> float:
    """The largest difference relative to the expected output's largest magnitude."""
    scale = max(float(np.abs(expected).max()), 1e-30)
    return float(np.abs(actual.astype(np.float64) - expected).max()) / scale
