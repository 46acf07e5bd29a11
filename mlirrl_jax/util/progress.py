"""Progress bars, which only the command line shows.

The library reports long work through `progress_bar`: a tqdm bar that stays silent unless the
command line has turned bars on (`show_progress`, off with `-q`). Messages go through
`logging` (the `mlirrl_jax` logger)."""

from __future__ import annotations

from tqdm import tqdm

_shown = False


def show_progress(on: bool = True) -> None:
    """Turn the library's progress bars on or off (off until the command line turns them on)."""
    global _shown
    _shown = on


def progress_bar(iterable=None, disable: bool = False, **kwargs) -> tqdm:
    """A tqdm bar (tqdm's arguments), shown only when bars are on."""
    return tqdm(iterable, disable=disable or not _shown, **kwargs)
