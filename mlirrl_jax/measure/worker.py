"""The measurement worker process: compile, verify against the reference, time.

Started by `runner.Runner` as `python -m mlirrl_jax.measure.worker READ_FD WRITE_FD MEM_MB`; it
serves requests until it reads None. It never imports JAX, so it starts fast, and an abort in
the compiler takes nothing else down. Before each phase of a request after compiling it sends
{"phase": "reference"} or {"phase": "run"} (the runner gives each phase its own time limit),
then the reply; {"phase": "verify"} follows the timed calls. A gated request (`measure.gate`)
waits after {"phase": "run"} until the runner answers that the gate is its own, with the cores
to time on; such a worker dies with the job that started it, since the gate may pause it.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from mlirrl_jax.measure.compile import CompileError, compile_kernel
from mlirrl_jax.measure.gate import MEASURE_CPUS, confine
from mlirrl_jax.measure.refcache import MIN_STORED_S, ReferenceCache
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

_CACHE_LIMIT = 8  # programs whose inputs and reference outputs stay cached in memory


@dataclass
class _ProgramData:
    inputs: list[np.ndarray]
    references: list[np.ndarray]  # in the compute dtype (float64 for floats)
    tolerance: float


_cache: dict[tuple[str, int], _ProgramData] = {}
_disk = ReferenceCache()
# Destroying an ExecutionEngine that loaded the async runtime tears down the runtime's global
# state, and the next async kernel in the process crashes: keep such engines alive, and let the
# runner replace the worker after RETAIN_LIMIT of them.
RETAIN_LIMIT = 48
_retained: list = []


def program_data(program: Program, seed: int) -> tuple[_ProgramData, dict]:
    """The program's inputs at `seed` and their reference outputs, from memory, else from the
    disk cache, else computed (and written to the disk cache); with where the reference came
    from ("memory", "disk", "computed") and the seconds it took."""
    key = (program.hash, seed)
    if key in _cache:
        return _cache[key], {"source": "memory", "seconds": 0.0}
    start = time.perf_counter()
    inputs = random_inputs(program, seed)
    references = _disk.load(program.hash, seed, inputs)
    source = "disk"
    if references is None:
        references = evaluate(program, inputs)
        source = "computed"
        if time.perf_counter() - start >= MIN_STORED_S:
            _disk.store(program.hash, seed, inputs, references)
    if len(_cache) >= _CACHE_LIMIT:
        _cache.pop(next(iter(_cache)))
    _cache[key] = _ProgramData(inputs, references, tolerance(program))
    return _cache[key], {"source": source, "seconds": time.perf_counter() - start}


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


def measure_request(request: dict, enter_phase: Callable[[dict], None]) -> dict:
    """Serve one request; the result holds the fields of a Measurement to fill in.
    `enter_phase` is told of each phase after compiling as it starts."""
    program: Program = request["program"]
    method: TimingMethod = request["method"]
    fault = request.get("inject_fault")
    try:
        kernel = compile_kernel(
            program.mlir, request["script"], request["threads"], request["runtime"]
        )
    except CompileError as exc:
        return {"status": "compile_error", "error": str(exc)}
    if kernel.runtime == "async":
        _retained.append(kernel)
    compiled = {
        "runtime": kernel.runtime,
        "compile_s": {
            "transform_s": kernel.transform_s,
            "lower_s": kernel.lower_s,
            "jit_s": kernel.jit_s,
        },
    }
    result = {"retire_worker": len(_retained) >= RETAIN_LIMIT, **compiled}
    enter_phase({"phase": "reference", **compiled})
    try:
        data, reference = program_data(program, method.seed)
    except ReferenceUnsupported as exc:
        return {**result, "status": "reference_error", "error": str(exc)}
    outputs = [nan_filled(t.shape, NUMPY_TYPES[t.element_type]) for t in program.outputs]
    packed, keep_alive = kernel.pack(data.inputs + outputs)
    enter_phase({"phase": "run", "reference": reference})
    started = time.perf_counter()
    inject_test_fault(fault)  # a broken kernel: it crashes, hangs or exhausts memory when run
    kernel.function(packed)
    first_call_s = time.perf_counter() - started
    # timed before it is verified, so that the comparison runs after the gate is given back;
    # the timed calls rewrite the same outputs, and a wrong one keeps no times
    stats = time_calls(lambda: kernel.function(packed), method, first_call_s)
    timed = time.perf_counter()
    enter_phase({"phase": "verify"})
    checked = verify(outputs, data.references, data.tolerance, fault)
    del keep_alive
    if checked["status"] == "ok":
        checked.update(timing_fields(stats))
    checked["phase_s"] = {
        "first_call_s": first_call_s,
        "timing_s": timed - started - first_call_s,
        "verify_s": time.perf_counter() - timed,
    }
    return {**result, **checked}


def verify(outputs, references, rtol: float, fault=None) -> dict:
    """The record fields of a computation's `outputs` against their references: "ok" and
    verified, or "wrong_output" if one differs by more than `rtol`."""
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
    return {"status": "ok", "verified": True, "max_error": worst, "tolerance": rtol}


def timing_fields(stats) -> dict:
    """The record fields of a timed computation (`timing.TimingStats`)."""
    return {
        "median_s": stats.median_s,
        "min_s": stats.min_s,
        "spread": stats.spread,
        "repeats": stats.repeats,
    }


def verify_and_time(call, outputs, references, rtol: float, method, fault=None) -> dict:
    """The record fields of a computation whose first call wrote `outputs`: "wrong_output" if
    one differs from its reference by more than `rtol`, else "ok" with `call` timed."""
    checked = verify(outputs, references, rtol, fault)
    if checked["status"] == "ok":
        checked.update(timing_fields(time_calls(call, method)))
    return checked


def _die_with_parent() -> None:
    """Be killed when the job that started this worker dies (Linux): a worker the gate paused
    would otherwise outlive a killed job, stopped."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the job died before this line
            sys.exit(0)


def main() -> None:
    limit = int(sys.argv[3]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpus = os.environ.get(MEASURE_CPUS)
    if cpus:  # measure on these cores only (`collect --measure-cpus`)
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    after: list[tuple[int, ...]] = []  # the cores to go back to once the kernel is timed
    receive = Connection(int(sys.argv[1]), writable=False)
    send = Connection(int(sys.argv[2]), readable=False)
    while True:
        try:
            request = receive.recv()
        except EOFError:
            return
        if request is None:
            return
        if request.get("gated"):
            _die_with_parent()

        def enter_phase(message: dict, gated: bool = bool(request.get("gated"))) -> None:
            send.send(message)
            if not gated:
                return
            if message["phase"] == "run":  # the gate is ours: the others keep off these cores
                granted = receive.recv()
                confine(os.getpid(), tuple(granted["go"]))
                after.append(tuple(granted["after"]))
            elif message["phase"] == "verify" and after:
                confine(os.getpid(), after.pop())  # back on the job's cores

        try:
            reply = measure_request(request, enter_phase)
        except MemoryError:
            limit = resource.getrlimit(resource.RLIMIT_AS)[0]
            reply = {
                "status": "oom",
                "error": f"MemoryError in the worker (limit {limit >> 20} MiB)",
            }
        send.send(reply)


if __name__ == "__main__":
    main()
