"""Apply a transform script to a program's kernel, lower it to LLVM and JIT-compile it."""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import time
from dataclasses import dataclass

import mlir
import numpy as np
from mlir import execution_engine, ir, passmanager, runtime
from mlir.dialects.transform import interpreter

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.programs.ir import KERNEL_NAME

MLIR_LIB_DIR = os.path.join(list(mlir.__path__)[0], "lib")
C_RUNNER_UTILS = os.path.join(MLIR_LIB_DIR, "libmlir_c_runner_utils.so")
ASYNC_RUNTIME = os.path.join(MLIR_LIB_DIR, "libmlir_async_runtime.so")

_BUFFERIZE = [
    "canonicalize",
    "cse",
    "eliminate-empty-tensors",
    "one-shot-bufferize{bufferize-function-boundaries"
    " function-boundary-type-conversion=identity-layout-map}",
    "buffer-deallocation-pipeline",
    "canonicalize",
    "cse",
    "canonicalize",
    "loop-invariant-code-motion",
]


class CompileError(Exception):
    """The transform script or the lowering failed; `stage` says which."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.message = message


def find_libomp() -> str | None:
    """An OpenMP runtime for the 'openmp' parallel lowering, if one is installed."""
    candidates = [os.environ.get("MLIRRL_LIBOMP", "")]
    candidates += sorted(glob.glob("/usr/lib/*/libomp.so*")) + sorted(
        glob.glob("/usr/lib/llvm-*/lib/libomp.so*")
    )
    candidates += [os.path.join(sys.prefix, "lib", "libiomp5.so")]
    return next((c for c in candidates if c and os.path.exists(c)), None)


def resolve_runtime(threads: int, runtime_name: str) -> str:
    """'sequential' for one thread; else 'openmp' or 'async' ('auto': OpenMP when installed)."""
    if threads <= 1:
        return "sequential"
    if runtime_name == "auto":
        return "openmp" if find_libomp() else "async"
    if runtime_name not in ("openmp", "async"):
        raise ConfigError(f"unknown parallel runtime {runtime_name!r}: use auto, openmp or async")
    if runtime_name == "openmp" and not find_libomp():
        raise ConfigError(
            "the openmp runtime needs libomp (e.g. apt-get install libomp5); set MLIRRL_LIBOMP"
        )
    return runtime_name


# async-parallel-for runs some blocks of a multi-dimensional scf.parallel twice once it has a
# few thousand iterations (seen at 7x7x128 and 65x65, not at 64x64 or at any 1-D loop), so that
# an accumulating kernel doubles its result: the async lowering collapses every parallel loop
# to one dimension first, where this marker stands in the pipeline (`_lower`).
COLLAPSE_PARALLEL = "<collapse parallel loops>"


def lowering_pipeline(threads: int, runtime_name: str) -> str:
    """The pass pipeline from tensors to the LLVM dialect; scf.forall becomes threads or loops."""
    passes = list(_BUFFERIZE)
    passes += [
        "func.func(convert-linalg-to-loops)",
        # unrolled: otherwise n-D transfers go through a stack buffer allocated inside the
        # loop nest, and long loops overflow the stack (seen as segfaults)
        "convert-vector-to-scf{full-unroll=true}",
        "expand-strided-metadata",
        "lower-affine",
    ]
    if runtime_name == "openmp":
        passes += ["scf-forall-to-parallel", f"convert-scf-to-openmp{{num-threads={threads}}}"]
    elif runtime_name == "async":
        passes += [
            "scf-forall-to-parallel",
            COLLAPSE_PARALLEL,
            f"async-parallel-for{{async-dispatch=false num-workers={threads} min-task-size=1}}",
            "async-to-async-runtime",
            "async-runtime-ref-counting",
            "async-runtime-ref-counting-opt",
        ]
    else:
        passes += ["scf-forall-to-for"]
    # finalize-memref-to-llvm before convert-scf-to-cf: it inlines OpenMP's memref.alloca_scope
    passes += [
        "finalize-memref-to-llvm",
        "convert-scf-to-cf",
        "convert-vector-to-llvm",
        "finalize-memref-to-llvm",
        "convert-math-to-llvm",
        # what has no LLVM intrinsic (math.erf of a GELU) calls the C library's function
        "convert-math-to-libm",
        "convert-arith-to-llvm",
        "convert-index-to-llvm",
        "convert-ub-to-llvm",
    ]
    if runtime_name == "openmp":
        passes += ["convert-openmp-to-llvm"]
    if runtime_name == "async":
        passes += ["convert-async-to-llvm"]
    passes += [
        "convert-arith-to-llvm",
        "convert-func-to-llvm",
        "convert-cf-to-llvm",
        "reconcile-unrealized-casts",
    ]
    return "builtin.module(" + ",".join(passes) + ")"


def _parallel_ranks(module) -> set[int]:
    """The induction-variable counts of the module's scf.parallel loops."""
    ranks: set[int] = set()

    def visit(op):
        if op.name == "scf.parallel":
            ranks.add(len(op.regions[0].blocks[0].arguments))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return ranks


def _lower(payload, pipeline: str) -> None:
    """Run `pipeline`, collapsing the parallel loops to one dimension where it says so."""
    before, _, after = pipeline.partition(COLLAPSE_PARALLEL)
    if not after:
        passmanager.PassManager.parse(pipeline).run(payload.operation)
        return
    passmanager.PassManager.parse(before.rstrip(",") + ")").run(payload.operation)
    ranks = _parallel_ranks(payload)
    multi = {r for r in ranks if r > 1}
    if multi:
        if len(ranks) > 1:  # the collapsing pass takes one dimension list for all loops
            raise CompileError(
                "lower",
                f"parallel loops of {sorted(ranks)} dimensions in one kernel: the async runtime "
                "needs them collapsed to one each, which works only when they all have the "
                "same number (install libomp for the openmp runtime)",
            )
        dims = ",".join(map(str, range(multi.pop())))
        collapse = f"func.func(test-scf-parallel-loop-collapsing{{collapsed-indices-0={dims}}})"
        passmanager.PassManager.parse(f"builtin.module({collapse})").run(payload.operation)
    passmanager.PassManager.parse("builtin.module(" + after.lstrip(",")).run(payload.operation)


_loaded_libraries: dict[str, ctypes.CDLL] = {}


def _keep_loaded(paths: list[str]) -> None:
    """Hold a process-wide reference to each runtime library.

    An ExecutionEngine unloads its shared libraries when it is destroyed; the async and OpenMP
    runtimes keep worker threads alive, and unloading their code under them crashes the next
    kernel. One extra reference per process keeps them resident.
    """
    for path in paths:
        if path not in _loaded_libraries:
            _loaded_libraries[path] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


@dataclass
class CompiledKernel:
    """A JIT-compiled kernel; call `run(arrays)` with inputs then outputs (numpy, C order)."""

    engine: object
    function: object
    transform_s: float
    lower_s: float
    jit_s: float
    runtime: str

    def pack(self, arrays: list[np.ndarray]):
        descriptors = [
            ctypes.pointer(ctypes.pointer(runtime.get_ranked_memref_descriptor(a))) for a in arrays
        ]
        packed = (ctypes.c_void_p * len(descriptors))(
            *[ctypes.cast(d, ctypes.c_void_p) for d in descriptors]
        )
        return packed, descriptors  # the descriptors must outlive the call

    @property
    def compile_s(self) -> float:
        return self.transform_s + self.lower_s + self.jit_s


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:2000]


def _apply_script(payload, script: str) -> None:
    """Run a Transform-dialect script's named sequence on `payload` (in its context)."""
    try:
        transform_module = ir.Module.parse(script)
    except Exception as exc:
        raise CompileError("transform", f"script does not parse: {_one_line(exc)}") from None
    entry = next(
        op
        for op in transform_module.body.operations
        if op.operation.name == "transform.named_sequence"
    )
    try:
        interpreter.apply_named_sequence(payload, entry, transform_module)
    except Exception as exc:
        raise CompileError("transform", _one_line(exc)) from None


def transformed_mlir(kernel_mlir: str, script: str | None) -> str:
    """The `@kernel` module after the script's transformations, before lowering."""
    with ir.Context(), ir.Location.unknown():
        payload = ir.Module.parse(kernel_mlir)
        if script:
            _apply_script(payload, script)
        return str(payload)


def compile_kernel(
    kernel_mlir: str, script: str | None, threads: int = 1, runtime_name: str = "auto"
) -> CompiledKernel:
    """Transform (if a script is given), lower and JIT the `@kernel` of a normalized program."""
    resolved = resolve_runtime(threads, runtime_name)
    with ir.Context(), ir.Location.unknown():
        start = time.perf_counter()
        payload = ir.Module.parse(kernel_mlir)
        if script:
            _apply_script(payload, script)
        transformed = time.perf_counter()
        try:
            _lower(payload, lowering_pipeline(threads, resolved))
        except CompileError:
            raise
        except Exception as exc:
            raise CompileError("lower", _one_line(exc)) from None
        lowered = time.perf_counter()
        libs = [C_RUNNER_UTILS]
        if resolved == "openmp":
            libs.append(find_libomp())
        elif resolved == "async":
            libs.append(ASYNC_RUNTIME)
        _keep_loaded(libs)
        try:
            engine = execution_engine.ExecutionEngine(payload, opt_level=3, shared_libs=libs)
            engine.initialize()
            function = engine.lookup(KERNEL_NAME)  # LLVM code generation happens here
        except Exception as exc:
            raise CompileError("jit", _one_line(exc)) from None
        done = time.perf_counter()
    return CompiledKernel(
        engine, function, transformed - start, lowered - transformed, done - lowered, resolved
    )
