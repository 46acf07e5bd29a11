"""XLA:CPU and NumPy/BLAS baselines: the same computation, verified and timed like a kernel.

`measure_xla` and `measure_numpy` (plain matmul and batch_matmul only) run in a child process
pinned to `threads` cores, with XLA's and BLAS's thread pools sized to them; the child verifies
the first run against the reference and times the rest with the project's `TimingMethod`, so
the records compare with `Runner.measure`'s through `timing.speedup`. As the project's kernels
write into a given buffer, the XLA call donates its output buffer and the next call reuses it.
The records carry `schedule={"baseline": library}`: they are not schedules, and do not belong
in the MeasurementStore.
"""

from __future__ import annotations

import dataclasses
import os
import time
from multiprocessing.connection import Connection

import jax
import jax.numpy as jnp
import numpy as np

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.host_devices import FLAG as HOST_DEVICES_FLAG
from mlirrl_jax.measure.child import Child
from mlirrl_jax.measure.fingerprint import fingerprint
from mlirrl_jax.measure.jax_body import needs_x64
from mlirrl_jax.measure.reference import (
    NUMPY_TYPES,
    ReferenceUnsupported,
)
from mlirrl_jax.measure.runner import DEFAULT_TIMEOUT_S
from mlirrl_jax.measure.timing import Measurement, TimingMethod, nan_filled
from mlirrl_jax.measure.to_jax import jax_function, plain_matmul, translate_program
from mlirrl_jax.measure.worker import inject_test_fault, program_data, verify_and_time
from mlirrl_jax.programs.ir import Program

# Test-only fault injection in the child (see worker.inject_test_fault); "oom" is left out: the child
# has no memory limit, so a memory hog would take the whole machine.
FAULTS = ("crash", "hang", "wrong_output")
# Python run in the child before anything else: the affinity must be set before NumPy loads
# BLAS and JAX starts its thread pools, as threads started earlier keep the old mask.
_BOOTSTRAP = (
    "import os, sys; os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]); "
    "from mlirrl_jax.measure.baselines import _child_main; _child_main(int(sys.argv[2]), int(sys.argv[3]))"
)


# ----------------------------------------------------------------------------- measuring
def measure_xla(
    program: Program,
    threads: int = 1,
    method: TimingMethod | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    inject_fault: str | None = None,
) -> Measurement | None:
    """The program jitted by XLA:CPU on `threads` cores, verified and timed in a child process;
    None if it has no exact JAX translation. Inputs come from `method.seed`, as in the runner."""
    if translate_program(program) is None:
        return None
    return _measure_in_child("xla", program, threads, method, timeout_s, inject_fault)


# The same call as `measure_xla`'s, for the other library: each refuses what it cannot run
# exactly, then measures in the same child harness (`_measure_in_child`).
def measure_numpy(
    program: Program,
    threads: int = 1,
    method: TimingMethod | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    inject_fault: str | None = None,
) -> Measurement | None:
    """`np.matmul(a, b, out=c)` with BLAS on `threads` threads, verified and timed in a child
    process; None unless the program is a plain matmul or batch_matmul."""
    if not plain_matmul(program):
        return None
    return _measure_in_child("numpy", program, threads, method, timeout_s, inject_fault)


def _child_env(threads: int) -> dict:
    """The child's environment: XLA on the CPU with one device, and thread pools of `threads`.

    XLA:CPU sizes its intra-op pool from $NPROC, else from the affinity; both are set. Measured
    with jax 0.10.2 (2048^3 f32 matmul, 2 cores): 137 ms on 1 core, 72 ms on 2, and 138 ms on
    2 cores with NPROC=1; --xla_cpu_multi_thread_eigen=false changes nothing (67.8 ms on 2
    cores), as the dot no longer runs through Eigen's threads, so it is not set.
    """
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = " ".join(f for f in flags if not f.startswith(HOST_DEVICES_FLAG))
    env["JAX_PLATFORMS"] = "cpu"
    for name in ("NPROC", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def _measure_in_child(
    library: str,
    program: Program,
    threads: int,
    method: TimingMethod | None,
    timeout_s: float,
    inject_fault: str | None,
) -> Measurement:
    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= threads <= len(cores):
        raise ConfigError(f"threads must be in 1..{len(cores)} (the cores allowed), got {threads}")
    if inject_fault is not None and inject_fault not in FAULTS:
        raise ConfigError(f"unknown fault {inject_fault!r}; known: {FAULTS}")
    method = method or TimingMethod()
    record = Measurement(
        status="ok",
        program=program.name,
        program_hash=program.hash,
        schedule={"baseline": library},
        schedule_hash=f"baseline:{library}",
        threads=threads,
        runtime=library,
        method=dataclasses.asdict(method),
        fingerprint=fingerprint(),
        flops=program.flops,
    )
    start = time.perf_counter()
    request = {
        "library": library,
        "program": program,
        "threads": threads,
        "method": method,
        "inject_fault": inject_fault,
    }
    reply = _round_trip(request, cores[:threads], _child_env(threads), timeout_s)
    record.fingerprint["baseline"] = reply.pop("baseline", {})
    for key, value in reply.items():
        setattr(record, key, value)
    record.wall_s = time.perf_counter() - start
    return record


def _round_trip(request: dict, cores: list[int], env: dict, timeout_s: float) -> dict:
    """Send `request` to a fresh child pinned to `cores`; its reply, or a failure record."""
    child = Child(lambda r, w: ["-c", _BOOTSTRAP, ",".join(map(str, cores)), str(r), str(w)], env)
    try:
        child.send.send(request)
        if child.receive.poll(timeout_s):
            return child.receive.recv()
        return {"status": "timeout", "error": f"no result within {timeout_s:g} s; killed"}
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the child died: how, below
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
        return child.death(0, memory_mb)
    finally:
        child.kill()


def _child_main(read_fd: int, write_fd: int) -> None:
    """The child: serve one request and exit (started through `_BOOTSTRAP`)."""
    receive = Connection(read_fd, writable=False)
    send = Connection(write_fd, readable=False)
    send.send(_serve(receive.recv()))


def _serve(request: dict) -> dict:
    program: Program = request["program"]
    method: TimingMethod = request["method"]
    fault = request["inject_fault"]
    inject_test_fault(fault)
    try:  # the kernels' reference, from the same disk cache (computed once per seed)
        data, _ = program_data(program, method.seed)
    except ReferenceUnsupported as exc:
        return {"status": "reference_error", "error": str(exc)}
    prepare = _prepare_xla if request["library"] == "xla" else _prepare_numpy
    call, outputs, fields = prepare(program, data.inputs, request["threads"])
    checked = verify_and_time(call, outputs(), data.references, data.tolerance, method, fault)
    return {**fields, **checked}


def _prepare_xla(program: Program, inputs: list[np.ndarray], threads: int):
    """(timed call, copies of the outputs, record fields) for the jitted program, run twice:
    compiled, then checked to write into the buffers it was given. Each call donates the last
    call's output buffers (the first ones, made from NumPy, may not be donatable)."""
    if needs_x64(program):
        jax.config.update("jax_enable_x64", True)
    # run in the calling thread, as the project's kernels are called
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    computation = jax_function(program)
    # keep_unused: else jit drops the unread `outs` argument, and with it the donation
    jitted = jax.jit(lambda ins, outs: computation(*ins), donate_argnums=1, keep_unused=True)
    device_inputs = tuple(jax.device_put(x) for x in inputs)
    state = [
        tuple(
            jnp.asarray(nan_filled(t.shape, NUMPY_TYPES[t.element_type])) for t in program.outputs
        )
    ]

    def call() -> None:
        state[0] = jax.block_until_ready(jitted(device_inputs, state[0]))

    start = time.perf_counter()
    call()
    jit_s = time.perf_counter() - start
    pointers = [o.unsafe_buffer_pointer() for o in state[0]]
    call()
    reused = [o.unsafe_buffer_pointer() for o in state[0]] == pointers

    def outputs() -> list[np.ndarray]:
        return [np.array(o) for o in state[0]]  # copies: the next call donates the buffers

    baseline = {
        "library": f"jax {jax.__version__}",
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "nproc": os.environ.get("NPROC"),
        "output_buffer_reused": reused,
        "cores": sorted(os.sched_getaffinity(0)),
    }
    return call, outputs, {"compile_s": {"jit_s": jit_s}, "baseline": baseline}


def _prepare_numpy(program: Program, inputs: list[np.ndarray], threads: int):
    """(timed call, copies of the outputs, record fields) for `np.matmul` into one buffer."""
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(limits=threads)  # for the rest of this one-request process
    a, b = inputs
    out = nan_filled(program.outputs[0].shape, NUMPY_TYPES[program.outputs[0].element_type])

    def call() -> None:
        np.matmul(a, b, out=out)

    call()
    baseline = {
        "library": f"numpy {np.__version__}",
        "blas": [
            {k: pool.get(k) for k in ("internal_api", "version", "num_threads")}
            for pool in threadpool_info()
            if pool.get("user_api") == "blas"
        ],
        "cores": sorted(os.sched_getaffinity(0)),
    }
    return call, lambda: [out.copy()], {"baseline": baseline}
