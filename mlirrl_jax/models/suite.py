"""The `models-v0` suite: the distinct layers of imported models, as versioned programs.

`build_suite(imports, out)` writes one `.mlir` per distinct layer program of the imported models
(`import-model` folders) and `index.json` (name, model, layer, count in the model, ops), in a
fixed order. A layer whose program equals one of a built-in suite's test programs (by the
program's hash) is left out, so that the test split stays unseen. `bench/build_models_suite.py`
built the shipped copy (`data/suites/models-v0`) from `examples/models/zoo.py`'s ResNet-18,
MobileNetV2 and BERT layer; `programs.suites` reads it. A published suite never changes: a
different model list or cut makes a new version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlirrl_jax.models.importer import ModelImport
from mlirrl_jax.runfolder import write_atomic


def _test_hashes() -> set[str]:
    from mlirrl_jax.programs import suites
    from mlirrl_jax.programs.ir import parse_program

    hashes = set()
    for name in suites.list_suites():
        if name.startswith("models-"):
            continue
        for entry in suites.split(name, "test"):
            hashes.add(parse_program(entry.text, entry.uri).hash)
    return hashes


def build_suite(imports: dict[str, str | os.PathLike], out: str | os.PathLike) -> list[dict]:
    """Write the suite from `imports` (model name -> import folder) into `out`; its index."""
    from mlirrl_jax.programs.ir import load_program

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    held_out = _test_hashes()
    index, seen = [], set()
    for model, folder in imports.items():
        imported = ModelImport.load(folder)
        for layer in imported.layers:
            if layer.status != "program":
                continue
            text = (Path(folder) / layer.path).read_text()
            program = load_program(text, layer.name)
            if program.hash in seen or program.hash in held_out:
                continue
            seen.add(program.hash)
            name = f"{model}_{layer.name}"
            write_atomic(out / f"{name}.mlir", text)
            index.append(
                {
                    "name": name,
                    "model": model,
                    "layer": layer.name,
                    "count": layer.count,
                    "flops": program.flops,
                }
            )
    write_atomic(out / "index.json", json.dumps(index, indent=1))
    return index
