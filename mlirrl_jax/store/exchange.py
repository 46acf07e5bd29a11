"""The store's exchange with other stores and people: Parquet export and idempotent import,
and the data card of one machine's measurements (a mixin of `MeasurementStore`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from mlirrl_jax.actions import ACTION_SPACE_VERSION
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.profile import MachineProfile
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store.rows import (
    exported_shares,
    merged_rows,
    rest_share,
    row_lineage,
    row_provenance,
    share_of,
)
from mlirrl_jax.store.schema import (
    COLUMNS,
    MAX_SAMPLES,
    PROFILES_KEY,
    ImportReport,
    Share,
    StoreError,
)


class Exchange:
    """Parquet export and import, and data cards, on a `MeasurementStore`'s database."""

    def card(self, machine_id: str, title: str, command: str) -> str:
        """A data card (Markdown) for one machine's measurements."""
        rows = list(self.rows(machine_id=machine_id))
        if not rows:
            raise StoreError(f"no measurements of machine {machine_id}")
        fingerprint = rows[-1]["fingerprint"]
        machine, toolchain = fingerprint["machine"], fingerprint["toolchain"]
        verified = [r for r in rows if r["status"] == "ok"]
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        baselines = sum(1 for r in verified if r["schedule"] == {"format": 1, "ops": []})
        programs = {r["program_hash"] for r in verified}
        sampled = {r["program_hash"] for r in verified if r["schedule"]["ops"]}
        methods = {json.dumps(r["method"], sort_keys=True) for r in rows}
        first, last = min(r["created_at"] for r in rows), max(r["updated_at"] for r in rows)
        counts: dict[int, int] = {}
        for r in verified:
            counts[r["threads"]] = counts.get(r["threads"], 0) + 1
        by_threads = ", ".join(f"{t}: {n} verified rows" for t, n in sorted(counts.items()))
        recorded = self.machine_profiles().get(machine_id)
        profile = (
            "not recorded"
            if recorded is None
            else ", ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in recorded.to_json().items()
                if k not in ("machine_id", "sources")
            )
        )
        day = lambda t: time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))  # noqa: E731
        return "\n".join(
            [
                f"# {title}",
                "",
                f"Measurements of machine `{machine_id}`; times are only comparable on this machine.",
                "",
                "| | |",
                "|---|---|",
                f"| CPU | {machine['cpu_model']} ({machine['arch']}, {machine['cores']} cores) |",
                f"| ISA flags | {', '.join(machine['isa_flags'])} |",
                f"| caches | {', '.join(f'{k} {v}' for k, v in machine['caches'].items())} |",
                f"| toolchain | {', '.join(f'{k} {v}' for k, v in toolchain.items() if k != 'toolchain_id')} |",
                f"| collected | {day(first)} to {day(last)} UTC |",
                f"| rows | {len(rows)}: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))} |",
                f"| verified | {len(verified)} over {len(programs)} programs; {baselines} baselines; "
                f"sampled schedules on {len(sampled)} programs |",
                f"| threads per kernel | {by_threads} |",
                f"| action space | version {ACTION_SPACE_VERSION} (of the code that wrote this card; "
                "rows measured earlier may use a subset of it) |",
                f"| machine profile | {profile} |",
                f"| timing method | {'; '.join(sorted(methods))} |",
                "",
                f"Collected with: `{command}`",
                "",
                "Each row: program (hash, name, MLIR in the programs table), schedule (JSON, hash),",
                "machine and toolchain fingerprint, timing method, median / min / spread of the run time,",
                "whether the output matched the NumPy reference, the failure reason if any, timestamps.",
                "Failures are kept as data: crash, timeout, oom, wrong_output, compile_error.",
                "",
                "Use: `mlirrl-jax store import <this parquet> --store data/measurements.db`, then",
                "`mlirrl-jax fit-cost-model --store data/measurements.db`. On another machine,",
                "collect that machine's own data: times do not transfer.",
                "",
            ]
        )

    # -- exchange
    def export_parquet(self, path: str | Path, machine_id: str | None = None) -> int:
        """Write measurements (and their programs) to a Parquet file; returns the row count.

        Compact, for shipped seeds: rows grouped by program, floats byte-stream split, zstd at
        its strongest level; `schedule_hash` is left out, as `Schedule.loads(schedule).hash`
        gives it back (`import_parquet` does so), and it is the one incompressible column.
        `provenance` holds each row's shares by origin but its lineage's (`Share`), so that
        importing the file again, or a later export, adds only what is new. The schema's
        metadata (`PROFILES_KEY`) holds the profiles of the rows' machines."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        recorded: dict[int, dict[str, Share]] = {}
        for o in self._db.execute("SELECT * FROM origins"):
            recorded.setdefault(o["measurement_id"], {})[o["origin"]] = share_of(o)
        rows = list(
            self._db.execute(
                "SELECT m.*, p.mlir AS program_mlir, p.flops AS program_flops FROM measurements m "
                "JOIN programs p USING (program_hash)"
                + (" WHERE m.machine_id=?" if machine_id else "")
                + " ORDER BY m.program_hash, m.id",
                (machine_id,) if machine_id else (),
            )
        )
        names = [c for c in (*COLUMNS, "program_mlir", "program_flops") if c != "schedule_hash"]
        columns = {n: [r[n] for r in rows] for n in names}
        columns["provenance"] = [
            row_provenance(r, self._shares(r, recorded.get(r["id"], {}))) for r in rows
        ]
        table = pa.table(columns)
        profiles = self._profiles_of(set(columns["machine_id"]))
        table = table.replace_schema_metadata(
            {PROFILES_KEY: json.dumps([p.to_json() for p in profiles], sort_keys=True)}
        )
        floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
        pq.write_table(
            table,
            str(path),
            compression="zstd",
            compression_level=19,
            use_dictionary=[n for n in columns if n not in floats],
            use_byte_stream_split=floats,
        )
        from mlirrl_jax import integrity

        integrity.seal_file(path)  # its sidecar checksum, which `import_parquet` checks
        return len(rows)

    def import_parquet(
        self,
        path: str | Path,
        allow_other_machines: bool = False,
        this_machine: str | None = None,
    ) -> ImportReport:
        """Merge a Parquet export in, each measurement once however often it comes.

        Rows of this machine (`this_machine`, by default the fingerprint of the one running)
        always come in. Rows of any other machine come in only with `allow_other_machines`,
        whatever the store already holds, and then sit beside this machine's rows under their
        own machine id: nothing reads them unless asked for that machine by name.

        The machines' profiles come with the rows: the file's (`export_parquet`), else known
        ones; a profile the store has recorded stays as it is.

        A row brings only what its origins have beyond what the store holds of them, their
        newest samples. The limit: a store of schema 1 recorded no origins, so the rows it
        merged from an import count as its own (again, beside the file they came from), and
        those it copied whole share their origin's lineage with what it measured after.
        """
        import pyarrow.parquet as pq

        from mlirrl_jax import integrity

        integrity.verify_file(path, "export it again (`mlirrl-jax store export`)")
        read = pq.read_table(str(path))
        records = read.to_pylist()
        given_profiles = {
            p["machine_id"]: MachineProfile.from_json(p)
            for p in json.loads((read.schema.metadata or {}).get(PROFILES_KEY, b"[]"))
        }
        for r in records:  # compact exports leave the derivable schedule hash out
            if r.get("schedule_hash") is None:
                r["schedule_hash"] = Schedule.loads(r["schedule"]).hash
        this_machine = this_machine or machine_fingerprint()["machine_id"]
        others = sorted({r["machine_id"] for r in records} - {this_machine})
        if others and not allow_other_machines:
            counts = {m: sum(r["machine_id"] == m for r in records) for m in others}
            raise StoreError(
                f"{path} holds {sum(counts.values())} measurements of other machine(s) "
                f"{', '.join(f'{m} ({n} rows)' for m, n in counts.items())}; this machine is "
                f"{this_machine}. Times from different machines do not mix silently: import "
                "them with `store import --allow-other-machines` (allow_other_machines=True "
                "from Python) to keep them beside this machine's rows, under their own id"
            )
        report = ImportReport()
        imported = {r["machine_id"] for r in records}
        # the file's profiles; a machine it gives none of (an export of schema 2) gets a known
        # one, if any
        profiles = [given_profiles[m] for m in sorted(imported & set(given_profiles))]
        profiles += self._profiles_to_record(imported - set(given_profiles))
        with self._transaction():
            self._record_profiles(profiles)
            for r in records:
                self._db.execute(
                    "INSERT OR IGNORE INTO programs VALUES (?, ?, ?, ?, ?)",
                    (
                        r["program_hash"],
                        r["program_name"],
                        r["program_mlir"],
                        r["program_flops"],
                        r["created_at"],
                    ),
                )
                old = self._db.execute(
                    "SELECT * FROM measurements WHERE program_hash=? AND schedule_hash=? AND machine_id=? AND threads=?",
                    (r["program_hash"], r["schedule_hash"], r["machine_id"], r["threads"]),
                ).fetchone()
                recorded = {} if old is None else self._recorded(old["id"])
                # a row born elsewhere holds this store's own measurements under its id
                own = self.store_id if old is None else self._own_origin(old, recorded)
                held = {} if old is None else self._shares(old, recorded)
                given = exported_shares(r)
                if old is None:  # its lineage is recorded, even empty: the row was born there
                    given.setdefault(row_lineage(r), Share(0, 0, []))
                # what each origin has beyond what this store holds of it: a file imported
                # again adds nothing, a later export of the same store only its newer part
                measured = failed = 0
                samples: list[float] = []
                for origin, share in given.items():
                    had = held.get(origin, Share(0, 0, []))
                    more = share.measured - had.measured
                    if more > 0:
                        more_failed = max(0, share.failed - had.failed)
                        measured, failed = measured + more, failed + more_failed
                        verified = more - more_failed  # an origin's newest samples are new
                        samples += share.samples[-verified:] if verified > 0 else []
                if measured == 0:
                    report.skipped += 1
                    continue
                contribution = {c: r[c] for c in COLUMNS}
                contribution.update(
                    n_measured=measured, n_failed=failed, samples=json.dumps(samples[-MAX_SAMPLES:])
                )
                if old is None:
                    row_id = self._db.execute(
                        f"INSERT INTO measurements ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                        [contribution[c] for c in COLUMNS],
                    ).lastrowid
                    report.new += 1
                else:
                    merged = merged_rows(dict(old), contribution)
                    self._db.execute(
                        f"UPDATE measurements SET {', '.join(f'{c}=?' for c in COLUMNS)} WHERE id=?",
                        [merged[c] for c in COLUMNS] + [old["id"]],
                    )
                    row_id = old["id"]
                    report.merged += 1
                self._db.executemany(  # the newer shares; this store's own is never recorded
                    "INSERT OR REPLACE INTO origins VALUES (?, ?, ?, ?, ?)",
                    [
                        (row_id, o, share.measured, share.failed, json.dumps(share.samples))
                        for o, share in given.items()
                        if o != own and (o not in held or share.measured > held[o].measured)
                    ],
                )
        return report

    def _recorded(self, row_id: int) -> dict[str, Share]:
        """The shares imports brought a stored row, by origin."""
        return {
            o["origin"]: share_of(o)
            for o in self._db.execute("SELECT * FROM origins WHERE measurement_id=?", (row_id,))
        }

    def _shares(self, row, recorded: dict[str, Share]) -> dict[str, Share]:
        """A stored row's shares by origin: those imports `recorded`, and its own."""
        return {**recorded, self._own_origin(row, recorded): rest_share(row, recorded)}

    def _own_origin(self, row, recorded: dict[str, Share]) -> str:
        """The origin a stored row's own measurements (taken here) are credited to: the row's
        lineage if it was born here, else this store's id (an import recorded the lineage)."""
        lineage = row_lineage(row)
        return self.store_id if lineage in recorded else lineage
