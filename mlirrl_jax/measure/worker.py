"""The measurement worker process: compile, verify against the reference, time.

Started by `runner.Runner` as `python -m mlirrl_jax.measure.worker READ_FD WRITE_FD`; it serves
requests until it reads None. It never imports JAX, so it starts fast, and an abort in the
compiler takes nothing else down.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
import time
from multiprocessing.connection import Connection

import numpy as np

from mlirrl_jax.measure.compile import CompileError, compile_kernel
from mlirrl_jax.measure.reference import (
    NUMPY_TYPES,
    ReferenceUnsupported,
    compare,
    evaluate,
    random_inputs,
    tolerance,
)
from mlirrl_jax.measure.timing import TimingMethod, nan_filled, time_calls
from mlirrl_jax.programs.ir import Program

_CACHE_LIMIT = 8  # programs whose inputs and reference outputs stay cached


class _ProgramData:
    def __init__(self, program: Program, seed: int):
        self.inputs = random_inputs(program, seed)
        self.references = evaluate(program, self.inputs)
        self.tolerance = tolerance(program)


_cache: dict[tuple[str, int], _ProgramData] = {}
# Destroying an ExecutionEngine that loaded the async runtime tears down the runtime's global
# state, and the next async kernel in the process crashes: keep such engines alive, and let the
# runner replace the worker after RETAIN_LIMIT of them.
RETAIN_LIMIT = 48
_retained: list = []


def _program_data(program: Program, seed: int) -> _ProgramData:
    key = (program.hash, seed)
    if key not in _cache:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.pop(next(iter(_cache)))
        _cache[key] = _ProgramData(program, seed)
    return _cache[key]


def inject_test_fault(fault: str | None) -> None:
    """Test-only fault injection: behave like a broken compiler or kernel would."""
    if fault == "crash":
        os.abort()
    if fault == "segfault":
        ctypes.string_at(0)
    if fault == "hang":
        while True:
            time.sleep(1)
    if fault == "oom":
        hog = []
        while True:  # address space, not touched pages: reaches the limit fast
            hog.append(np.empty(256 * 1024 * 1024, dtype=np.uint8))


def measure_request(request: dict) -> dict:
    """Serve one request; the result holds the fields of a Measurement to fill in."""
    program: Program = request["program"]
    method: TimingMethod = request["method"]
    fault = request.get("inject_fault")
    inject_test_fault(fault)
    try:
        kernel = compile_kernel(
            program.mlir, request["script"], request["threads"], request["runtime"]
        )
    except CompileError as exc:
        return {"status": "compile_error", "error": str(exc)}
    if kernel.runtime == "async":
        _retained.append(kernel)
    result: dict = {
        "retire_worker": len(_retained) >= RETAIN_LIMIT,
        "runtime": kernel.runtime,
        "compile_s": {
            "transform_s": kernel.transform_s,
            "lower_s": kernel.lower_s,
            "jit_s": kernel.jit_s,
        },
    }
    try:
        data = _program_data(program, method.seed)
    except ReferenceUnsupported as exc:
        return {**result, "status": "reference_error", "error": str(exc)}
    outputs = [nan_filled(t.shape, NUMPY_TYPES[t.element_type]) for t in program.outputs]
    packed, keep_alive = kernel.pack(data.inputs + outputs)
    kernel.function(packed)
    checked = verify_and_time(
        lambda: kernel.function(packed), outputs, data.references, data.tolerance, method, fault
    )
    del keep_alive
    return {**result, **checked}


def verify_and_time(call, outputs, references, rtol: float, method, fault=None) -> dict:
    """The record fields of a computation whose first call wrote `outputs`: "wrong_output" if
    one differs from its reference by more than `rtol`, else "ok" with `call` timed."""
    if fault == "wrong_output":
        outputs[0].reshape(-1)[0] += 1.0
    worst = 0.0
    for output, reference in zip(outputs, references, strict=True):
        matches, error = compare(output, reference, rtol)
        worst = max(worst, error)
        if not matches:
            return {
                "status": "wrong_output",
                "max_error": worst,
                "tolerance": rtol,
                "error": f"output differs from the reference: error {error:.3g} > {rtol:.3g}",
            }
    stats = time_calls(call, method)
    return {
        "status": "ok",
        "verified": True,
        "max_error": worst,
        "tolerance": rtol,
        "median_s": stats.median_s,
        "min_s": stats.min_s,
        "spread": stats.spread,
        "repeats": stats.repeats,
    }


def main() -> None:
    limit = int(sys.argv[3]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    receive = Connection(int(sys.argv[1]), writable=False)
    send = Connection(int(sys.argv[2]), readable=False)
    while True:
        try:
            request = receive.recv()
        except EOFError:
            return
        if request is None:
            return
        try:
            reply = measure_request(request)
        except MemoryError:
            limit = resource.getrlimit(resource.RLIMIT_AS)[0]
            reply = {
                "status": "oom",
                "error": f"MemoryError in the worker (limit {limit >> 20} MiB)",
            }
        send.send(reply)


if __name__ == "__main__":
    main()
