"""The in-process engine: all sites in one process, rounds of local work and aggregation.

The server side is a :class:`~medfed.federation.coordinator.Coordinator`, each site a
:class:`~medfed.federation.site.SiteWorker`; the Flower apps drive the same two classes, so the
same seed and sites give the same figures in one process and across machines.

Deterministic on CPU for a given seed: a run resumed from a checkpoint repeats exactly what an
uninterrupted run would have done.
"""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

from medfed.algorithms.base import Algorithm, State
from medfed.config import TrainConfig
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.errors import ConfigError
from medfed.federation.coordinator import Coordinator, RoundPlan, SiteInfo, default_backbone
from medfed.federation.site import (
    SiteDropped,
    SiteWorker,
    clone_state,
    cosine_lr,
    derive_seed,
    failure_reason,
)
from medfed.models.device import resolve_device
from medfed.runs import RunDir
from medfed.serving.abstention import (
    DEFAULT_FALSE_ABSTAIN,
    calibrate,
    site_gaussian,
    uncalibrated,
)
from medfed.serving.bundle import SiteEntry, TrainedFederation
from medfed.serving.evaluation import evaluate, views_of

__all__ = [
    "TIMING_KEYS",
    "Engine",
    "SiteDropped",
    "cosine_lr",
    "default_backbone",
    "derive_seed",
    "failure_reason",
]

TIMING_KEYS = ("seconds_per_round", "seconds_total")


class Engine:
    """Train one algorithm over several sites, writing the run directory as it goes."""

    def __init__(
        self,
        sites: list[SiteData],
        algorithm: Algorithm,
        config: TrainConfig,
        run: RunDir,
        *,
        progress: bool = False,
    ) -> None:
        if not sites:
            raise ConfigError("no sites to train on")
        self.algorithm, self.config, self.run, self.progress = algorithm, config, run, progress
        self.setup = resolve_device(config.device)
        self.server = Coordinator(
            [SiteInfo.of(s) for s in sites], algorithm, config, run, self.setup
        )
        self.spec, self.model = self.server.spec, self.server.model
        init = self.server.initial_state
        self.workers = [
            SiteWorker(
                data=s,
                index=i,
                n_sites=len(sites),
                algorithm=algorithm,
                config=config,
                model=self.model,
                setup=self.setup,
                state=clone_state(init),
                extra=algorithm.init_extra(self.model),
                held={k: v.cpu().clone() for k, v in self.server.global_state.items()},
            )
            for i, s in enumerate(sites)
        ]
        self.faults = config.fault_plan

    @property
    def global_state(self) -> State:
        return self.server.global_state

    # ------------------------------------------------------------------ resume
    def _start_round(self, resume: bool) -> int:
        first, states = self.server.start(resume)
        for worker in self.workers:
            if f"site_{worker.id}" in states:
                worker.state = {
                    k: v.to(self.setup.device) for k, v in states[f"site_{worker.id}"].items()
                }
                extra = states.get(f"extra_{worker.id}", {})
                worker.extra = {k: v.to(self.setup.device) for k, v in extra.items()}
                worker.held = dict(self.server.held[worker.index])
        return first

    def _checkpoint(self, round_: int) -> None:
        states: dict[str, State] = {}
        for worker in self.workers:
            states[f"site_{worker.id}"] = worker.state
            if worker.extra:
                states[f"extra_{worker.id}"] = worker.extra
        self.server.checkpoint(round_, states)

    # ------------------------------------------------------------------ one round
    def _site_round(self, worker: SiteWorker, plan: RoundPlan) -> tuple[dict[str, Any], State]:
        """One site's round, both ends of the wire; raises when the site drops out."""
        fault = self.faults.get((plan.round, worker.id))
        down = self.server.downlink(worker.index, plan)
        done = worker.train_round(plan.round, plan.lr, down.payload, plan.keys, plan.dtypes, fault)
        received = self.server.receive(worker.index, plan, down, done.payload_up)
        worker.keep(done)
        self.server.accepted(worker.index, down)
        return {
            "status": "ok",
            "train_loss": done.result.loss,
            **{f"train_{k}": v for k, v in done.result.metrics.items()},
            "bytes_up": len(done.payload_up),
            "bytes_down": len(down.payload),
            "keys_sent": len(plan.keys),
        }, received

    def _run_round(
        self, round_: int, bar: tqdm | None
    ) -> tuple[list[dict[str, Any]], list[tuple[State, float]]]:
        plan = self.server.plan(round_)
        records, updates = [], []
        for worker in self.workers:
            record: dict[str, Any] = {"round": round_, "site": worker.id, "lr": plan.lr}
            if worker.index not in plan.sampled:
                records.append(record | {"status": "not_sampled"})
                continue
            start = time.perf_counter()
            try:
                outcome, received = self._site_round(worker, plan)
            except Exception as exc:  # any failure of one site drops that site, not the run
                reason = failure_reason(exc)
                record |= {"status": "dropped", "reason": reason}
                self.run.log_event("dropout", round=round_, site=worker.id, reason=reason)
            else:
                record |= outcome
                if received:
                    updates.append((received, float(worker.n_train)))
            record["seconds"] = time.perf_counter() - start
            records.append(record)
            if bar is not None:
                bar.set_postfix_str(f"site {worker.id}")
        return records, updates

    # ------------------------------------------------------------------ evaluation
    def eval_state(self, worker: SiteWorker) -> State:
        return worker.eval_state(self.global_state)

    def trained_federation(self) -> TrainedFederation:
        """The final per-site models, with abstention calibrated on the validation splits."""
        states = [worker.finish(self.global_state) for worker in self.workers]
        fed = TrainedFederation(
            self.spec,
            self.algorithm.name,
            [site_entry(w.data, w.index, float(self.server.priors[w.index])) for w in self.workers],
            states,
            self.setup,
        )
        data = [worker.data for worker in self.workers]
        gaussians = [
            site_gaussian(fed.models[w.index], w.data.x[Split.TRAIN], self.setup, w.id)
            for w in self.workers
        ]
        fed.abstention = uncalibrated(gaussians, DEFAULT_FALSE_ABSTAIN)
        scores = [
            fed.abstention.scores(fed.outputs(views_of(data, origin, Split.VAL)).features)
            for origin in data
            if origin.n(Split.VAL)
        ]
        calibrate(fed.abstention, scores)
        return fed

    # ------------------------------------------------------------------ the whole run
    def train(self, *, resume: bool = False) -> dict[str, Any]:
        first = self._start_round(resume)
        rounds = range(first, self.config.rounds + 1)
        bar = tqdm(
            rounds, desc=f"{self.algorithm.name} rounds", disable=not self.progress, leave=False
        )
        for round_ in bar:
            start = time.perf_counter()
            records, updates = self._run_round(round_, bar)
            aggregated = self.server.aggregate(round_, updates)
            seconds = time.perf_counter() - start
            by_site = {r["site"]: r for r in records}
            for worker in self.workers:
                by_site[worker.id] |= {"round_seconds": seconds, "aggregated": aggregated}
                by_site[worker.id] |= worker.validate(self.global_state)
            self.run.append_metrics(records)
            self._checkpoint(round_)
        fed = self.trained_federation()
        summary = self.server.summary(evaluate(fed, [w.data for w in self.workers]))
        self.run.write_summary(summary)
        fed.save(self.run, {"n_train": {w.id: w.n_train for w in self.workers}})
        self.run.log_event("finish", rounds=self.config.rounds)
        return summary


def site_entry(site: SiteData, index: int, prior: float) -> SiteEntry:
    return SiteEntry(
        id=site.id,
        index=index,
        prior=prior,
        normalization=site.normalization,
        manifest=site.manifest,
    )
