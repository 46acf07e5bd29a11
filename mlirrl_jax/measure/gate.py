"""One kernel timed at a time on this machine, on cores no other worker of the job runs on
(`TimingGate`).

A measurement is mostly timed runs, compiling and computing references. Several workers of
one job share a gate: they compile, compute references and verify on every core, but only the
gate's holder times a kernel, on the first `threads` of the job's cores (`timed_cpus`). While
it does, every other worker is moved to the remaining cores, where it goes on compiling; when
no core remains (two threads on two cores), the others are paused instead (SIGSTOP to the
process group, SIGCONT after). The time a worker spends paused is not counted against its own
phase limits (`paused_s`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from mlirrl_jax.measure.child import Child

MEASURE_CPUS = "MLIRRL_MEASURE_CPUS"  # cores (comma-separated) a worker pins itself to


class GateAborted(RuntimeError):
    """The runner waiting for the gate was aborted."""


def job_cpus() -> tuple[int, ...]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def confine(pid: int, cpus: tuple[int, ...]) -> None:
    """Every thread of process `pid` on `cpus` (Linux; elsewhere a no-op); a thread or process
    that ended meanwhile is skipped."""
    if not hasattr(os, "sched_setaffinity"):
        return
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return
    for tid in threads:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.sched_setaffinity(tid, cpus)


class TimingGate:
    """Shared by the runners of one job: `timing(member, threads)` while a member's kernel runs."""

    def __init__(self, cpus: tuple[int, ...] = ()) -> None:
        self.cpus = tuple(sorted(set(cpus))) or job_cpus()  # the job's workers' cores
        self._changed = threading.Condition()
        self._holder: object | None = None
        self._spare: tuple[int, ...] = ()  # where the others run while the holder times
        self._members: dict[object, Child] = {}  # each runner's current worker
        self._paused: dict[object, float] = {}  # seconds each member was paused, past pauses
        self._paused_since = 0.0  # when the current holder paused the others

    @property
    def holder(self) -> object | None:
        """The member whose kernel is being timed, if any."""
        return self._holder

    def timed_cpus(self, threads: int) -> tuple[int, ...]:
        """The cores a kernel of `threads` threads is timed on."""
        return self.cpus[: max(1, threads)]

    def join(self, member: object, child: Child) -> None:
        """`member`'s worker is now `child`; moved aside (or paused) at once if another member
        is timing."""
        with self._changed:
            self._members[member] = child
            self._paused.setdefault(member, 0.0)
            if self._holder is not None and self._holder is not member:
                self._step_aside(child)

    def leave(self, member: object) -> None:
        with self._changed:
            self._members.pop(member, None)
            self._paused.pop(member, None)

    def paused_s(self, member: object) -> float:
        """Seconds `member` has been paused since it joined (a running total: the difference
        of two readings is the pause in between)."""
        with self._changed:
            total = self._paused.get(member, 0.0)
            if self._holder is not None and self._holder is not member and not self._spare:
                total += time.monotonic() - self._paused_since
            return total

    @contextlib.contextmanager
    def timing(
        self, member: object, threads: int, aborted: Callable[[], bool]
    ) -> Iterator[tuple[float, tuple[int, ...]]]:
        """Hold the gate while `member` times its kernel of `threads` threads: wait for it
        (until `aborted()`), move every other member's worker off the timed cores (or pause
        it), bring them back on leaving. Yields the seconds waited and the timed cores."""
        started = time.monotonic()
        timed = self.timed_cpus(threads)
        with self._changed:
            while self._holder is not None:
                if aborted():
                    raise GateAborted("the runner was aborted while waiting to time its kernel")
                self._changed.wait(0.2)
            self._holder = member
            self._spare = tuple(c for c in self.cpus if c not in timed)
            self._paused_since = time.monotonic()
            for other, child in self._members.items():
                if other is not member:
                    self._step_aside(child)
        try:
            yield time.monotonic() - started, timed
        finally:
            with self._changed:
                paused = time.monotonic() - self._paused_since
                for other, child in self._members.items():
                    if other is member:
                        continue
                    if self._spare:
                        confine(child.process.pid, self.cpus)
                    else:
                        _signal(child, signal.SIGCONT)
                        self._paused[other] = self._paused.get(other, 0.0) + paused
                self._holder = None
                self._spare = ()
                self._changed.notify_all()

    def _step_aside(self, child: Child) -> None:
        """Off the holder's cores: onto the spare ones, else paused."""
        if self._spare:
            confine(child.process.pid, self._spare)
        else:
            _signal(child, signal.SIGSTOP)


def _signal(child: Child, sig: int) -> None:
    """Send `sig` to the worker's process group (its own session), if it still lives."""
    if child.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.process.pid, sig)
