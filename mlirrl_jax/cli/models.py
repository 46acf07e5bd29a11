"""`mlirrl-jax import-model SOURCE --out DIR` and `mlirrl-jax optimize-model DIR --out DIR`: a
whole PyTorch or ONNX model (`mlirrl_jax.models`); they need the `models` extra."""

from __future__ import annotations

import logging

from mlirrl_jax.cli.options import POSITIVE_INT, add_worker_options, thread_counts
from mlirrl_jax.models.rewrite import STRIDED_FORMS
from mlirrl_jax.runfolder import run_folder

log = logging.getLogger("mlirrl_jax.models")


def _shape(text: str) -> list[int]:
    import argparse

    try:
        shape = [int(x) for x in text.replace("x", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sizes like 1,3,224,224") from None
    if not shape or min(shape) < 1:
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
    p.add_argument("--out", required=True, help="folder for the layers' programs and the report")
    p.add_argument(
        "--input-shape",
        type=_shape,
        help="the example input's shape, e.g. 1,3,224,224 (default: the file's INPUT_SHAPES "
        "entry, or the ONNX model's own)",
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

    p = sub.add_parser(
        "optimize-model",
        help="optimize every layer of an imported model and compare the whole model with "
        "PyTorch and XLA",
    )
    p.add_argument("model", help="a folder written by import-model")
    p.add_argument("--out", required=True, help="folder for the per-layer rows, table and plot")
    p.add_argument("--budget", type=POSITIVE_INT, default=4, help="agent schedules per layer (4)")
    p.add_argument("--threads", type=thread_counts, default=(1,), help="e.g. 1,2 (default 1)")
    p.add_argument("--run", help="the agent's run (default: adapted to this machine, else shipped)")
    p.add_argument("--no-xla", action="store_true", help="skip XLA:CPU on the layers")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch eager and torch.compile")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile only")
    p.add_argument(
        "--search-top",
        type=int,
        default=0,
        help="also run the evolutionary search on this many layers that take most of the "
        "model's time (0: none)",
    )
    p.add_argument(
        "--search-budget", type=POSITIVE_INT, default=32, help="measurements per searched layer"
    )
    add_worker_options(p)
    p.set_defaults(func=run_optimize)


def run_import(args) -> int:
    from mlirrl_jax.models.importer import import_model

    with run_folder(args.out, lambda out: (out / "model.json").is_file(), args.command_line):
        result = import_model(
            args.source,
            args.out,
            input_shape=args.input_shape,
            max_group=args.max_group,
            strided=args.strided_conv,
            check=not args.no_check,
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
    print(f"wrote {args.out}: model.json, report.md, layers/*.mlir")
    return 0 if result.check_ok is not False else 1


def run_optimize(args) -> int:
    from mlirrl_jax.models.optimize import optimize_model

    # summary.json is written last; layers.jsonl holds what a rerun resumes from
    keep = lambda out: (out / "layers.jsonl").is_file()  # noqa: E731
    with run_folder(args.out, keep, args.command_line):
        summary = optimize_model(
            args.model,
            args.out,
            budget=args.budget,
            threads=args.threads,
            run=args.run,
            timeout_s=args.timeout,
            mem_limit_mb=args.mem_limit,
            seed=args.seed,
            xla=not args.no_xla,
            torch_baselines=not args.no_torch,
            torch_compile=not args.no_compile,
            search_top=args.search_top,
            search_budget=args.search_budget,
            say=log.info,
        )
    print(args.out.rstrip("/") + "/table.md:")
    text = (__import__("pathlib").Path(args.out) / "table.md").read_text()
    print(text.split("\n## Layers")[0].rstrip())
    print(
        f"machine {summary.machine_id}; wrote {args.out}: table.md, time_by_layer.png, summary.json"
    )
    return 0
