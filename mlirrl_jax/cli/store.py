"""`mlirrl-jax store summary|export|import|card`: a measurement store's contents, its Parquet
exchange files and its dataset card."""

from __future__ import annotations

import json
from pathlib import Path

from mlirrl_jax.shipped import default_store


def register(sub) -> None:
    p = sub.add_parser("store", help="summarize, export or import a measurement store")
    p.add_argument("action", choices=["summary", "export", "import", "card"])
    p.add_argument("file", nargs="?", help="Parquet file (export/import), Markdown file (card)")
    p.add_argument(
        "--machine", help="machine id: of the card (default: this one), of an export (default: all)"
    )
    p.add_argument("--title", default="Measurement dataset")
    p.add_argument("--command", help="the command that collected the data, for the card")
    p.add_argument(
        "--store", default=default_store(), help=f"the measurement store ({default_store()})"
    )
    p.add_argument("--allow-other-machines", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.store import MeasurementStore

    with MeasurementStore(args.store, create=args.action == "import") as store:
        if args.action == "summary":
            print(json.dumps(store.summary(), indent=1))
        elif args.action == "export":
            print(f"exported {store.export_parquet(args.file, args.machine)} rows to {args.file}")
        elif args.action == "import":
            done = store.import_parquet(args.file, allow_other_machines=args.allow_other_machines)
            print(
                f"imported {args.file}: {done.new} new rows, {done.merged} merged into stored "
                f"rows, {done.skipped} skipped (their measurements were imported before)"
            )
        elif args.action == "card":
            machine = args.machine or machine_fingerprint()["machine_id"]
            text = store.card(machine, args.title, args.command or "")
            Path(args.file).write_text(text) if args.file else print(text)
    return 0
