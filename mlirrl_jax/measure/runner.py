"""Measurement in worker processes with time and memory limits.

The compiler (this LLVM build has assertions on) and the compiled kernel run in a worker
process, so an abort, a segfault, a hang or running out of memory becomes a failure record with
its reason; the next measurement goes on in a fresh worker. A measurement has four phases, each
with its own time limit: compiling, getting the reference outputs, the kernel's run (the first
call and the timed repeats) and verifying its outputs (within the run's limit; a wrong output
keeps no times). The worker keeps inputs and reference outputs cached
per program, and a slow reference also on disk (`refcache`), so a reference is computed once per
program and seed, even when the worker that computed it is killed later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.measure.child import Child
from mlirrl_jax.measure.fingerprint import fingerprint
from mlirrl_jax.measure.gate import MEASURE_CPUS, GateAborted, TimingGate
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule, ScheduleError
from mlirrl_jax.transform import transform_script

DEFAULT_TIMEOUT_S = 60.0  # the kernel's run (first call and timed repeats), then verifying
DEFAULT_COMPILE_TIMEOUT_S = 60.0  # starting a worker if needed, transforming, lowering, JIT
# Evaluating the float64 NumPy reference of a batch-256 layer takes minutes; it is done once
# per program and input seed, then read from the disk cache.
DEFAULT_REFERENCE_TIMEOUT_S = 600.0
# a worker's address space: a batch-256 layer's inputs, outputs and float64 reference need more
# than 4 GiB; every command that measures shares this default
DEFAULT_MEM_LIMIT_MB = 8192
# Fault injection for tests only: makes the worker crash, hang, exhaust memory or corrupt output.
# The faults strike when the kernel runs.
FAULTS = ("crash", "segfault", "hang", "oom", "wrong_output")
# The error of a timeout in each phase, by the phase's name.
TIMEOUT_ERRORS = {
    "compile": "compile not done within {:g} s; worker killed",
    "reference": "reference not computed within {:g} s; worker killed",
    "run": "kernel run (first call and timing) not done within {:g} s; worker killed",
    "verify": "output not verified within {:g} s; worker killed",
}


def _worker(mem_limit_mb: int, cpus: tuple[int, ...] | None = None) -> Child:
    """A kernels' worker process (`mlirrl_jax.measure.worker`), limiting its own memory and,
    with `cpus`, pinned to those cores."""
    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )
    if cpus:
        env[MEASURE_CPUS] = ",".join(str(c) for c in sorted(set(cpus)))
    return Child(
        lambda r, w: ["-m", "mlirrl_jax.measure.worker", str(r), str(w), str(mem_limit_mb)], env
    )


class Runner:
    """Measures (program, schedule) pairs in a worker process; failures come back as records."""

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        mem_limit_mb: int = DEFAULT_MEM_LIMIT_MB,
        *,
        compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        reference_timeout_s: float = DEFAULT_REFERENCE_TIMEOUT_S,
        gate: TimingGate | None = None,
        cpus: tuple[int, ...] | None = None,
    ):
        """`gate`: shared with the other runners of a job, so that one kernel is timed at a
        time, with the other workers off its cores or paused (`measure.gate`). `cpus`: the
        cores its workers are pinned to (default: this process's)."""
        self.timeout_s = timeout_s  # the kernel's run
        self.compile_timeout_s = compile_timeout_s
        self.reference_timeout_s = reference_timeout_s
        self.mem_limit_mb = mem_limit_mb
        # where the last measurement's reference came from ("memory", "disk" or "computed") and
        # the seconds it took; None if that measurement did not get as far
        self.last_reference: dict | None = None
        self._worker: Child | None = None
        self.workers_started = 0
        self._lock = threading.Lock()  # abort() against a worker being started
        self._aborted = False
        self.gate = gate
        self.cpus = tuple(cpus) if cpus else None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._worker is not None:
            self._forget_worker().close()

    def _forget_worker(self) -> Child:
        """The current worker, no longer this runner's (nor the gate's) to use."""
        worker, self._worker = self._worker, None
        if self.gate is not None:
            self.gate.leave(self)
        return worker

    def abort(self) -> None:
        """Kill the worker now and start no other (a job stopping on Ctrl-C), from any thread:
        a measurement in flight comes back as a crash, a later one raises RuntimeError."""
        with self._lock:
            self._aborted = True
            worker = self._worker
        if worker is not None and worker.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGKILL)

    def _ensure_worker(self) -> Child:
        with self._lock:
            if self._aborted:
                raise RuntimeError("the runner was aborted")
            if self._worker is None or self._worker.process.poll() is not None:
                if self._worker is not None:
                    self._worker.kill()
                self._worker = _worker(self.mem_limit_mb, self.cpus)
                self.workers_started += 1
                if self.gate is not None:
                    self.gate.join(self, self._worker)
            return self._worker

    def measure(
        self,
        program: Program,
        schedule: Schedule | None = None,
        *,
        threads: int = 1,
        runtime: str = "auto",
        method: TimingMethod | None = None,
        timeout_s: float | None = None,
        inject_fault: str | None = None,
    ) -> Measurement:
        """Compile, verify and time `schedule` on `program` (no schedule: the unscheduled baseline);
        `timeout_s` bounds the kernel's run (default: the runner's)."""
        schedule = schedule or Schedule()
        method = method or TimingMethod()
        self.last_reference = None
        record = Measurement(
            status="ok",
            program=program.name,
            program_hash=program.hash,
            schedule=schedule.to_json(),
            schedule_hash=schedule.hash,
            threads=threads,
            method=dataclasses.asdict(method),
            fingerprint=fingerprint(),
            flops=program.flops,
        )
        if inject_fault is not None and inject_fault not in FAULTS:
            raise ConfigError(f"unknown fault {inject_fault!r}; known: {FAULTS}")
        start = time.perf_counter()
        try:
            script = None if schedule.is_empty else transform_script(program, schedule)
        except ScheduleError as exc:
            record.status, record.error = "invalid_schedule", str(exc)
            record.wall_s = time.perf_counter() - start
            return record
        request = {
            "program": program,
            "script": script,
            "threads": threads,
            "runtime": runtime,
            "method": method,
            "inject_fault": inject_fault,
            "gated": self.gate is not None,  # the worker waits for the gate before its run
        }
        limits = {
            "compile": self.compile_timeout_s,
            "reference": self.reference_timeout_s,
            "run": timeout_s or self.timeout_s,
            "verify": timeout_s or self.timeout_s,
        }
        result = self._round_trip(request, limits)
        for key, value in result.items():
            setattr(record, key, value)
        if self.last_reference is not None:
            record.phase_s["reference_s"] = self.last_reference["seconds"]
        record.wall_s = time.perf_counter() - start
        return record

    def _round_trip(self, request: dict, limits: dict[str, float]) -> dict:
        """Send `request` and wait for the reply, each phase the worker reports up to its limit
        in `limits`; a worker that runs over one is killed. A gated request's run phase waits
        for the gate first, and holds it until the timed calls end."""
        worker = self._ensure_worker()
        log_start = worker.log_size()
        phase = "compile"
        progress: dict = {}  # fields the worker sent with its phases: its compile times
        waited = None  # seconds the run phase waited for the gate
        with contextlib.ExitStack() as gate_held:
            try:
                worker.send.send(request)
                while True:
                    message = self._next_message(worker, limits[phase])
                    if message is None:  # alive but silent: a hang
                        worker.kill()
                        self._forget_worker()
                        error = TIMEOUT_ERRORS[phase].format(limits[phase])
                        return {**progress, "status": "timeout", "error": error}
                    if "phase" not in message:
                        break
                    phase = message.pop("phase")
                    self.last_reference = message.pop("reference", self.last_reference)
                    progress.update(message)
                    if phase == "run" and request["gated"]:
                        waited, cpus = gate_held.enter_context(
                            self.gate.timing(self, request["threads"], lambda: self._aborted)
                        )
                        worker.send.send({"go": cpus, "after": self.gate.cpus})
                    elif phase == "verify":
                        gate_held.close()  # timed: the comparison needs no quiet core
                reply = {**progress, **message}
                if waited is not None:
                    reply["phase_s"] = {**reply.get("phase_s", {}), "gate_wait_s": waited}
                if reply["status"] == "oom":  # a worker that ran out of memory is not reused
                    worker.kill()
                    self._forget_worker()
                elif reply.pop("retire_worker", False):
                    worker.close()
                    self._forget_worker()
                return reply
            except GateAborted as exc:
                worker.kill()
                self._forget_worker()
                return {**progress, "status": "crash", "error": str(exc)}
            except (EOFError, BrokenPipeError, ConnectionResetError):
                pass  # the worker died: find out how below
        died = worker.death(log_start, self.mem_limit_mb)
        worker.kill()
        self._forget_worker()
        return {**progress, **died}

    def _next_message(self, worker: Child, limit_s: float) -> dict | None:
        """The worker's next message, or None if it sent none within `limit_s` seconds of its
        own: the time the gate kept it paused does not count."""
        started = time.monotonic()
        paused_before = self.gate.paused_s(self) if self.gate is not None else 0.0
        while True:
            paused = self.gate.paused_s(self) - paused_before if self.gate is not None else 0.0
            left = limit_s - (time.monotonic() - started - paused)
            if left <= 0:
                return None
            # a gated worker is looked at again each second: a pause may have extended it
            if worker.receive.poll(min(left, 1.0) if self.gate is not None else left):
                return worker.receive.recv()


def timeout_phase(record: Measurement) -> str | None:
    """The phase ("compile", "reference" or "run") a timed-out measurement ran over, else None."""
    if record.status != "timeout" or not record.error:
        return None
    for phase, error in TIMEOUT_ERRORS.items():
        if record.error.startswith(error.split("{")[0]):
            return phase
    return None
