"""The server's side of a federation: global state, round plans, downlinks, aggregation.

It never sees a scan: what it knows of a site is a :class:`SiteInfo` (id, label map, input
shape, number of training scans). The in-process engine and the Flower ServerApp both drive a
:class:`Coordinator` over a :class:`~medfed.federation.plan.RunPlan`, so both apply the same
sharing rule, schedule and aggregation. How a run starts, resumes and checkpoints is
:mod:`medfed.federation.start`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medfed.algorithms.base import State, Update
from medfed.federation import wire
from medfed.federation.plan import RunPlan, SiteInfo, starting_model
from medfed.federation.shared import clone_state, cosine_lr, derive_seed
from medfed.federation.start import save_checkpoint, start_or_resume
from medfed.federation.validate import UpdateRejected, validate_update
from medfed.federation.wire import WireFormat
from medfed.models.device import DeviceSetup
from medfed.models.precision import setup_precision, training_precision
from medfed.runs import RunDir
from medfed.runs.checkpoints import CheckpointStore
from medfed.runs.schema import Evaluation, PrivacySpent, RunCosts, Summary, WireSettings


@dataclass
class RoundPlan:
    """What the server sends in one round."""

    round: int
    lr: float
    sampled: set[int]
    keys: list[str]
    outgoing: State
    dtypes: State
    shared_payload: bytes


@dataclass
class Downlink:
    payload: bytes
    held: State  # the global state the site rebuilds from the payload


class Coordinator:
    """Global state, round plans, downlinks, aggregation and the summary of one run."""

    def __init__(
        self, plan: RunPlan, run: RunDir, setup: DeviceSetup, *, init: str | None = None
    ) -> None:
        """``init``: starting weights in place of ``config.init`` (a run's own warm-up base)."""
        self.modality, self.spec = plan.modality, plan.spec
        self.sites: list[SiteInfo] = list(plan.sites)
        self.algorithm, self.config = plan.algorithm, plan.config
        self.run, self.setup = run, setup
        config, algorithm, sites = self.config, self.algorithm, self.sites
        # Starting weights (--init): loaded here, on the server, and sent to every site.
        self.model, self.init_report = starting_model(plan, setup, init)
        self.store = CheckpointStore(run.checkpoints, config.keep_checkpoints)
        # What the run records as its device (the in-process engine adds how its sites share it).
        self.device_text = setup.describe()
        # ... and the precision local training runs in, where the device's words do not say it
        # (fp16's gradient scaler, a forced precision, DP-SGD's fp32 in place of fp16).
        precision = training_precision(setup, config.precision, private=config.dp.enabled)
        if precision.name == "fp16" or precision.reason or precision.name != setup_precision(setup):
            self.device_text += f"; local training in {precision.describe()}"
        self.initial_state = clone_state(self.model.state_dict())
        self.shared_keys = algorithm.shared_keys(self.model) if algorithm.communicates else []
        self.global_state: State = {k: self.initial_state[k].clone() for k in self.shared_keys}
        self.wire = WireFormat(config.wire_precision, config.wire_delta)
        # What each site holds of the global state (delta encoding sends differences to it).
        self.held: list[State] = [
            {k: v.cpu().clone() for k, v in self.global_state.items()} for _ in sites
        ]
        # What a site must be given besides the seed to build the same starting model.
        self.init_state: State = {
            k: self.initial_state[k].cpu()
            for k in (self.init_report.loaded if self.init_report else [])
        }
        self.resumed_from: Path | None = None  # the checkpoint a resumed run started from
        total = sum(s.n_train for s in sites)
        self.priors = np.array([s.n_train / total for s in sites])

    # ------------------------------------------------------------------ start and checkpoints
    def start(self, resume: bool, **event: Any) -> tuple[int, dict[str, State]]:
        """The first round to run, and the checkpointed states when resuming."""
        return start_or_resume(self, resume, **event)

    def checkpoint(self, round_: int, site_states: dict[str, State] | None = None) -> None:
        save_checkpoint(self, round_, site_states)

    def held_states(self) -> dict[str, State]:
        """What each site holds of the global state, by its checkpoint name (``held_SITE``);
        empty unless the wire sends deltas."""
        if not self.wire.delta:
            return {}
        return {f"held_{s.id}": held for s, held in zip(self.sites, self.held, strict=True)}

    def adopt(self, states: dict[str, State], checkpoint: Path) -> None:
        """Resume from ``checkpoint``: its global state, and what each site holds of it."""
        self.global_state = {k: v.to(self.setup.device) for k, v in states["global"].items()}
        if self.wire.delta:
            self.held = [states[f"held_{site.id}"] for site in self.sites]
        self.resumed_from = checkpoint

    # ------------------------------------------------------------------ one round
    def sample(self, round_: int) -> set[int]:
        k = len(self.sites)
        m = max(self.config.min_sites, math.ceil(self.config.client_fraction * k))
        if m >= k:
            return set(range(k))
        rng = np.random.default_rng(derive_seed(self.config.seed, round_, 1_000_003))
        return set(rng.choice(k, size=m, replace=False).tolist())

    def plan(self, round_: int) -> RoundPlan:
        keys = (
            self.algorithm.round_keys(self.model, round_, self.config.rounds)
            if self.shared_keys
            else []
        )
        outgoing = {k: self.global_state[k] for k in keys}
        shared = wire.encode(outgoing, self.wire) if keys and not self.wire.delta else b""
        return RoundPlan(
            round=round_,
            lr=cosine_lr(self.config.lr, round_, self.config.rounds),
            sampled=self.sample(round_),
            keys=keys,
            outgoing=outgoing,
            dtypes={k: v.cpu() for k, v in outgoing.items()},
            shared_payload=shared,
        )

    def downlink(self, index: int, plan: RoundPlan) -> Downlink:
        """What the server sends site ``index`` this round.

        With delta encoding each site gets the difference to the global state it already holds
        (tracked per site, so quantization errors never accumulate); otherwise one payload
        serves every site.
        """
        if not plan.outgoing:
            return Downlink(b"", {})
        payload = plan.shared_payload
        held = self.delta_reference(index, plan)
        if self.wire.delta:
            payload = wire.encode(plan.outgoing, self.wire, reference=held)
        return Downlink(payload, wire.decode(payload, reference=held, dtypes=plan.outgoing))

    def delta_reference(self, index: int, plan: RoundPlan) -> State | None:
        """What site ``index`` holds of this round's outgoing keys, the reference its delta is
        computed against; None when the wire sends whole states."""
        if not self.wire.delta:
            return None
        return {k: self.held[index][k] for k in plan.outgoing}

    def statistics_held(self, index: int) -> Any:
        """What the algorithm keeps of site ``index``'s statistics (see
        ``Algorithm.holds_statistics``): a site whose statistics were lost sends them again."""
        return self.algorithm.holds_statistics(index)

    def receive(self, index: int, plan: RoundPlan, down: Downlink, payload_up: bytes) -> State:
        """Decode and check a site's update; raises when it is unusable."""
        if not plan.keys:
            return {}
        reference = down.held if self.wire.delta else None
        received = wire.decode(payload_up, reference=reference, dtypes=plan.dtypes)
        validate_update(self.sites[index].id, received, plan.dtypes)
        return received

    def accepted(self, index: int, down: Downlink) -> None:
        """Site ``index`` now holds what it was sent."""
        if self.wire.delta:
            self.held[index].update(down.held)

    def aggregate(self, round_: int, updates: list[Update]) -> bool:
        if not self.shared_keys:
            return True
        ok = len(updates)
        if ok < self.config.min_sites:
            self.run.log_event(
                "round_skipped",
                round=round_,
                reason=f"{ok} usable update(s), fewer than min_sites={self.config.min_sites}",
            )
            return False
        aggregated = self.algorithm.aggregate(updates)
        # A schedule (FedALS) may aggregate only part of the shared keys this round.
        self.global_state.update({k: v.to(self.setup.device) for k, v in aggregated.items()})
        return True

    def aggregate_secure(
        self, round_: int, plan: RoundPlan, mean: State | None, contributors: int, reason: str
    ) -> bool:
        """Take a secure sum's weighted mean (``mean``: the new shared state) as the round's
        aggregate, after checking it; ``reason``: why there is none."""
        if mean is not None and contributors < self.config.min_sites:
            reason = (
                f"{contributors} update(s) in the secure sum, fewer than "
                f"min_sites={self.config.min_sites}"
            )
        if mean is not None and not reason:
            try:
                validate_update("(the secure sum)", mean, plan.dtypes)
            except UpdateRejected as exc:
                reason = str(exc)
        if mean is None or reason:
            self.run.log_event("round_skipped", round=round_, reason=reason or "no secure sum")
            return False
        self.global_state.update({k: v.to(self.setup.device) for k, v in mean.items()})
        return True

    # ------------------------------------------------------------------ the summary
    def summary(
        self,
        evaluation: Evaluation,
        *,
        engine: str | None = None,
        lost_sites: dict[str, str] | None = None,
        privacy: dict[str, PrivacySpent] | None = None,
    ) -> Summary:
        """summary.json: the evaluation, the run's settings and what its rounds cost (from
        metrics.jsonl). ``engine`` and ``lost_sites``: a Flower deployment's; ``privacy``: what
        each site spent of its differential privacy budget."""
        return Summary.build(
            evaluation,
            RunCosts.of(self.run.read_metrics(), [site.id for site in self.sites]),
            algorithm=self.algorithm.run_name,
            params=self.algorithm.resolved_params(),
            rounds=self.config.rounds,
            local_steps=self.config.local_steps,
            seed=self.config.seed,
            backbone=self.spec.backbone,
            modality=str(self.modality),
            device=self.device_text,
            priors={s.id: float(p) for s, p in zip(self.sites, self.priors, strict=True)},
            wire=WireSettings(self.wire.precision, self.wire.delta),
            resumes=sum(1 for e in self.run.read_events() if e.get("event") == "resume"),
            engine=engine,
            lost_sites=lost_sites,
            normalization=self.config.normalization,
            augment=self.config.augment,
            operating_rule=self.config.operating_point,
            privacy=privacy,
        )
