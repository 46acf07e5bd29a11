"""Ctrl-C that stops a job wherever it is.

Python raises KeyboardInterrupt at the next bytecode the main thread runs, wherever that is. When
that is a gc callback (JAX registers one that frees XLA buffers), the exception is printed and
dropped, and a collection job interrupted during its start-up ran on to its end. Inside
`stop_on_ctrl_c()`, SIGINT also sets a flag that `check_stop()` turns into a KeyboardInterrupt
again at a job's safe points (between tasks, after start-up): a swallowed one only delays the
stop until the next of them. In such a callback (JAX's gc callback, a `__del__`) the handler
only sets the flag: raising there would print a traceback and be dropped anyway.

Nor does it raise while JAX compiles: XLA compiles on a thread of its own while the main thread
waits, and an interrupt raised in that wait would leave the compilation running while the
interpreter exits and frees the XLA client under it (a segmentation fault). The interrupt is
raised instead when the compilation ends, from JAX's compile-time event.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator

_stop = threading.Event()


# functions in which an exception is printed as "Exception ignored" and dropped
_SWALLOWED = frozenset({"_xla_gc_callback", "__del__"})
# JAX's compilation (or its load from the persistent cache), which waits on XLA's threads
_COMPILING = "compile_or_get_cached"
# JAX's event recorded when `_COMPILING` has returned
_COMPILED_EVENT = "/jax/core/compile/backend_compile_duration"


def _deferring_function(frame, depth: int = 8) -> str | None:
    """The function on the stack in which the interrupt must not be raised, if any."""
    while frame is not None and depth:
        if frame.f_code.co_name in _SWALLOWED or frame.f_code.co_name == _COMPILING:
            return frame.f_code.co_name
        frame, depth = frame.f_back, depth - 1
    return None


@functools.cache
def _stop_after_compilations() -> None:
    """Have every JAX compilation that ends raise a pending interrupt (`check_stop`)."""
    import jax.monitoring

    def compiled(event: str, duration: float, **kwargs) -> None:
        # the main thread's compilations only: the interrupt is the main thread's to raise
        if event == _COMPILED_EVENT and threading.current_thread() is threading.main_thread():
            check_stop()

    jax.monitoring.register_event_duration_secs_listener(compiled)


def _on_sigint(signum, frame) -> None:
    _stop.set()
    deferring = _deferring_function(frame)
    if deferring == _COMPILING:
        _stop_after_compilations()
    elif deferring is None:
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
