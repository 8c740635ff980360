"""The ServerApp's messages to the SuperNodes: finding the sites, sending, waiting for replies.

Sites are known by the id in their manifest (Flower's node ids are random); a site that left
the run gets no more messages. What a message holds is :class:`~medfed.flower.link.FlowerLink`'s
business.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from medfed.core.errors import ConfigError
from medfed.federation.coordinator import SiteInfo
from medfed.flower.records import json_of
from medfed.flower.secure import SecureRound, secure_round


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


def refusal_of(reply: Message) -> tuple[str, list[dict[str, str]]] | None:
    """The site and the broken rules of a site's refusal by its policy; None for another reply."""
    if reply.has_error() or "refusal" not in reply.content.config_records:
        return None
    try:
        data = json_of(reply.content, "refusal")
        rules = [{"rule": str(r["rule"]), "reason": str(r["reason"])} for r in data["refusals"]]
        return str(data["site"]), rules
    except (KeyError, TypeError, ValueError):
        return None


def reply_or_reason(reply: Message) -> Message | str:
    """A site's reply, or the reason it failed."""
    if reply.has_error():
        return f"Flower error: {reply.error.reason}"
    if "failure" in reply.content.config_records:
        return str(reply.content.config_records["failure"]["reason"])
    return reply


HEARTBEAT_PATIENCE = 2
"""Flower 1.42's SuperLink lists a node as online until this many heartbeat intervals after its
last beat (flwr.common.constant.HEARTBEAT_PATIENCE)."""
HEARTBEAT_SLACK_S = 5.0
"""Seconds a beat may come late (Flower's heartbeat call times out after 5 s)."""
HEARTBEAT_CHECKED_UP_TO_S = 600.0
"""Longer intervals (Flower's simulation sets 1e300) are not checked."""


@dataclasses.dataclass(frozen=True)
class Deadline:
    """When an exchange stops waiting for a late site: ``floor_s`` plus ``factor`` times the
    reference after the reference, which is the slowest reply of this exchange so far or the
    site's own slowest earlier reply, whichever is longer; without either (no site answered
    yet, and this one never did), only the reply timeout and Flower's liveness apply. A site
    that missed a deadline and has not been heard from since (``silent``) is given ``floor_s``
    only. Its late reply, when it comes, still counts as its reply time, so a site slower than
    the others is given longer from then on."""

    floor_s: float = 10.0
    factor: float = 2.0

    def reason(
        self, elapsed: float, slowest: float | None, own: float | None, silent: bool
    ) -> str | None:
        """Why a site that has not answered after ``elapsed`` seconds is given up; None to
        wait on."""
        if silent:
            if elapsed <= self.floor_s:
                return None
            return (
                f"no reply within the exchange's deadline of {self.floor_s:g} s, after it "
                "missed the last exchange's deadline too; its SuperNode may have stopped"
            )
        known = [s for s in (slowest, own) if s is not None]
        if not known:
            return None
        reference = max(known)
        limit = reference + max(self.floor_s, self.factor * reference)
        if elapsed <= limit:
            return None
        whose = "the slowest reply so far" if reference == slowest else "its own slowest reply"
        return (
            f"no reply within the exchange's deadline of {limit:.1f} s ({whose} "
            f"{reference:.1f} s, plus the larger of {self.floor_s:g} s and {self.factor:g} x "
            "that); its SuperNode may have stopped"
        )


class Messenger:
    """Reaches the run's sites (``sites``: their ids, in the run's order) through a Flower grid.

    ``reply_timeout_s`` bounds one exchange's wait for replies, ``wait_s`` the wait for every
    site to connect."""

    def __init__(self, grid: Grid, sites: list[str], reply_timeout_s: float, wait_s: float) -> None:
        self.grid, self.sites = grid, sites
        self.reply_timeout_s, self.wait_s = reply_timeout_s, wait_s
        self.nodes: dict[str, int] = {}  # site -> its SuperNode's node id
        self.lost: dict[str, str] = {}  # site -> why it left the run
        # site -> the rules of its policy that refused the run (the broken rules, each with why)
        self.refused: dict[str, list[dict[str, str]]] = {}
        self.deadline = Deadline()
        self.reply_s: dict[str, float] = {}  # site -> its slowest reply so far, in seconds
        self.silent: set[str] = set()  # sites that missed a deadline and were not heard since
        # message id -> (site, when sent): messages whose reply came too late, still looked for
        self.late: dict[str, tuple[str, float]] = {}

    def reachable(
        self, contents: dict[str, RecordDict]
    ) -> tuple[dict[str, RecordDict], dict[str, str]]:
        """The messages of ``contents`` that can go now, and why each other one cannot."""
        online = set(self.grid.get_node_ids())
        ready: dict[str, RecordDict] = {}
        why: dict[str, str] = {}
        for site, content in contents.items():
            if site in self.lost:
                why[site] = f"left the run earlier: {self.lost[site]}"
            elif self.nodes[site] not in online:
                why[site] = "its SuperNode is not connected"
            else:
                ready[site] = content
        return ready, why

    def send(
        self, kind: str, contents: dict[str, RecordDict], timeout: float | None = None
    ) -> dict[str, Message | str]:
        """Send ``contents[site]`` to each site; its reply, or why there is none.

        The wait is bounded by ``reply-timeout-s``, and by the exchange's deadline for a site
        that is late (:class:`Deadline`): a SuperNode killed mid-task leaves no trace the
        SuperLink sees until its heartbeats lapse, so the other sites' reply times say when
        to stop waiting for it. It also stops early for a SuperNode whose heartbeat is overdue
        or that the SuperLink sees go offline.
        """
        ready, why = self.reachable(contents)
        answers: dict[str, Message | str] = dict(why)
        messages = [
            Message(content, dst_node_id=self.nodes[site], message_type=kind)
            for site, content in ready.items()
        ]
        sites = list(ready)
        wait = self.reply_timeout_s if timeout is None else timeout
        sent = time.monotonic()
        # A late reply still counts for a while; past the reply timeout it is given up.
        self.late = {m: (s, t) for m, (s, t) in self.late.items() if sent - t < wait}
        pending = dict(zip(self.grid.push_messages(messages), sites, strict=True))
        deadline, checked = time.monotonic() + wait, time.monotonic()  # (after the push)
        replied: list[float] = []  # this exchange's reply times, in seconds since it was sent
        while pending and time.monotonic() < deadline:
            for reply in self.grid.pull_messages([*pending, *self.late]):
                message_id = reply.metadata.reply_to_message_id
                if message_id in self.late:  # a late site's reply, after its deadline
                    site, then = self.late.pop(message_id)
                    if not reply.has_error():  # (Flower answers for a node gone offline)
                        self.heard(site, time.monotonic() - then)
                    continue
                site = pending.pop(message_id, None)
                if site is not None:
                    if not reply.has_error():
                        replied.append(time.monotonic() - sent)
                        self.heard(site, replied[-1])
                    answers[site] = reply_or_reason(reply)
                    if refusal_of(reply) is not None:  # the site's policy: it leaves the run
                        self.lost[site] = str(answers[site])
            for message_id, site in list(pending.items()):
                elapsed, own = time.monotonic() - sent, self.reply_s.get(site)
                slowest = max(replied, default=None)
                late = self.deadline.reason(elapsed, slowest, own, site in self.silent)
                if late is not None:
                    answers[site] = late
                    self.late[message_id] = (site, sent)
                    self.silent.add(site)
                    del pending[message_id]
            if pending and time.monotonic() - checked > 2.0:
                checked, nodes = time.monotonic(), self.node_infos()
                for message_id, site in list(pending.items()):
                    gone = self.gone(site, nodes)
                    if gone is not None:
                        answers[site] = gone
                        self.silent.add(site)
                        del pending[message_id]
            if pending:
                time.sleep(0.2)
        for message_id, site in pending.items():
            answers[site] = f"no reply within {wait:g} s"
            self.late[message_id] = (site, sent)
            self.silent.add(site)
        return answers

    def heard(self, site: str, seconds: float) -> None:
        """``site`` answered a message ``seconds`` after it was sent."""
        self.reply_s[site] = max(seconds, self.reply_s.get(site, 0.0))
        self.silent.discard(site)

    def node_infos(self) -> dict[int, Any] | None:
        """The SuperLink's record of each online node (Flower's NodeInfo: status, online_until,
        heartbeat_interval); None from a grid that lists node ids only."""
        get_nodes = getattr(self.grid, "get_nodes", None)
        if get_nodes is None:
            return None
        return {int(info.node_id): info for info in get_nodes()}

    def gone(self, site: str, nodes: dict[int, Any] | None) -> str | None:
        """Why the SuperLink's view of ``site``'s SuperNode (``nodes``: :meth:`node_infos`)
        says it stopped; None while it looks alive.

        Flower 1.42's SuperNodes beat every 17.5 to 22.5 s (HEARTBEAT_DEFAULT_INTERVAL, 30 s,
        less its 5 s call timeout, times 0.7 to 0.9) and the SuperLink lists a node as online
        until two intervals (60 s) after its last beat; a beat more than one interval old (plus
        slack for a slow call) is overdue on a live node."""
        node = self.nodes[site]
        if nodes is None:
            return None if node in set(self.grid.get_node_ids()) else "its SuperNode went offline"
        info = nodes.get(node)
        if info is None or info.status != "online":
            return "its SuperNode went offline"
        interval = float(info.heartbeat_interval)
        age = time.time() - (float(info.online_until) - HEARTBEAT_PATIENCE * interval)
        if 0 < interval <= HEARTBEAT_CHECKED_UP_TO_S and age > interval + HEARTBEAT_SLACK_S:
            return (
                f"its SuperNode's last heartbeat is {age:.0f} s old (a live one beats at least "
                f"every {interval:g} s)"
            )
        return None

    def keep_only(self, sites: list[str]) -> None:
        """Send to ``sites`` only from now on (the others refused the run)."""
        unknown = [s for s in sites if s not in self.sites]
        if unknown:
            raise ValueError(f"not among the run's sites: {unknown}")
        self.sites = list(sites)

    def send_secure(
        self, round_: int, contents: dict[str, RecordDict], weights: dict[str, int]
    ) -> tuple[SecureRound, dict[int, str]]:
        """One SecAgg+ round over the sites of ``contents`` (``weights``: each one's training
        scans); what it gave, and the site of each node id it speaks of."""
        result = secure_round(
            self.grid,
            round_,
            {self.nodes[s]: c for s, c in contents.items()},
            {self.nodes[s]: weights[s] for s in contents},
            self.reply_timeout_s,
        )
        return result, {self.nodes[s]: s for s in contents}

    def discover(self, plan: dict[str, Any] | None = None) -> list[SiteInfo]:
        """Wait (bounded) until every listed site's SuperNode has introduced itself, or refused
        the run's ``plan`` (recorded in :attr:`refused`); the sites that accepted, in order."""
        deadline = time.monotonic() + self.wait_s
        infos: dict[str, SiteInfo] = {}
        problems: dict[int, str] = {}
        asked: set[int] = set()
        while True:
            new = [n for n in self.grid.get_node_ids() if n not in asked]
            content = {} if plan is None else {"plan": ConfigRecord({"json": json.dumps(plan)})}
            messages = [
                Message(
                    RecordDict(content), dst_node_id=n, message_type=f"{MessageType.QUERY}.describe"
                )
                for n in new
            ]
            left = max(1.0, deadline - time.monotonic())
            for reply in self.grid.send_and_receive(messages, timeout=min(left, 120.0)):
                node = reply.metadata.src_node_id
                asked.add(node)
                refusal = refusal_of(reply)
                if refusal is not None:
                    site_id, rules = refusal
                    if site_id in self.sites:
                        self.refused[site_id] = rules
                        continue
                answer = reply_or_reason(reply)
                if isinstance(answer, str):
                    problems[node] = answer
                    continue
                try:
                    site = site_info(json_of(answer.content, "site"), self.sites)
                except (KeyError, ValueError) as exc:
                    problems[node] = str(exc)
                    continue
                if site.id in infos:
                    raise ConfigError(f"two SuperNodes serve site {site.id!r}; stop one of them")
                else:
                    infos[site.id], self.nodes[site.id] = site, node
            if len(infos) + len(self.refused.keys() - infos.keys()) == len(self.sites):
                return [infos[s] for s in self.sites if s in infos]
            if time.monotonic() > deadline:
                missing = [s for s in self.sites if s not in infos and s not in self.refused]
                detail = "; ".join(f"node {n}: {p}" for n, p in problems.items())
                raise ConfigError(
                    f"site(s) {missing} did not connect within {self.wait_s:g} s"
                    + (f" ({detail})" if detail else "")
                    + "; start their SuperNodes or raise wait-s"
                )
            time.sleep(0.5)
