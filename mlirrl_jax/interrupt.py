"""Ctrl-C that stops a job wherever it is.

Python raises KeyboardInterrupt at the next bytecode the main thread runs, wherever that is. When
that is a gc callback (JAX registers one that frees XLA buffers), the exception is printed and
dropped, and a collection job interrupted during its start-up ran on to its end. Inside
`stop_on_ctrl_c()`, SIGINT also sets a flag that `check_stop()` turns into a KeyboardInterrupt
again at a job's safe points (between tasks, after start-up): a swallowed one only delays the
stop until the next of them. In such a callback (JAX's gc callback, a `__del__`) the handler
only sets the flag: raising there would print a traceback and be dropped anyway.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_stop = threading.Event()


# functions in which an exception is printed as "Exception ignored" and dropped
_SWALLOWED = frozenset({"_xla_gc_callback", "__del__"})


def _in_swallowing_callback(frame, depth: int = 8) -> bool:
    while frame is not None and depth:
        if frame.f_code.co_name in _SWALLOWED:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def _on_sigint(signum, frame) -> None:
    _stop.set()
    if not _in_swallowing_callback(frame):
        raise KeyboardInterrupt


@contextlib.contextmanager
def stop_on_ctrl_c() -> Iterator[None]:
    """Within the block, Ctrl-C raises KeyboardInterrupt and `check_stop()` raises it again."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; SIGINT goes on as it was
        return
    _stop.clear()
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _stop.clear()


def check_stop() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed inside `stop_on_ctrl_c()`."""
    if _stop.is_set():
        raise KeyboardInterrupt
