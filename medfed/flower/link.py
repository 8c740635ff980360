"""The round loop's :class:`~medfed.federation.rounds.SiteLink` for a deployed run: each site
reached by Flower messages.

A plain round takes one message exchange: round r's validation message also carries round
r+1's training for each site that round samples (the link asks the run's
:class:`~medfed.federation.rounds.RoundSource` for that round's inputs as soon as round r has
aggregated), which names the weights it trains from by the hash of those the site just
validated. A site whose validation went unanswered gets a training message of its own, with the
weights; so does every site in the first round of a run or a resume. A secure (SecAgg+) round
goes through the protocol's own exchanges.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MessageType, RecordDict

from medfed.algorithms.base import State
from medfed.core.errors import MedfedError
from medfed.federation.coordinator import Coordinator, RoundPlan
from medfed.federation.pretrained import state_sha256
from medfed.federation.rounds import RoundInputs, SecureSum, SiteFailure, SiteReply, Trained
from medfed.federation.site import Published
from medfed.federation.wire import WireFormat, encode
from medfed.flower.masks import MASKS
from medfed.flower.messenger import Messenger
from medfed.flower.node import RunSettings
from medfed.flower.records import (
    json_of,
    json_record,
    payload_of,
    payload_record,
    state_of,
    state_record,
    weights_records,
)
from medfed.flower.reuse import ValidatedWeights, lossless_subset
from medfed.flower.secure import mean_state
from medfed.routing.abstention import FeatureGaussian
from medfed.routing.bundle import SiteEntry, TrainedFederation
from medfed.runs.schema import PrivacySpent


def published_entry(data: Any, site: str, index: int) -> SiteEntry:
    """The entry a site publishes with its final model; it must describe that very site (its
    id names the weights file the server writes)."""
    if not isinstance(data, dict) or data.get("id") != site or data.get("index") != index:
        got = data.get("id") if isinstance(data, dict) else data
        raise ValueError(f"published its model as site {got!r}; expected {site!r}")
    manifest = data.get("manifest")
    if not isinstance(manifest, dict) or manifest.get("id") != site:
        raise ValueError(f"published a manifest of another site; expected {site!r}")
    try:
        return SiteEntry.from_dict(data)
    except (KeyError, TypeError, ValueError, MedfedError) as exc:
        raise ValueError(f"published an unusable site entry ({exc})") from None


def published_parts(
    reply: RecordDict, site: str, index: int
) -> tuple[SiteEntry, int, FeatureGaussian, PrivacySpent | None]:
    """What a site's finishing reply says of its final model (its entry, training scans,
    feature Gaussian and privacy spent); raises KeyError, TypeError, ValueError or MedfedError
    where that is unusable."""
    info = json_of(reply, "site")
    entry = published_entry(info["entry"], site, index)
    n_train = info["n_train"]
    if type(n_train) is not int or n_train < 1:
        raise ValueError(f"published n_train {n_train!r}; expected a count >= 1")
    features = state_of(reply, "features")
    gaussian = FeatureGaussian(features["mean"], features["precision"])
    privacy = info.get("privacy")
    if privacy is not None:
        privacy = PrivacySpent.from_dict(privacy, f"site {site}'s final model")
    return entry, n_train, gaussian, privacy


def _with(content: RecordDict, **records: ArrayRecord | Any) -> RecordDict:
    """A copy of ``content`` with more records."""
    return RecordDict({**dict(content.items()), **records})


def _trained(content: RecordDict, prefix: str = "", reused: int = 0) -> SiteReply | SiteFailure:
    """A site's answer to its training (the records named ``prefix``...: the training part of
    a validation message's reply); ``reused``: downlink bytes the site rebuilt itself."""
    failure = content.config_records.get(f"{prefix}failure")
    if failure is not None:
        return SiteFailure(str(failure["reason"]))
    result = json_of(content, f"{prefix}result")
    return SiteReply(
        payload_of(content, f"{prefix}payload"),
        float(result["loss"]),
        dict(result["metrics"]),
        dict(result.get("stats", {})),
        float(result["seconds"]),
        record={"bytes_down_reused": reused},
    )


def _secure_reply(result: dict[str, Any], bytes_up: int) -> SiteReply:
    """A site's figures from a secure round (its update is only in the sum); figures that are
    not numbers read as missing."""

    def number(value: Any) -> float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else math.nan

    metrics = result.get("metrics")
    metrics = {str(k): number(v) for k, v in (metrics.items() if isinstance(metrics, dict) else [])}
    seconds = number(result.get("seconds"))
    clipped = result.get("secure_clipped")
    return SiteReply(
        b"",
        number(result.get("loss")),
        metrics,
        {},
        seconds if math.isfinite(seconds) else None,
        secure=True,
        bytes_up=bytes_up,
        record={"secure_clipped": clipped if type(clipped) is int and clipped >= 0 else 0},
    )


@dataclass
class Folded:
    """A round whose training went out with the last validation, and each site's answer."""

    round: int
    sent: float  # when (perf_counter)
    replies: dict[int, SiteReply | SiteFailure]


class FlowerLink:
    """The sites of a deployed run, reached through ``messenger``.

    ``settings``: the run settings every message carries; ``next_inputs``: a
    round's inputs, once the round before it has aggregated; ``secure_bound``: SecAgg+'s bound
    where the run aggregates securely (None: plain rounds)."""

    def __init__(
        self,
        messenger: Messenger,
        server: Coordinator,
        settings: RunSettings,
        next_inputs: Callable[[int], RoundInputs],
        secure_bound: float | None = None,
    ) -> None:
        self.messenger, self.server = messenger, server
        self.settings = json_record(settings.to_json())
        self.sites = messenger.sites
        self.next_inputs, self.secure_bound = next_inputs, secure_bound
        self.n_train = {info.id: info.n_train for info in server.sites}
        self.weights = ValidatedWeights()
        self.init_given: set[str] = set()  # sites that hold the starting weights
        self.folded: Folded | None = None
        # Each site's validation routing scores, from its abstention calibration answer.
        self.routing_val: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ messages
    def _content(self, step: dict[str, Any], payload: bytes = b"") -> RecordDict:
        return RecordDict(
            {"run": self.settings, "step": json_record(step), "payload": payload_record(payload)}
        )

    def _with_init(self, contents: dict[str, RecordDict]) -> dict[str, RecordDict]:
        """The starting weights (--init) go along to each site until it has answered once;
        the site checks them against the hash in the run settings and keeps them."""
        init = self.server.init_state
        if not init:
            return contents
        record = state_record(init)
        return {
            site: content if site in self.init_given else _with(content, init=record)
            for site, content in contents.items()
        }

    def _send_run(self, kind: str, contents: dict[str, RecordDict]) -> dict[str, Message | str]:
        """:meth:`Messenger.send` for messages that build the site's model (train, validate,
        finish)."""
        answers = self.messenger.send(kind, self._with_init(contents))
        self.init_given |= {site for site, a in answers.items() if isinstance(a, Message)}
        return answers

    def _train_step(self, inputs: RoundInputs, index: int) -> dict[str, Any]:
        plan = inputs.plan
        step = {"round": plan.round, "lr": plan.lr, "keys": plan.keys}
        step["fault"] = inputs.faults.get(index)
        if self.secure_bound is not None and plan.keys:
            step["secure_bound"] = self.secure_bound
            step["masks"] = MASKS  # a site masking otherwise would garble the sum
        held = self.server.delta_reference(index, plan) if plan.outgoing else None
        if held is not None:
            # The reference this site's delta was computed against: the site may have moved on
            # to a round whose reply the server never took (node.NodeSite.held_matching).
            step["held_sha256"] = state_sha256(held)
        held_stats = self.server.statistics_held(index)
        if held_stats is not None:  # a site whose statistics the server lost sends them again
            step["stats_held"] = held_stats
        return step

    def _to_all(
        self,
        kind: str,
        step: dict[str, Any],
        global_state: State,
        ahead: RoundInputs | None = None,
        sites: list[str] | None = None,
    ) -> tuple[dict[int, Message | str], bytes, dict[int, int]]:
        """Send the whole global state (float32, lossless) to every site still in the run (or
        to ``sites``; by its hash alone to a site that validated these very weights), with the
        next round's training for each site ``ahead`` samples; the answers, the weights as
        sent, and the downlink bytes each site rebuilds for that training."""
        keys = sorted(global_state)
        payload = encode(global_state, WireFormat()) if keys else b""
        subset = lossless_subset(payload, ahead.plan.keys) if ahead is not None else b""
        contents, reused = {}, {}
        for site in self.sites if sites is None else sites:
            if site in self.messenger.lost:
                continue
            whole, sent, _ = self.weights.offer(
                site, step | {"keys": keys}, payload, self.weights.payload
            )
            content = self._content(whole, sent)
            index = self.sites.index(site)
            if ahead is not None and index in ahead.downs:
                # The site keeps the weights it validates before it trains: the training
                # part names them by their hash, as a later training message would.
                step_ahead = self._train_step(ahead, index)
                down = ahead.downs[index].payload
                part, part_payload, reused[index] = self.weights.offer(
                    site, step_ahead, down, subset, holds=True
                )
                content = _with(
                    content, next=json_record(part), next_payload=payload_record(part_payload)
                )
            contents[site] = content
        answers = self._send_run(kind, contents)
        return {self.sites.index(s): a for s, a in answers.items()}, payload, reused

    # ------------------------------------------------------------------ SiteLink
    def restore(self, states: dict[str, State]) -> None:
        """Nothing to do: every SuperNode resumes from its own checkpoints."""

    def train(self, inputs: RoundInputs) -> Trained:
        """The round's training; a site that already trained it with the last validation's
        message answered then. A site whose validation went unanswered gets a training message
        of its own now."""
        plan, downs = inputs.plan, inputs.downs
        folded, self.folded = self.folded, None
        started, early = None, {}
        if folded is not None and folded.round == plan.round:
            # (the round's time counts from that validation, whose messages it shared)
            started, early = folded.sent, folded.replies
        # The validated weights' subset this round sends, as a site that holds them rebuilds it.
        subset = self.weights.subset(plan.keys)
        replies = {index: early[index] for index in downs if index in early}
        contents, reused = {}, {}
        for index, down in downs.items():
            if index in early:
                continue
            site = self.sites[index]
            step = self._train_step(inputs, index)
            step, payload, reused[index] = self.weights.offer(site, step, down.payload, subset)
            contents[site] = self._content(step, payload)
        if not contents:
            return Trained(replies, started=started)
        secure = None
        if self.secure_bound is not None and plan.keys:
            sent, secure = self._train_secure(plan, contents, self.secure_bound)
        else:
            sent = self._train_plain(contents)
        for index, reply in sent.items():
            if isinstance(reply, SiteReply):
                reply.record["bytes_down_reused"] = reused[index]
        return Trained(replies | sent, secure, started)

    def _train_plain(self, contents: dict[str, RecordDict]) -> dict[int, SiteReply | SiteFailure]:
        return {
            self.sites.index(site): (
                SiteFailure(answer) if isinstance(answer, str) else _trained(answer.content)
            )
            for site, answer in self._send_run(MessageType.TRAIN, contents).items()
        }

    def _train_secure(
        self, plan: RoundPlan, contents: dict[str, RecordDict], bound: float
    ) -> tuple[dict[int, SiteReply | SiteFailure], SecureSum]:
        """A round under SecAgg+: the sites' masked updates add up to their weighted mean, the
        only update the server sees."""
        ready, why = self.messenger.reachable(contents)
        replies: dict[int, SiteReply | SiteFailure] = {
            self.sites.index(site): SiteFailure(reason) for site, reason in why.items()
        }
        if len(ready) < 2:
            reason = f"{len(ready)} site(s) reachable; SecAgg+ needs at least 2 for a sum"
            return replies, SecureSum(None, reason)
        result, site_of = self.messenger.send_secure(
            plan.round, self._with_init(ready), self.n_train
        )
        for node, site in site_of.items():
            index = self.sites.index(site)
            if node not in result.results:
                replies[index] = SiteFailure(result.missing.get(node, "not in the secure sum"))
                continue
            self.init_given.add(site)
            replies[index] = _secure_reply(result.results[node], result.bytes_up.get(node, 0))
            clipped = replies[index].record["secure_clipped"]
            if clipped:
                self.server.run.log_event(
                    "secure_clipped",
                    round=plan.round,
                    site=site,
                    values=clipped,
                    bound=bound,
                    reason="values of the update moved further than --secure-bound in one "
                    "round and were clipped on the site; raise --secure-bound",
                )
        mean = None
        if result.vectors is not None:
            try:
                mean = mean_state(result.vectors, plan.keys, plan.outgoing, bound)
            except ValueError as exc:
                result.halted = str(exc)
        return replies, SecureSum(mean, result.halted)

    def commit(self, index: int) -> None:
        """Nothing to do: a SuperNode keeps its round as soon as it has trained."""

    def validate(self, round_: int, global_state: State) -> dict[int, dict[str, Any]]:
        """Validation figures; the message also carries the next round's training, but under
        secure aggregation (a secure round goes through SecAgg+'s own exchanges)."""
        ahead = None
        if self.secure_bound is None and round_ < self.server.config.rounds:
            ahead = self.next_inputs(round_ + 1)
        sent = time.perf_counter()
        self.weights.sending()  # validation always sends the weights: they are new
        kind = f"{MessageType.EVALUATE}.validate"
        answers, payload, reused = self._to_all(kind, {"round": round_}, global_state, ahead)
        held = {self.sites[i] for i, a in answers.items() if isinstance(a, Message)}
        self.weights.validated(payload, held)
        if ahead is not None:
            early: dict[int, SiteReply | SiteFailure] = {}
            for index, answer in answers.items():
                records = answer.content.config_records if isinstance(answer, Message) else {}
                # (a site that answered without training it gets a training message then)
                if index in ahead.downs and ({"next_result", "next_failure"} & set(records)):
                    early[index] = _trained(answer.content, "next_", reused[index])
            self.folded = Folded(ahead.plan.round, sent, early)
        return {
            index: json_of(a.content, "figures") | {"bytes_eval": len(payload)}
            for index, a in answers.items()
            if isinstance(a, Message)
        }

    def site_states(self) -> dict[str, State]:
        return {}

    def finish(self, global_state: State) -> dict[int, Published | SiteFailure]:
        step = {"round": self.server.config.rounds}
        kind = f"{MessageType.EVALUATE}.finish"
        answers = self._to_all(kind, step, global_state)[0]
        failed = [s for i, s in enumerate(self.sites) if isinstance(answers.get(i), str)]
        again = self.weights.to_resend(failed)
        for site in again:
            reason = answers[self.sites.index(site)]
            self.server.run.log_event("weights_resent", site=site, reason=reason)
        if again:
            answers |= self._to_all(kind, step, global_state, sites=again)[0]
        out: dict[int, Published | SiteFailure] = {}
        for index, answer in answers.items():
            site = self.sites[index]
            if not isinstance(answer, Message):
                self.messenger.lost[site] = answer
                out[index] = SiteFailure(answer)
                continue
            try:
                entry, n_train, gaussian, privacy = published_parts(answer.content, site, index)
            except (KeyError, TypeError, ValueError, MedfedError) as exc:
                self.messenger.lost[site] = str(exc)
                out[index] = SiteFailure(str(exc))
                continue
            weights = state_of(answer.content, "weights")
            out[index] = Published(entry, n_train, weights, gaussian, privacy)
        return out

    def abstention_scores(self, fed: TrainedFederation) -> list[np.ndarray]:
        answers = self.messenger.send(f"{MessageType.EVALUATE}.calibrate", self._federation(fed))
        replied = {
            s: a.content.array_records["scores"]
            for s, a in answers.items()
            if isinstance(a, Message)
        }
        # The same answer carries the routing scores: kept for routing_scores, one message less.
        self.routing_val = {s: r["routing"].numpy() for s, r in replied.items() if "routing" in r}
        return [r["scores"].numpy() for r in replied.values()]

    def routing_scores(self, fed: TrainedFederation) -> dict[str, np.ndarray]:
        return dict(self.routing_val)

    def test(self, fed: TrainedFederation) -> list[dict[str, Any]]:
        answers = self.messenger.send(f"{MessageType.EVALUATE}.test", self._federation(fed))
        return [
            json_of(answers[s.id].content, "evaluation")
            for s in fed.sites
            if isinstance(answers[s.id], Message)
        ]

    def summary_extra(self) -> dict[str, Any]:
        return {"engine": "flower", "lost_sites": dict(self.messenger.lost)}

    def _federation(self, fed: TrainedFederation) -> dict[str, RecordDict]:
        """Every published model, for each site to evaluate on its own scans."""
        weights = weights_records(fed.weights())
        return {
            s.id: RecordDict(
                {"run": self.settings, "federation": json_record(fed.describe())} | weights
            )
            for s in fed.sites
        }
