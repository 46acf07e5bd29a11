"""Packages that export their modules' names, each module imported at first use
(`lazy_exports`): importing one light module of such a package (its config, say) loads no
other, so the command line reads configs without starting JAX."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, where: dict[str, str]):
    """A package's `__getattr__` and `__dir__` for the names in `where` (name -> the module
    that defines it)."""

    def __getattr__(name: str):
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(where)

    return __getattr__, __dir__
