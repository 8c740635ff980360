"""The ServerApp: a deployed run's rounds, aggregation and run directory, on the SuperLink.

It drives the same :class:`~medfed.federation.coordinator.Coordinator` as the in-process engine and
writes the same run directory, so ``medfed evaluate``, ``medfed route`` and the dashboard read a
deployed run unchanged. Sites are known by the id in their manifest (Flower's node ids are
random); the run's config names them in order, which fixes each site's index.

Run config (``[tool.flwr.app.config]`` of the app folder ``medfed deploy app`` writes):
``train`` (TOML of the training settings), ``sites`` (comma-separated ids), ``run-dir``,
``run-name``, ``wait-s`` (how long to wait for every site to connect), ``reply-timeout-s`` (how
long one round waits for replies), ``resume``, ``lr-from-modality``, and
``secure-aggregation`` with ``secure-bound`` (SecAgg+, :mod:`medfed.flower.secure`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from medfed.algorithms.base import State
from medfed.config import TrainConfig, valid_site_id
from medfed.errors import ConfigError, MedfedError
from medfed.federation import wire
from medfed.federation.coordinator import Coordinator, Downlink, RoundPlan, SiteInfo
from medfed.federation.plan import checked_algorithm, plan_run, resolved_settings
from medfed.federation.rounds import RoundInputs, RoundLoop, SecureSum, SiteFailure, SiteReply
from medfed.federation.site import Published
from medfed.federation.wire import WireFormat, encode
from medfed.flower.deploy import MAX_WAIT_S, refuse_insecure_settings, refuse_unsupported
from medfed.flower.node import RunSettings, train_config_from_toml
from medfed.flower.records import (
    json_of,
    json_record,
    payload_of,
    payload_record,
    state_of,
    state_record,
    weights_records,
)
from medfed.flower.secure import DEFAULT_BOUND, mean_state, secure_round
from medfed.models.device import resolve_device
from medfed.runs import RunDir
from medfed.runs.schema import PrivacySpent
from medfed.serving.abstention import FeatureGaussian
from medfed.serving.bundle import SiteEntry, TrainedFederation

app = ServerApp()


@dataclass(frozen=True)
class Deployment:
    """The run config of a deployed run."""

    config: TrainConfig
    sites: list[str]
    run_dir: Path
    run_name: str
    wait_s: float
    reply_timeout_s: float
    resume: bool
    # No learning rate was given: the sites' modality decides it (as medfed train does), once
    # the server knows the modality from the SuperNodes.
    lr_from_modality: bool = False
    # SecAgg+: the server sees only the weighted mean of each round's updates.
    secure_aggregation: bool = False
    secure_bound: float = DEFAULT_BOUND

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> Deployment:
        missing = [k for k in ("train", "sites", "run-dir") if k not in run_config]
        if missing:
            raise ConfigError(
                f"the Flower run config lacks {missing}; write the app folder "
                "with 'medfed deploy app'"
            )
        sites = [s.strip() for s in str(run_config["sites"]).split(",") if s.strip()]
        if not sites:
            raise ConfigError("run config 'sites' names no site; give the site ids, in order")
        bad = [s for s in sites if not valid_site_id(s)]
        if bad or len(set(sites)) != len(sites):
            raise ConfigError(
                f"run config 'sites' {sites}: site ids must be unique letters, digits, '.', "
                "'_' or '-'"
            )
        # The run config is the operator's own (the app folder), never a site's.
        run_dir = Path(str(run_config["run-dir"])).expanduser()
        where = "run config 'train'"
        config = resolved_settings(
            train_config_from_toml(str(run_config["train"]), where), where=where
        )
        refuse_unsupported(config)
        algorithm = checked_algorithm(config, sites)  # before the wait for the sites
        flags = ("resume", "lr-from-modality", "secure-aggregation")
        resume, modality_lr, secure = (run_config.get(k, False) for k in flags)
        for key, value in zip(flags, (resume, modality_lr, secure), strict=True):
            if not isinstance(value, bool):
                raise ConfigError(f"run config {key!r} must be true or false, got {value!r}")
        bound = run_config.get("secure-bound", DEFAULT_BOUND)
        if isinstance(bound, bool) or not isinstance(bound, int | float):
            raise ConfigError(f"run config 'secure-bound' must be a number > 0, got {bound!r}")
        if secure:
            refuse_insecure_settings(config, algorithm, len(sites), float(bound))
        return cls(
            config=config,
            sites=sites,
            run_dir=run_dir,
            run_name=str(run_config.get("run-name") or run_dir.name),
            wait_s=_seconds(run_config, "wait-s", 300.0),
            reply_timeout_s=_seconds(run_config, "reply-timeout-s", 600.0),
            resume=resume,
            lr_from_modality=modality_lr,
            secure_aggregation=secure,
            secure_bound=float(bound),
        )


def _seconds(run_config: dict[str, Any], key: str, default: float) -> float:
    value = run_config.get(key, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds <= MAX_WAIT_S or isinstance(value, bool):
        raise ConfigError(
            f"run config {key!r} must be a number of seconds > 0 and at most "
            f"{MAX_WAIT_S:.0f} (a week), got {value!r}"
        )
    return seconds


def site_info(data: Any, listed: list[str]) -> SiteInfo:
    """What a SuperNode says of its site, checked before the server uses any of it: the site
    must be one the run lists, and every field of the expected kind. Nothing in it is expanded
    or looked up on the server's machine."""
    if not isinstance(data, dict):
        raise ValueError("its description is not a JSON object")
    fields = {f.name for f in dataclasses.fields(SiteInfo)}
    if set(data) != fields:
        raise ValueError(f"its description holds {sorted(data)}, expected {sorted(fields)}")
    site_id = data["id"]
    if not isinstance(site_id, str) or site_id not in listed:
        raise ValueError(f"serves site {site_id!r}, which this run does not list")
    labels, shape = data["labels"], data["input_shape"]
    ok = (
        isinstance(data["modality"], str)
        and isinstance(labels, dict)
        and all(isinstance(k, str) and type(v) is int for k, v in labels.items())
        and isinstance(shape, list)
        and all(type(d) is int and d > 0 for d in shape)
        and type(data["n_train"]) is int
        and isinstance(data["manifest"], dict)
    )
    if not ok:
        raise ValueError(f"site {site_id!r}: its description has fields of the wrong kind")
    # Where the manifest lies on the site's machine means nothing here: blank it, so that no
    # reader of this run's config.toml on the server's machine opens a file by that name.
    manifest = {**data["manifest"], "manifest_path": ""}
    return SiteInfo(**{**data, "input_shape": tuple(shape), "manifest": manifest})


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


def _with(content: RecordDict, name: str, record: ArrayRecord) -> RecordDict:
    """A copy of ``content`` with one more record."""
    return RecordDict({**dict(content.items()), name: record})


def _subset(payload: bytes, keys: list[str]) -> bytes:
    """``keys`` of a validated float32 ``payload``, as a site that holds it rebuilds them
    (empty: none to rebuild)."""
    try:
        return wire.lossless_subset(payload, keys) if payload else b""
    except wire.WireError:  # keys the global state does not hold
        return b""


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


def _reply(reply: Message) -> Message | str:
    """A site's reply, or the reason it failed."""
    if reply.has_error():
        return f"Flower error: {reply.error.reason}"
    if "failure" in reply.content.config_records:
        return str(reply.content.config_records["failure"]["reason"])
    return reply


@app.main()
def main(grid: Grid, context: Context) -> None:
    FlowerRun(grid, Deployment.from_run_config(dict(context.run_config))).run()


class FlowerRun:
    """One deployed run: finds the sites, then runs the shared round loop, reaching each site
    by Flower messages (it is the loop's :class:`~medfed.federation.rounds.SiteLink`)."""

    def __init__(self, grid: Grid, deployment: Deployment) -> None:
        self.grid, self.d = grid, deployment
        self.run_dir = RunDir(deployment.run_dir)
        self.setup = resolve_device(deployment.config.device)
        self.nodes: dict[str, int] = {}
        self.lost: dict[str, str] = {}  # site -> why it left the run
        self.eval_bytes = 0  # bytes of the global state sent with each evaluation message
        self.secure: SecureSum | None = None  # the last round's secure sum
        self.n_train: dict[str, int] = {}  # site -> training scans, as its SuperNode said
        # The global weights of the last validation (float32, as sent) and the sha256 of those
        # each site validated: a training or finishing message whose weights a site can
        # rebuild from them names their hash instead of carrying them again.
        self.validated = b""
        self.holds: set[str] = set()
        # The round the last validation also trained (trains_ahead), and each site's answer.
        self.ahead_round: int | None = None
        self.ahead: dict[int, SiteReply | SiteFailure] = {}
        self.ahead_reused: dict[int, int] = {}  # downlink bytes each site rebuilt for it

    # ------------------------------------------------------------------ messaging
    def _send(
        self, kind: str, contents: dict[str, RecordDict], timeout: float | None = None
    ) -> dict[str, Message | str]:
        """Send ``contents[site]`` to each site; its reply, or why there is none.

        The wait is bounded by ``reply-timeout-s``, and stops early for a site whose SuperNode
        the SuperLink sees go offline (missed heartbeats).
        """
        online = set(self.grid.get_node_ids())
        answers: dict[str, Message | str] = {}
        messages, sites = [], []
        for site, content in contents.items():
            if site in self.lost:
                answers[site] = f"left the run earlier: {self.lost[site]}"
            elif self.nodes[site] not in online:
                answers[site] = "its SuperNode is not connected"
            else:
                messages.append(Message(content, dst_node_id=self.nodes[site], message_type=kind))
                sites.append(site)
        wait = self.d.reply_timeout_s if timeout is None else timeout
        pending = dict(zip(self.grid.push_messages(messages), sites, strict=True))
        deadline, checked = time.monotonic() + wait, time.monotonic()
        while pending and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(pending)):
                site = pending.pop(reply.metadata.reply_to_message_id, None)
                if site is not None:
                    answers[site] = _reply(reply)
            if pending and time.monotonic() - checked > 2.0:
                online, checked = set(self.grid.get_node_ids()), time.monotonic()
                for message_id, site in list(pending.items()):
                    if self.nodes[site] not in online:
                        answers[site] = "its SuperNode went offline"
                        del pending[message_id]
            if pending:
                time.sleep(0.2)
        for site in pending.values():
            answers[site] = f"no reply within {wait:g} s"
        return answers

    def _discover(self) -> list[SiteInfo]:
        """Wait (bounded) until every listed site's SuperNode has introduced itself."""
        deadline = time.monotonic() + self.d.wait_s
        infos: dict[str, SiteInfo] = {}
        problems: dict[int, str] = {}
        asked: set[int] = set()
        while True:
            new = [n for n in self.grid.get_node_ids() if n not in asked]
            messages = [
                Message(RecordDict(), dst_node_id=n, message_type=f"{MessageType.QUERY}.describe")
                for n in new
            ]
            left = max(1.0, deadline - time.monotonic())
            for reply in self.grid.send_and_receive(messages, timeout=min(left, 120.0)):
                node = reply.metadata.src_node_id
                asked.add(node)
                answer = _reply(reply)
                if isinstance(answer, str):
                    problems[node] = answer
                    continue
                try:
                    site = site_info(json_of(answer.content, "site"), self.d.sites)
                except (KeyError, ValueError) as exc:
                    problems[node] = str(exc)
                    continue
                if site.id in infos:
                    raise ConfigError(f"two SuperNodes serve site {site.id!r}; stop one of them")
                else:
                    infos[site.id], self.nodes[site.id] = site, node
            if len(infos) == len(self.d.sites):
                return [infos[s] for s in self.d.sites]
            if time.monotonic() > deadline:
                missing = [s for s in self.d.sites if s not in infos]
                detail = "; ".join(f"node {n}: {p}" for n, p in problems.items())
                raise ConfigError(
                    f"site(s) {missing} did not connect within {self.d.wait_s:g} s"
                    + (f" ({detail})" if detail else "")
                    + "; start their SuperNodes or raise wait-s"
                )
            time.sleep(0.5)

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        infos = self._discover()
        self.n_train = {info.id: info.n_train for info in infos}
        plan = plan_run(self.d.config, infos, lr_from_modality=self.d.lr_from_modality)
        self.d = dataclasses.replace(self.d, config=plan.config)
        self.server = Coordinator(plan, self.run_dir, self.setup)
        report = self.server.init_report
        settings = RunSettings(
            self.d.run_name,
            self.d.config,
            self.server.spec,
            self.d.sites,
            init_sha256=report.sha256 if report else "",
        )
        self.settings = json_record(settings.to_json())
        self.init_given: set[str] = set()  # sites that hold the starting weights
        event: dict[str, Any] = {"engine": "flower"}
        if self.d.secure_aggregation:
            event |= {"secure_aggregation": "secagg+", "secure_bound": self.d.secure_bound}
        return RoundLoop(self.server, self).train(resume=self.d.resume, **event)

    def _content(self, step: dict[str, Any], payload: bytes = b"", **more: Any) -> RecordDict:
        return RecordDict(
            {"run": self.settings, "step": json_record(step), "payload": payload_record(payload)}
            | more
        )

    def _with_init(self, contents: dict[str, RecordDict]) -> dict[str, RecordDict]:
        """The starting weights (--init) go along to each site until it has answered once;
        the site checks them against the hash in the run settings and keeps them."""
        init = self.server.init_state
        if not init:
            return contents
        record = state_record(init)
        return {
            site: content if site in self.init_given else _with(content, "init", record)
            for site, content in contents.items()
        }

    def _send_run(self, kind: str, contents: dict[str, RecordDict]) -> dict[str, Message | str]:
        """:meth:`_send` for messages that build the site's model (train, validate, finish)."""
        answers = self._send(kind, self._with_init(contents))
        self.init_given |= {site for site, a in answers.items() if isinstance(a, Message)}
        return answers

    def _to_all(
        self,
        kind: str,
        step: dict[str, Any],
        global_state: State,
        ahead: RoundInputs | None = None,
        sites: list[str] | None = None,
    ) -> tuple[dict[int, Any], bytes]:
        """Send the whole global state (float32, lossless) to every site still in the run (or
        to ``sites``; by its hash alone to a site that validated these very weights), with the
        next round's training for each site ``ahead`` samples; the answers, and the weights as
        sent."""
        keys = sorted(global_state)
        payload = encode(global_state, WireFormat()) if keys else b""
        subset = _subset(payload, ahead.plan.keys) if ahead is not None else b""
        contents = {}
        for site in self.d.sites if sites is None else sites:
            if site in self.lost:
                continue
            content = self._weights(site, step | {"keys": keys}, payload, self.validated)[0]
            index = self.d.sites.index(site)
            if ahead is not None and index in ahead.downs:
                # The site keeps the weights it validates before it trains: the training
                # part names them by their hash, as a later training message would.
                step_ahead = self._train_step(ahead, index)
                down = ahead.downs[index].payload
                part, self.ahead_reused[index] = self._weights(
                    site, step_ahead, down, subset, holds=True
                )
                more = {"next": part["step"], "next_payload": part["payload"]}
                content = RecordDict({**dict(content.items()), **more})
            contents[site] = content
        answers = self._send_run(kind, contents)
        self.eval_bytes = len(payload)
        return {self.d.sites.index(s): a for s, a in answers.items()}, payload

    def _weights(
        self,
        site: str,
        step: dict[str, Any],
        payload: bytes,
        validated_subset: bytes,
        holds: bool | None = None,
    ) -> tuple[RecordDict, int]:
        """A message's content for ``site`` with ``payload``, the weights; when they are
        ``validated_subset`` (the validated weights' own keys, as the site rebuilds them) and
        the site holds the validated weights (``holds``; by default: it validated the last
        ones), their hash goes instead. The bytes the site then rebuilt rather than received."""
        if holds is None:
            holds = site in self.holds
        if payload and payload == validated_subset and holds:
            digest = hashlib.sha256(payload).hexdigest()
            return self._content(step | {"reuse_validated": digest}), len(payload)
        return self._content(step, payload), 0

    # ------------------------------------------------------------------ SiteLink
    def restore(self, states: dict[str, State]) -> None:
        """Nothing to do: every SuperNode resumes from its own checkpoints."""

    @property
    def trains_ahead(self) -> bool:
        """Validation carries the next round's training, but under secure aggregation (a
        secure round goes through SecAgg+'s own exchanges)."""
        return not self.d.secure_aggregation

    def _train_step(self, inputs: RoundInputs, index: int) -> dict[str, Any]:
        plan = inputs.plan
        step = {"round": plan.round, "lr": plan.lr, "keys": plan.keys}
        step["fault"] = inputs.faults.get(index)
        if self.d.secure_aggregation and plan.keys:
            step["secure_bound"] = self.d.secure_bound
        return step

    def train(
        self, plan: RoundPlan, downs: dict[int, Downlink], faults: dict[int, str]
    ) -> dict[int, SiteReply | SiteFailure]:
        """The round's training; a site that already trained it with the last validation's
        message (:attr:`trains_ahead`) answered then. A site whose validation went unanswered
        gets a training message of its own now."""
        secure = self.d.secure_aggregation and bool(plan.keys)
        ahead = self.ahead if self.ahead_round == plan.round else {}
        self.ahead_round, self.ahead = None, {}
        # The validated weights' subset this round sends, as a site that holds them rebuilds it.
        subset = _subset(self.validated, plan.keys)
        replies = {index: ahead[index] for index in downs if index in ahead}
        inputs = RoundInputs(plan, downs, faults)
        contents, reused = {}, {}
        for index, down in downs.items():
            if index in ahead:
                continue
            step = self._train_step(inputs, index)
            site = self.d.sites[index]
            contents[site], reused[index] = self._weights(site, step, down.payload, subset)
        self.secure = None
        if not contents:
            return replies
        sent = self._train_secure(plan, contents) if secure else self._train_plain(contents)
        for index, reply in sent.items():
            if isinstance(reply, SiteReply):
                reply.record["bytes_down_reused"] = reused[index]
        return replies | sent

    def _train_plain(self, contents: dict[str, RecordDict]) -> dict[int, SiteReply | SiteFailure]:
        return {
            self.d.sites.index(site): (
                SiteFailure(answer) if isinstance(answer, str) else _trained(answer.content)
            )
            for site, answer in self._send_run(MessageType.TRAIN, contents).items()
        }

    def _train_secure(
        self, plan: RoundPlan, contents: dict[str, RecordDict]
    ) -> dict[int, SiteReply | SiteFailure]:
        """A round under SecAgg+: the sites' masked updates add up to their weighted mean, the
        only update the server sees (:attr:`secure`)."""
        online = set(self.grid.get_node_ids())
        replies: dict[int, SiteReply | SiteFailure] = {}
        ready = {}
        for site, content in contents.items():
            if site in self.lost:
                replies[self.d.sites.index(site)] = SiteFailure(
                    f"left the run earlier: {self.lost[site]}"
                )
            elif self.nodes[site] not in online:
                replies[self.d.sites.index(site)] = SiteFailure("its SuperNode is not connected")
            else:
                ready[site] = content
        if len(ready) < 2:
            self.secure = SecureSum(
                None, f"{len(ready)} site(s) reachable; SecAgg+ needs at least 2 for a sum"
            )
            return replies
        by_node = {self.nodes[s]: s for s in ready}
        result = secure_round(
            self.grid,
            plan.round,
            {self.nodes[s]: c for s, c in self._with_init(ready).items()},
            {self.nodes[s]: self.n_train[s] for s in ready},
            self.d.reply_timeout_s,
        )
        for node, site in by_node.items():
            index = self.d.sites.index(site)
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
                    bound=self.d.secure_bound,
                    reason="values of the update moved further than --secure-bound in one "
                    "round and were clipped on the site; raise --secure-bound",
                )
        mean = None
        if result.vectors is not None:
            try:
                mean = mean_state(result.vectors, plan.keys, plan.outgoing, self.d.secure_bound)
            except ValueError as exc:
                result.halted = str(exc)
        self.secure = SecureSum(mean, result.halted)
        return replies

    def secure_sum(self) -> SecureSum | None:
        return self.secure

    def commit(self, index: int) -> None:
        """Nothing to do: a SuperNode keeps its round as soon as it has trained."""

    def validate(
        self, round_: int, global_state: State, ahead: RoundInputs | None = None
    ) -> dict[int, dict[str, Any]]:
        self.holds = set()  # validation always sends the weights: they are new
        kind = f"{MessageType.EVALUATE}.validate"
        self.ahead_reused = {}
        answers, self.validated = self._to_all(kind, {"round": round_}, global_state, ahead)
        self.holds = {self.d.sites[i] for i, a in answers.items() if isinstance(a, Message)}
        if ahead is not None:
            self.ahead_round = ahead.plan.round
            self.ahead = {}
            for index, answer in answers.items():
                records = answer.content.config_records if isinstance(answer, Message) else {}
                # (a site that answered without training it gets a training message then)
                if index in ahead.downs and ({"next_result", "next_failure"} & set(records)):
                    reused = self.ahead_reused[index]
                    self.ahead[index] = _trained(answer.content, "next_", reused)
        return {
            index: json_of(a.content, "figures") | {"bytes_eval": self.eval_bytes}
            for index, a in answers.items()
            if isinstance(a, Message)
        }

    def site_states(self) -> dict[str, State]:
        return {}

    def finish(self, global_state: State) -> dict[int, Published | SiteFailure]:
        step = {"round": self.d.config.rounds}
        kind = f"{MessageType.EVALUATE}.finish"
        answers, _ = self._to_all(kind, step, global_state)
        # A site that failed with the weights named by their hash (its copy gone or damaged,
        # say) is sent the weights themselves, once.
        again = [s for i, s in enumerate(self.d.sites) if isinstance(answers.get(i), str)]
        again = [s for s in again if s in self.holds]
        if again:
            for site in again:
                reason = answers[self.d.sites.index(site)]
                self.server.run.log_event("weights_resent", site=site, reason=reason)
            self.holds -= set(again)
            answers |= self._to_all(kind, step, global_state, sites=again)[0]
        out: dict[int, Published | SiteFailure] = {}
        for index, answer in answers.items():
            if not isinstance(answer, Message):
                self.lost[self.d.sites[index]] = answer
                out[index] = SiteFailure(answer)
                continue
            reply = answer.content
            site = self.d.sites[index]
            try:
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
            except (KeyError, TypeError, ValueError, MedfedError) as exc:
                self.lost[site] = str(exc)
                out[index] = SiteFailure(str(exc))
                continue
            weights = state_of(reply, "weights")
            out[index] = Published(entry, n_train, weights, gaussian, privacy)
        return out

    def abstention_scores(self, fed: TrainedFederation) -> list[np.ndarray]:
        answers = self._send(f"{MessageType.EVALUATE}.calibrate", self._federation(fed))
        return [
            a.content.array_records["scores"]["scores"].numpy()
            for a in answers.values()
            if isinstance(a, Message)
        ]

    def test(self, fed: TrainedFederation) -> list[dict[str, Any]]:
        answers = self._send(f"{MessageType.EVALUATE}.test", self._federation(fed))
        return [
            json_of(answers[s.id].content, "evaluation")
            for s in fed.sites
            if isinstance(answers[s.id], Message)
        ]

    def summary_extra(self) -> dict[str, Any]:
        return {"engine": "flower", "lost_sites": dict(self.lost)}

    def _federation(self, fed: TrainedFederation) -> dict[str, RecordDict]:
        """Every published model, for each site to evaluate on its own scans."""
        weights = weights_records(fed.weights())
        return {
            s.id: RecordDict(
                {"run": self.settings, "federation": json_record(fed.describe())} | weights
            )
            for s in fed.sites
        }
