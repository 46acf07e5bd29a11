"""A round's update of the surrogate (`RoundUpdater`): scored on what the round measured before
and after, fitted on this machine's rows, refused when it makes the held-back programs worse,
and the round's typed row (`RoundRow`)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import numpy as np

from mlirrl_jax.agent.surrogate import Surrogate
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.records import RoundRow
from mlirrl_jax.regrounding.config import RegroundConfig
from mlirrl_jax.regrounding.measure import RoundMeasurer
from mlirrl_jax.regrounding.plan import Planned
from mlirrl_jax.regrounding.planner import Pools
from mlirrl_jax.regrounding.report import real_speedups
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.adapt import (
    anchor_states,
    scratch_trees,
    surrogate_metrics,
    update_refusal,
)
from mlirrl_jax.surrogate.api import CostModel
from mlirrl_jax.surrogate.dataset import Dataset, load_dataset


class RoundUpdater:
    """Scores and updates the surrogate after a round's measurements."""

    def __init__(
        self,
        config: RegroundConfig,
        pools: Pools,
        measurer: RoundMeasurer,
        prior: Surrogate,
        say=print,
    ):
        self.config = config
        self.pools = pools
        self.measurer = measurer
        self.prior = prior
        self.say = say
        self._prior: CostModel | None = None

    def prior_model(self) -> CostModel:
        if self._prior is None:
            self._prior = CostModel.load(self.prior.path)
        return self._prior

    def update(
        self, round_: int, planned: list[Planned], model: CostModel, folder: Path, target: Path
    ) -> RoundRow:
        """Score `model` on the round's rows, update it on the training programs' rows (the
        held-back ones left out), keep the update only if the held-back error did not grow,
        and save the surrogate the next round trains against into `target`. Returns the
        round's row (its budget and measurement counts are the caller's)."""
        c, by_name, prior = self.config, self.pools.by_name, self.prior_model()
        rng = np.random.default_rng([c.seed, round_, 1])
        learn = sorted({p.program.name for p in planned if p.role == "learn"})
        held = set(rng.permutation(learn)[: int(round(c.held_back * len(learn)))].tolist())
        row = RoundRow(
            round=round_,
            machine_id=self.measurer.machine,
            programs=len(learn),
            held_back_programs=len(held),
            held_back=sorted(held),  # by name: the update never saw their rows
            selection=c.selection,
            update=c.update,
        )
        before, mine = model, {(p.program.hash, p.schedule.hash) for p in planned}
        on_policy = self._rows([by_name[n] for n in learn])
        row.on_policy_before = surrogate_metrics(model, on_policy, mine)
        row.on_policy_prior = surrogate_metrics(prior, on_policy, mine)
        data = self._rows([p for p in self.pools.pool if p.name not in held])
        if data is not None:  # the baseline fitted from scratch, on what `before` knew
            earlier = scratch_trees(data, exclude=mine, seed=c.seed + round_)
            row.on_policy_scratch = surrogate_metrics(earlier, on_policy, mine)
            anchor = anchor_states(c.update, data, prior, c.anchor_share, c.seed + round_)
            started = time.perf_counter()
            model = model.update(
                data,
                c.update_epochs,
                machine_id=self.measurer.machine,
                threads=c.threads,
                anchor=anchor,
                note=f"re-grounding round {round_}",
            )
            row.update_seconds = time.perf_counter() - started
            row.update_rows = len(data)
        held_rows = self._rows([by_name[n] for n in sorted(held)])
        validation = self._rows(self.pools.validation)
        row.held_back_after = surrogate_metrics(model, held_rows, mine)
        row.held_back_before = surrogate_metrics(before, held_rows, mine)
        refusal = update_refusal(row.held_back_before, row.held_back_after)
        row.update_refused = refusal is not None
        if refusal is not None:  # the previous weights stay: an update never makes it worse
            row.refusal = refusal
            model = before
            self.say(f"round {round_}: update refused, the previous weights kept ({refusal})")
        row.held_back_prior = surrogate_metrics(prior, held_rows, mine)
        row.validation = surrogate_metrics(model, validation)
        row.validation_prior = surrogate_metrics(prior, validation)
        if data is not None:  # on every row the update learnt from
            scratch = scratch_trees(data, exclude=set(), seed=c.seed + round_)
            row.held_back_scratch = surrogate_metrics(scratch, held_rows, mine)
            row.validation_scratch = surrogate_metrics(scratch, validation)
        with MeasurementStore(c.store) as store:

            def time_of(p: Program, s: Schedule) -> float | None:
                r = self.measurer.row(store, p.hash, s.hash)
                return r.median_s if r is not None and r.status == "ok" else None

            row = dataclasses.replace(row, **real_speedups(planned, folder, time_of))
        tmp = target.with_name("surrogate.tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # a save a kill cut short
        model.save(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        return row

    def _rows(self, programs: list[Program]) -> Dataset | None:
        """This machine's verified rows of `programs` at the rounds' thread count (None: none
        yet)."""
        hashes = {p.hash for p in programs}
        with MeasurementStore(self.config.store) as store:
            if not any(
                r["threads"] == self.config.threads
                for h in hashes
                for r in store.rows(machine_id=self.measurer.machine, status="ok", program_hash=h)
            ):
                return None
            return load_dataset(
                store,
                self.measurer.machine,
                threads=self.config.threads,
                programs=hashes,
                table_programs=self.pools.programs,
            )
