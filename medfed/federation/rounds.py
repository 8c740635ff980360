"""The round loop: one implementation of a run, for the in-process engine and the Flower ServerApp.

The loop owns everything that must be the same wherever the sites are: the round record of each
site, dropouts and skipped rounds, aggregation, checkpoints, validation figures, and finishing
(the sites' final models, abstention fitted on their features and calibrated on their validation
scans, the routing posterior's temperature fitted on the same scans, the test evaluation, the
summary and the saved model). How a message reaches a site is a :class:`SiteLink`'s business:
a direct call in one process, a Flower message across machines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from medfed.algorithms.base import State, Stats, Update
from medfed.algorithms.privacy import BUDGET_SPENT
from medfed.core.errors import MedfedError
from medfed.core.progress import counter
from medfed.federation.coordinator import Coordinator, Downlink, RoundPlan
from medfed.federation.features import frozen_encoder_of
from medfed.federation.site import Published, SiteDropped, failure_reason
from medfed.reports.model_card import write_model_card
from medfed.routing.abstention import DEFAULT_FALSE_ABSTAIN, calibrate, uncalibrated
from medfed.routing.bundle import SiteEntry, TrainedFederation
from medfed.routing.evaluation import combine_evaluation, prediction_rows
from medfed.routing.posterior import fit_routing
from medfed.runs.schema import Summary


def stats_bytes(stats: Stats) -> int:
    """Bytes of a side-channel report as it travels (JSON), counted with the update."""
    return len(json.dumps(stats, sort_keys=True).encode()) if stats else 0


@dataclass
class SiteReply:
    """A site's answer to a training message.

    ``secure``: its update went into a secure sum (:class:`SecureSum`) and never reached the
    server on its own; ``payload_up`` is then empty, and ``bytes_up`` what the site sent for the
    protocol. ``record``: more fields for its metrics.jsonl record."""

    payload_up: bytes
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    stats: Stats = field(default_factory=dict)
    seconds: float | None = None
    secure: bool = False
    bytes_up: int | None = None
    record: dict[str, Any] = field(default_factory=dict)


@dataclass
class SecureSum:
    """A round's updates as secure aggregation gives them to the server: only their weighted
    mean (the new shared state), or why the protocol gave none."""

    mean: State | None
    reason: str = ""


@dataclass
class SiteFailure:
    """Why a site has no answer this round."""

    reason: str
    seconds: float | None = None


@dataclass(frozen=True)
class RoundInputs:
    """What a round sends: its plan, each sampled site's downlink, and the fault drills."""

    plan: RoundPlan
    downs: dict[int, Downlink]
    faults: dict[int, str]


class RoundSource:
    """Each round's inputs, computed once.

    A round's inputs depend on nothing but the global state and what each site holds after the
    round before it aggregated (:meth:`Coordinator.plan` and :meth:`Coordinator.downlink` change
    nothing), so a link may ask for the next round's as soon as a round has aggregated (to send
    them early), and the round loop then gets those very inputs."""

    def __init__(self, server: Coordinator) -> None:
        self.server = server
        self.last: RoundInputs | None = None

    def __call__(self, round_: int) -> RoundInputs:
        if self.last is None or self.last.plan.round != round_:
            self.last = round_inputs(self.server, round_)
        return self.last


def round_inputs(server: Coordinator, round_: int) -> RoundInputs:
    """Round ``round_``'s plan, each sampled site's downlink and the fault drills it runs."""
    plan = server.plan(round_)
    sampled = sorted(plan.sampled)
    planned = server.config.fault_plan
    faults = {i: planned.get((round_, server.sites[i].id)) for i in sampled}
    return RoundInputs(
        plan,
        {i: server.downlink(i, plan) for i in sampled},
        {i: kind for i, kind in faults.items() if kind},
    )


@dataclass
class Trained:
    """The sites' answers to a round's training.

    ``secure``: the round's secure sum, where updates went into one (:class:`SecureSum`) rather
    than arriving one by one. ``started``: when (``time.perf_counter``) the round's training
    went out, where that was before the round loop asked for it; the round's time counts from
    then."""

    replies: dict[int, SiteReply | SiteFailure]
    secure: SecureSum | None = None
    started: float | None = None


class SiteLink(Protocol):
    """How the round loop reaches the sites (indices are positions in ``Coordinator.sites``)."""

    def restore(self, states: dict[str, State]) -> None:
        """Resume the sites from the server's last checkpoint (``states``: its named states)."""

    def train(self, inputs: RoundInputs) -> Trained:
        """Each sampled site's local round; nothing it keeps changes before :meth:`commit`."""

    def commit(self, index: int) -> None:
        """The server accepted site ``index``'s update: the site keeps its round."""

    def validate(self, round_: int, global_state: State) -> dict[int, dict[str, Any]]:
        """Validation figures of every reachable site after a round."""

    def site_states(self) -> dict[str, State]:
        """Site states the server checkpoints itself (none where the sites keep their own)."""

    def finish(self, global_state: State) -> dict[int, Published | SiteFailure]:
        """Every site's final model and feature Gaussian."""

    def abstention_scores(self, fed: TrainedFederation) -> list[np.ndarray]:
        """Abstention scores of each site's validation scans, computed where they are."""

    def routing_scores(self, fed: TrainedFederation) -> dict[str, np.ndarray]:
        """Each site's validation scans' density-ratio scores (n, K), by site id, computed
        where they are (for a federation that routes; called after :meth:`abstention_scores`)."""

    def test(self, fed: TrainedFederation) -> list[dict[str, Any]]:
        """Each site's part of the test evaluation (figures and counts, no scans)."""

    def summary_extra(self) -> dict[str, Any]:
        """What the summary records about this engine (``Coordinator.summary``'s keywords)."""


ROUND_LINES = 20  # at most about this many lines per run where rounds are told line by line


class RoundLoop:
    """A whole run: rounds, then finishing, over a :class:`Coordinator` and a :class:`SiteLink`."""

    def __init__(
        self,
        server: Coordinator,
        link: SiteLink,
        *,
        progress: bool = False,
        inputs: RoundSource | None = None,
        say: Callable[[str], Any] | None = None,
        describe: Callable[[Path], Any] | None = None,
    ) -> None:
        """``inputs``: where the rounds' inputs come from (the one the link asks, if it does);
        ``say``: hears a line per round (or every few rounds) where no bar can show, so that a
        run written to a log file is not silent for its whole length; ``describe``: writes what
        the model card reads besides the run's own files (the sites' data cards) into the run
        directory, just before the card is written."""
        self.server, self.link, self.progress = server, link, progress
        self.say, self.describe = say, describe
        self.config, self.run = server.config, server.run
        self.inputs = inputs or RoundSource(server)

    def train(self, *, resume: bool = False, **event: Any) -> Summary:
        first, states = self.server.start(resume, **event)
        if states:
            self.link.restore(states)
        rounds = range(first, self.config.rounds + 1)
        name = self.server.algorithm.run_name
        bar = counter(f"{name} rounds", len(rounds), show=self.progress)
        every = max(1, -(-self.config.rounds // ROUND_LINES))
        started = time.perf_counter()
        try:
            for round_ in rounds:
                records = self.round(round_)
                bar.set_postfix(round_postfix(records), refresh=False)
                bar.update()
                if self.say is not None and (round_ % every == 0 or round_ == rounds[-1]):
                    figures = "".join(f", {k} {v}" for k, v in round_postfix(records).items())
                    self.say(
                        f"{name} round {round_}/{self.config.rounds}{figures} "
                        f"({time.perf_counter() - started:.1f} s)"
                    )
        finally:
            bar.close()
        self.require_an_aggregated_round()
        return self.finish()

    def require_an_aggregated_round(self) -> None:
        """Refuse to finish a run in which no round aggregated any site's update.

        Its final models would be the initial weights (or each site alone), and a summary would
        look like a finished run. The run folder keeps config.toml, metrics.jsonl, events.jsonl
        (with a ``failed`` event) and its checkpoints to show what happened, but no summary.json
        and no model/: readers see an unfinished run."""
        records = self.run.read_metrics()
        rounds = sorted({r.round for r in records})
        # (runs written before records said whether their round aggregated count as having)
        good = {r.round for r in records if r.aggregated is not False and r.status == "ok"}
        if good or not rounds:
            return
        reasons: dict[str, list[str]] = {}
        for r in records:
            if r.status == "dropped":
                reasons.setdefault(r.reason or "no reason given", []).append(f"{r.site}@{r.round}")
        for event in self.run.read_events():
            if event.get("event") == "round_skipped":
                reasons.setdefault(str(event.get("reason")), []).append(
                    f"round {event.get('round')}"
                )
        shown = "; ".join(
            f"{reason} ({len(where)}x: {', '.join(where[:4])}{', ...' if len(where) > 4 else ''})"
            for reason, where in list(reasons.items())[:4]
        )
        message = (
            f"training failed: no round aggregated any site's update (all {len(rounds)} "
            f"round(s) were skipped); why: {shown or 'no site answered'}. The run in "
            f"{self.run.path} is not finished: no model/ and no summary.json were written; "
            f"see its events.jsonl and metrics.jsonl. Fix the sites (or the fault drills) and "
            "train again into a new --out"
        )
        self.run.log_event("failed", reason="no round aggregated any site's update")
        raise TrainingFailed(message)

    # ------------------------------------------------------------------ one round
    def round(self, round_: int) -> list[dict[str, Any]]:
        """Run one round; its records (one per site), as written to metrics.jsonl."""
        start = time.perf_counter()
        server = self.server
        inputs = self.inputs(round_)
        plan, downs = inputs.plan, inputs.downs
        trained = self.link.train(inputs)
        replies, secure = trained.replies, trained.secure
        if trained.started is not None:
            # (the round's time then also holds whatever shared the messages that started it)
            start = trained.started
        records, updates = [], []
        for index, site in enumerate(server.sites):
            record: dict[str, Any] = {"round": round_, "site": site.id, "lr": plan.lr}
            if index not in plan.sampled:
                records.append(record | {"status": "not_sampled"})
                continue
            reply = replies.get(index, SiteFailure("no reply"))
            try:
                if isinstance(reply, SiteFailure):
                    raise SiteDropped(reply.reason)
                # A secure update was checked on its site; the server sees only the sum.
                received = (
                    {}
                    if reply.secure
                    else server.receive(index, plan, downs[index], reply.payload_up)
                )
                server.algorithm.check_stats(reply.stats)
            except Exception as exc:  # any failure of one site drops that site, not the run
                reason = failure_reason(exc)
                record |= {"status": "dropped", "reason": reason}
                self.run.log_event("dropout", round=round_, site=site.id, reason=reason)
                if BUDGET_SPENT in reason and not self.budget_event_logged(site.id):
                    self.run.log_event(
                        "privacy_budget_spent", round=round_, site=site.id, reason=reason
                    )
            else:
                self.link.commit(index)
                server.accepted(index, downs[index])
                if received:
                    updates.append(Update(received, float(site.n_train), reply.stats))
                record |= {
                    "status": "ok",
                    "train_loss": reply.loss,
                    **{f"train_{k}": v for k, v in reply.metrics.items()},
                    "bytes_up": (
                        reply.bytes_up
                        if reply.bytes_up is not None
                        else len(reply.payload_up) + stats_bytes(reply.stats)
                    ),
                    "bytes_down": len(downs[index].payload),
                    "keys_sent": len(plan.keys),
                    **reply.record,
                }
            if reply.seconds is not None:
                record["seconds"] = reply.seconds
            records.append(record)
        if secure is not None:
            ok = sum(1 for r in records if r.get("status") == "ok")
            aggregated = server.aggregate_secure(round_, plan, secure.mean, ok, secure.reason)
        else:
            aggregated = server.aggregate(round_, updates)
        seconds = time.perf_counter() - start
        figures = self.link.validate(round_, server.global_state)
        for index, record in enumerate(records):
            record |= {"round_seconds": seconds, "aggregated": aggregated}
            record |= figures.get(index, {})
        self.run.append_metrics(records)
        server.checkpoint(round_, self.link.site_states())
        return records

    def budget_event_logged(self, site: str) -> bool:
        """Whether events.jsonl already says that ``site``'s privacy budget stopped it."""
        return any(
            e.get("event") == "privacy_budget_spent" and e.get("site") == site
            for e in self.run.read_events()
        )

    # ------------------------------------------------------------------ finishing
    def finish(self) -> Summary:
        """Final models, abstention, the test evaluation, summary.json and model/."""
        server = self.server
        answers = self.link.finish(server.global_state)
        published = [answers[i] for i in sorted(answers) if isinstance(answers[i], Published)]
        for index in sorted(answers):
            if isinstance(answers[index], SiteFailure):
                site = server.sites[index].id
                self.run.log_event("site_lost", site=site, reason=answers[index].reason)
        if not published:
            raise MedfedError("no site published its final model; see events.jsonl")
        total = sum(p.n_train for p in published)
        fed = TrainedFederation(
            server.spec,
            server.algorithm.run_name,
            [_with_prior(p.entry, p.n_train / total) for p in published],
            [p.state for p in published],
            server.setup,
            operating_rule=self.config.operating_point,
            **frozen_encoder_of(server.config, server.spec),
        )
        fed.abstention = uncalibrated([p.gaussian for p in published], DEFAULT_FALSE_ABSTAIN)
        calibrate(fed.abstention, self.link.abstention_scores(fed))
        if fed.routes:
            fed.routing = fit_routing(fed, self.link.routing_scores(fed))
        parts = self.link.test(fed)
        evaluation = combine_evaluation(fed, parts)
        privacy = {p.entry.id: p.privacy for p in published if p.privacy is not None}
        summary = server.summary(evaluation, privacy=privacy or None, **self.link.summary_extra())
        rows = prediction_rows(parts)
        if rows is not None:  # else each site keeps them (summary.json: predictions "sites")
            self.run.write_predictions(rows)
        self.run.write_summary(summary)
        fed.save(self.run, {"n_train": {s.id: s.n_train for s in server.sites}})
        self.run.log_event("finish", rounds=self.config.rounds)
        if self.describe is not None:
            self.describe(self.run.path)
        write_model_card(self.run.path)
        return summary


class TrainingFailed(MedfedError):
    """Training ran but produced nothing usable (every round was skipped)."""

    exit_code = 1


def round_postfix(records: list[dict[str, Any]]) -> dict[str, str]:
    """The round's mean training loss and validation AUC, for the rounds bar."""
    out = {}
    for key, label in (("train_loss", "loss"), ("val_auc", "val AUC")):
        values = [
            float(r[key])
            for r in records
            if isinstance(r.get(key), int | float) and np.isfinite(r[key])
        ]
        if values:
            out[label] = f"{np.mean(values):.3f}"
    return out


def _with_prior(entry: SiteEntry, prior: float) -> SiteEntry:
    return replace(entry, prior=prior)
