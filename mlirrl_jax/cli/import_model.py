"""`mlirrl-jax import-model SOURCE --out DIR`: a PyTorch or ONNX model lowered to Linalg, cut
into one program per layer and checked against the model (`mlirrl_jax.models.importer`); it
needs the `models` extra."""

from __future__ import annotations

import argparse
import logging

from mlirrl_jax.cli.options import POSITIVE_INT
from mlirrl_jax.models.rewrite import STRIDED_FORMS
from mlirrl_jax.runfolder import run_folder

log = logging.getLogger("mlirrl_jax.models")


def input_shape(text: str) -> list[int]:
    """`--input-shape`: positive sizes such as 1,3,224,224 (or 1x3x224x224)."""
    sizes = text.replace("x", ",").split(",")
    if any(not size.strip() for size in sizes):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a size is missing; expected sizes like 1,3,224,224"
        )
    try:
        shape = [int(size) for size in sizes]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sizes like 1,3,224,224") from None
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive sizes like 1,3,224,224")
    return shape


def register(sub) -> None:
    p = sub.add_parser(
        "import-model",
        help="lower a PyTorch or ONNX model to Linalg and cut it into one program per layer",
    )
    p.add_argument(
        "source",
        help="FILE.py:FACTORY (a function returning the module), torchvision:NAME or FILE.onnx",
    )
    p.add_argument(
        "--out",
        required=True,
        help="a new folder for the layers' programs and the report (one holding an import is "
        "refused; see --replace)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="remove an import already in --out, whole, before importing (never in part: a "
        "run of optimize-model on the old import then refuses to resume on the new one)",
    )
    p.add_argument(
        "--input-shape",
        type=input_shape,
        help="the example input's shape, e.g. 1,3,224,224 (default: the file's INPUT_SHAPES "
        "entry, or the ONNX model's own, which a shape given must agree with)",
    )
    p.add_argument(
        "--max-group", type=POSITIVE_INT, default=4, help="Linalg ops of one layer at most (4)"
    )
    p.add_argument(
        "--strided-conv",
        choices=STRIDED_FORMS,
        default=STRIDED_FORMS[0],
        help="strided NCHW convolutions as a gather (im2col) and a contraction, which "
        "vectorize with unit stride (default), or as they are (direct)",
    )
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip replaying the programs against the model's own output",
    )
    p.set_defaults(func=run_import)


def run_import(args) -> int:
    from mlirrl_jax.models.importer import import_model

    with run_folder(args.out, lambda out: (out / "model.json").is_file(), args.command_line):
        # each flag to the parameter of its name
        result = import_model(
            args.source,
            args.out,
            input_shape=args.input_shape,
            max_group=args.max_group,
            strided=args.strided_conv,
            check=not args.no_check,
            replace=args.replace,
            say=log.info,
        )
    by_status: dict[str, int] = {}
    for layer in result.layers:
        by_status[layer.status] = by_status.get(layer.status, 0) + 1
    print(
        f"{result.source}: {len(result.layers)} distinct layers ({result.occurrences} in the "
        f"model): " + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    )
    for layer in result.layers:
        if layer.status != "program":
            print(f"  {layer.name}: {layer.status}: {layer.reason}")
    for name, count in sorted(result.left_out.items()):
        print(f"  left out: {name} x{count}: {result.why_left_out[name]}")
    if result.check_note:
        print(f"the cut could not be checked against the model: {result.check_note}")
    elif result.check_ok is not None:
        verdict = "agrees with" if result.check_ok else "DOES NOT agree with"
        print(f"the cut {verdict} the model's own output ({result.check_error:.1e} relative)")
    print(f"wrote {args.out} (cut {result.cut_hash}): model.json, report.md, layers/*.mlir")
    return 0 if result.check_ok is not False else 1
