"""The layout's promises, read from the source: no import cycle, small modules, thin commands."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mlirrl_jax",)
LIBRARY_LINES = 500
COMMAND_LINES = 150
# no module waits for a split: every one is within its limit
PENDING_SPLIT: dict[str, int] = {}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports anywhere (at the top or inside a function)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {n for n in names if n in modules}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_back_through_others():
    modules = _modules()
    # a package imports its modules only to re-export them: its own edges are not a cycle
    graph = {
        name: {m for m in _imports(path, modules) if not m.startswith(name + ".")}
        for name, path in modules.items()
    }
    assert _cycles(graph) == []
    # and the checker finds a cycle where there is one
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_modules_are_small_and_commands_thin():
    long = {}
    for name, path in _modules().items():
        lines = len(path.read_text().splitlines())
        rel = str(path.relative_to(ROOT))
        command = name.startswith("mlirrl_jax.cli.") and name != "mlirrl_jax.cli.options"
        limit = COMMAND_LINES if command else LIBRARY_LINES
        if lines > PENDING_SPLIT.get(rel, limit):
            long[rel] = lines
    assert long == {}, f"over their limit ({LIBRARY_LINES}, commands {COMMAND_LINES}): {long}"


def test_the_install_lists_every_package():
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert listed == found | {"mlirrl_jax.data"}


def _python(code: str) -> str:
    """`code` run by a fresh interpreter in the checkout: its output (it must exit 0)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_public_api_loads_from_the_package_without_starting_jax():
    code = (
        "import sys, mlirrl_jax; assert 'jax' not in sys.modules; "
        "from mlirrl_jax import Kind, Runner, Schedule, Transform, heuristic_schedule, "
        "load_program; assert 'jax' not in sys.modules; "
        "from mlirrl_jax import Agent; print(sorted(mlirrl_jax.__all__))"
    )
    out = _python(code)
    assert "Agent" in out and "load_program" in out


def test_the_command_line_reads_the_configs_without_starting_jax():
    """Every command's flags, those made from config fields with their documentation
    (`util.configs.option`) included, are built from the imported configs, and JAX stays
    unloaded: each config module imports nothing of its package but itself."""
    code = (
        "import sys; from mlirrl_jax.cli import build_parser; "
        "text = build_parser()._subparsers._group_actions[0].choices['validate'].format_help(); "
        "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if 'jax' in m)[:5]; "
        "print(text)"
    )
    # a field's documentation is its flag's help, its default shown
    shown = " ".join(_python(code).split())
    assert "the larger random search: random_factor * k measurements (default: 8)" in shown


def test_every_flag_made_from_a_config_field_is_documented():
    from dataclasses import fields

    from mlirrl_jax.collect.config import CollectConfig
    from mlirrl_jax.demo import DemoConfig
    from mlirrl_jax.regrounding.config import RegroundConfig
    from mlirrl_jax.surrogate.config import ModelConfig, TrainConfig
    from mlirrl_jax.util.configs import doc_of
    from mlirrl_jax.validation.config import ValidationConfig

    flagged = [  # each config, and the command module's list of the fields it makes flags of
        (CollectConfig, "collect", "FIELDS"),
        (DemoConfig, "demo", "FIELDS"),
        (TrainConfig, "fit", "TRAIN_FIELDS"),
        (ModelConfig, "fit", "MODEL_FIELDS"),
        (RegroundConfig, "regrounding", "REGROUNDING_FIELDS"),
        (ValidationConfig, "validate", "FIELDS"),
    ]
    import importlib

    for cls, command, constant in flagged:
        names = set(getattr(importlib.import_module(f"mlirrl_jax.cli.{command}"), constant))
        documented = {f.name for f in fields(cls) if doc_of(f)}
        assert names <= documented, (cls.__name__, sorted(names - documented))
