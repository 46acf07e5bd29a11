"""The one subprocess harness of measurement: a child process in a session of its own, a pipe
each way, its output in a log file, and a failure record when it dies.

The kernels' worker (`runner.Runner`, serving many requests) and the library baselines'
one-request children (`baselines`) both run through `Child`, so a crash, an abort or running
out of memory reads the same in every record (`death_record`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection


def death_record(code: int, tail: str, mem_limit_mb: int) -> dict:
    """The failure record of a child that died with `code`, its log tail saying why."""
    reason = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    memory_words = ("out of memory", "MemoryError", "std::bad_alloc", "Cannot allocate memory")
    if code == -signal.SIGKILL or any(w in tail for w in memory_words):
        return {"status": "oom", "error": f"{reason} (memory limit {mem_limit_mb} MiB): {tail}"}
    return {"status": "crash", "error": f"{reason}: {tail}" if tail else reason}


class Child:
    """One child process: `python <argv(read_fd, write_fd)>`, reading requests from the fd
    it is given and writing replies to the other."""

    def __init__(self, argv: Callable[[int, int], list[str]], env: dict):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.log = tempfile.NamedTemporaryFile(prefix="mlirrl-worker-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            # the child sets its own limits: no Python runs between fork and exec, which is
            # unsafe in a multithreaded (JAX) parent
            [sys.executable, *argv(to_child_r, from_child_w)],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.send = Connection(to_child_w, readable=False)
        self.receive = Connection(from_child_r, writable=False)

    def log_tail(self, since: int = 0) -> str:
        with open(self.log.name, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        lines = [line for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-6:])[-1500:]

    def log_size(self) -> int:
        return os.path.getsize(self.log.name)

    def death(self, since: int, mem_limit_mb: int) -> dict:
        """The failure record of a child whose pipe broke: its exit code and log tail (from
        offset `since`) say how it died."""
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # closed its pipe but lingers: a crash
            code = -signal.SIGABRT
        return death_record(code, self.log_tail(since), mem_limit_mb)

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        for conn in (self.send, self.receive):
            conn.close()
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)

    def close(self) -> None:
        """Ask the child to stop (a None request), then make sure it has."""
        if self.process.poll() is None:
            try:
                self.send.send(None)
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
