"""Build the `models-v0` suite (`data/suites/models-v0`) from the zoo's models.

    python bench/build_models_suite.py [--imports runs/models]

Imports ResNet-18, MobileNetV2 and the BERT layer of `examples/models/zoo.py` (each once: an
existing import folder with a `model.json` is reused) and writes their distinct layer programs
with `mlirrl_jax.models.suite.build_suite`. The shipped suite is published: rebuilding it must
give the same files (tests/test_models_suite.py pins its hash); a change is a new version.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mlirrl_jax.models.importer import import_model
from mlirrl_jax.models.suite import build_suite

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"resnet18": "resnet18", "mobilenetv2": "mobilenet_v2", "bert": "bert_layer"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--imports", default="runs/models", help="folder of the import folders")
    parser.add_argument("--out", default=str(ROOT / "data" / "suites" / "models-v0"))
    args = parser.parse_args()
    folders = {}
    for model, factory in MODELS.items():
        folder = Path(args.imports) / factory
        if not (folder / "model.json").is_file():
            # models-v0 holds the convolutions as they were (strided ones direct, not gathered)
            import_model(
                f"{ROOT / 'examples' / 'models' / 'zoo.py'}:{factory}", folder, strided="direct"
            )
        folders[model] = folder
    index = build_suite(folders, args.out)
    print(f"{len(index)} programs in {args.out}")


if __name__ == "__main__":
    main()
