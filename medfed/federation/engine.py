"""The in-process engine: all sites in one process, driven by the shared round loop.

The server side is a :class:`~medfed.federation.coordinator.Coordinator`, each site a
:class:`~medfed.federation.site.SiteWorker`, and :class:`~medfed.federation.rounds.RoundLoop`
runs the rounds; the Flower ServerApp runs the same loop over messages, so the same seed and
sites give the same figures in one process and across machines.

Deterministic on CPU for a given seed: a run resumed from a checkpoint repeats exactly what an
uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from medfed.algorithms.base import State
from medfed.core.errors import RunDirError
from medfed.data.modality import modality_spec
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.federation.coordinator import Coordinator, Downlink
from medfed.federation.lanes import Lanes
from medfed.federation.normalizing import normalized
from medfed.federation.plan import RunPlan
from medfed.federation.rounds import RoundInputs, RoundLoop, SiteFailure, SiteReply, Trained
from medfed.federation.shared import clone_state
from medfed.federation.site import LocalRound, Published, SiteWorker, failure_reason
from medfed.models.device import resolve_device
from medfed.routing.bundle import TrainedFederation
from medfed.routing.evaluation import site_evaluation
from medfed.routing.posterior import routing_scores
from medfed.runs import RunDir
from medfed.runs.checkpoints import damaged_fix
from medfed.runs.schema import Summary
from medfed.runs.weights import check_tensors


class LocalLink:
    """The sites as :class:`SiteWorker` objects in this process, called directly."""

    def __init__(self, server: Coordinator, sites: list[SiteData]) -> None:
        self.server = server
        init = server.initial_state
        volumes = modality_spec(server.modality).spatial_dims == 3
        self.lanes = Lanes.plan(
            server.config.concurrency, len(sites), server.setup, volumes=volumes
        )
        if self.lanes.concurrent:
            server.device_text += f"; {self.lanes.describe()}"
        self.workers = [
            SiteWorker(
                data=s,
                index=i,
                n_sites=len(sites),
                algorithm=server.algorithm,
                config=server.config,
                # Scratch space: one model shared by the workers when they take turns, a copy
                # each when several train at once.
                model=copy.deepcopy(server.model) if self.lanes.concurrent else server.model,
                setup=server.setup,
                state=clone_state(init),
                extra=server.algorithm.init_extra(server.model),
                held={k: v.cpu().clone() for k, v in server.global_state.items()},
            )
            for i, s in enumerate(sites)
        ]
        self.pending: dict[int, LocalRound] = {}

    def restore(self, states: dict[str, State]) -> None:
        """Every site's state from the checkpoint; a site missing from it is refused (it would
        otherwise restart from its initial weights while the others go on)."""
        device = self.server.setup.device
        folder = self.server.resumed_from
        fix = damaged_fix(folder) if folder is not None else "start the run again"
        against = "the model config.toml describes"

        def where(stem: str) -> Path:
            return Path(f"{stem}.safetensors") if folder is None else folder / f"{stem}.safetensors"

        restored = []
        for worker in self.workers:
            name, extra_name = f"site_{worker.id}", f"extra_{worker.id}"
            if name not in states:
                raise RunDirError(
                    f"{where(name)}: missing; the checkpoint holds no state of site "
                    f"{worker.id!r}; {fix}"
                )
            check_tensors(where(name), states[name], worker.state, fix, against)
            extra = states.get(extra_name, {})
            if worker.extra:
                if extra_name not in states:
                    raise RunDirError(
                        f"{where(extra_name)}: missing; the checkpoint is incomplete; {fix}"
                    )
                check_tensors(where(extra_name), extra, worker.extra, fix, against)
            restored.append((worker, states[name], extra))
        for worker, state, extra in restored:
            worker.state = {k: v.to(device) for k, v in state.items()}
            worker.extra = {k: v.to(device) for k, v in extra.items()}
            worker.held = dict(self.server.held[worker.index])

    def train(self, inputs: RoundInputs) -> Trained:
        plan, faults = inputs.plan, inputs.faults

        def one(
            item: tuple[int, Downlink],
        ) -> tuple[int, LocalRound | None, SiteReply | SiteFailure]:
            index, down = item
            worker = self.workers[index]
            start = time.perf_counter()
            try:
                done = worker.train_round(
                    plan.round, plan.lr, down.payload, plan.keys, plan.dtypes, faults.get(index)
                )
            except Exception as exc:  # the round loop records it against the site
                return index, None, SiteFailure(failure_reason(exc), time.perf_counter() - start)
            result = done.result
            reply = SiteReply(
                done.payload_up,
                result.loss,
                result.metrics,
                result.stats,
                time.perf_counter() - start,
            )
            return index, done, reply

        replies: dict[int, SiteReply | SiteFailure] = {}
        self.pending = {}
        for index, done, reply in self.lanes.map(one, list(inputs.downs.items())):
            replies[index] = reply
            if done is not None:
                self.pending[index] = done
        return Trained(replies)

    def commit(self, index: int) -> None:
        self.workers[index].keep(self.pending.pop(index))

    def validate(self, round_: int, global_state: State) -> dict[int, dict[str, Any]]:
        figures = self.lanes.map(lambda w: w.validate(global_state), self.workers)
        return {w.index: f for w, f in zip(self.workers, figures, strict=True)}

    def site_states(self) -> dict[str, State]:
        states: dict[str, State] = {}
        for worker in self.workers:
            states[f"site_{worker.id}"] = worker.state
            if worker.extra:
                states[f"extra_{worker.id}"] = worker.extra
        return states

    def finish(self, global_state: State) -> dict[int, Published | SiteFailure]:
        published = self.lanes.map(lambda w: w.publish(global_state), self.workers)
        return {w.index: p for w, p in zip(self.workers, published, strict=True)}

    def abstention_scores(self, fed: TrainedFederation) -> list[np.ndarray]:
        return [fed.abstention_scores(w.data.raw[Split.VAL]) for w in self.workers]

    def routing_scores(self, fed: TrainedFederation) -> dict[str, np.ndarray]:
        return {w.id: routing_scores(fed, w.data.raw[Split.VAL]) for w in self.workers}

    def test(self, fed: TrainedFederation) -> list[dict[str, Any]]:
        norms = [s.normalization for s in fed.sites]
        seed = self.server.config.seed  # of the kappa's bootstrap, as a SuperNode draws it
        return [
            site_evaluation(fed, w.data, fed.position(w.id), norms, seed=seed) for w in self.workers
        ]

    def summary_extra(self) -> dict[str, Any]:
        return {}


class Engine:
    """Train one algorithm over several sites in this process, writing the run directory."""

    def __init__(
        self,
        sites: list[SiteData],
        plan: RunPlan,
        run: RunDir,
        *,
        progress: bool = False,
        init: str | None = None,
        say: Callable[[str], Any] | None = None,
        describe: Callable[[Path], Any] | None = None,
    ) -> None:
        """``plan``: the run :func:`~medfed.federation.plan.plan_run` made of ``sites``;
        ``init``: starting weights in place of ``config.init`` (a warm-up base); ``say`` and
        ``describe``: see :class:`RoundLoop`."""
        sites = normalized(sites, plan.config)
        setup = resolve_device(plan.config.device)
        self.server = Coordinator(plan, run, setup, init=init)
        self.link = LocalLink(self.server, sites)
        self.loop = RoundLoop(self.server, self.link, progress=progress, say=say, describe=describe)

    def train(self, *, resume: bool = False) -> Summary:
        return self.loop.train(resume=resume)
