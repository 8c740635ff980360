"""A statistics-only deployed run: no training, no weights, one message per site.

The app folder ``medfed deploy stats`` writes has ``mode = "statistics"`` in its run config;
the ServerApp then sends each SuperNode one ``query.statistics`` message carrying the run's
plan (:mod:`medfed.governance.statistics`). The site's gate checks the plan against the site's
policy and logs the message like any other; an accepted site computes its data card's
statistics with the onboarding check (:func:`medfed.data.checks.check_site`), suppresses and
noises them (:func:`medfed.governance.disclosure.release`) and answers with what it releases.
The coordinator adds each class's prevalence with its Wilson CI and writes
``RUN/statistics.json`` (:class:`~medfed.runs.schema.FederationStatistics`), refusals and
failures included, each with its reason.

Run config: ``mode``, ``sites``, ``run-dir``, ``run-name``, ``wait-s``, ``reply-timeout-s``,
``min-count``, ``noise``, ``epsilon``, ``delta``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid

from medfed.core.errors import ConfigError, MedfedError
from medfed.flower.waits import REPLY_TIMEOUT_S, WAIT_S, run_target
from medfed.governance.disclosure import federation_statistics, release, site_entry
from medfed.governance.plan import Plan
from medfed.governance.statistics import (
    DEFAULT_DELTA,
    StatisticsSettings,
    is_statistics_plan,
    make_statistics_plan,
    statistics_settings,
)
from medfed.runs.schema import FederationStatistics, SiteStatistics
from medfed.runs.statistics import write_statistics

MODE = "statistics"
KIND = "query.statistics"


@dataclass(frozen=True)
class StatisticsDeployment:
    """The run config of a statistics run."""

    settings: StatisticsSettings
    sites: list[str]
    run_dir: Path
    run_name: str
    wait_s: float = WAIT_S
    reply_timeout_s: float = REPLY_TIMEOUT_S

    def plan(self) -> Plan:
        return make_statistics_plan(self.settings, self.sites, run_name=self.run_name)

    def run_config(self) -> dict[str, Any]:
        s = self.settings
        return {
            "mode": MODE,
            "sites": ",".join(self.sites),
            "run-dir": str(self.run_dir),
            "run-name": self.run_name,
            "wait-s": float(self.wait_s),
            "reply-timeout-s": float(self.reply_timeout_s),
            "min-count": s.min_count,
            "noise": s.noise,
            "epsilon": s.epsilon,
            "delta": s.delta,
        }

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> StatisticsDeployment:
        if run_config.get("mode") != MODE:
            raise ConfigError("not a statistics run's config; write it with 'medfed deploy stats'")
        target = run_target(run_config, ("sites", "run-dir"), "medfed deploy stats")
        settings = StatisticsSettings(
            min_count=run_config.get("min-count", 0),
            noise=run_config.get("noise", "none"),
            epsilon=run_config.get("epsilon", 0.0),
            delta=run_config.get("delta", 0.0),
        )
        return cls(settings=settings, **target)


def statistics_run_config(app: Path) -> dict[str, Any] | None:
    """The run config of a statistics app folder (``medfed deploy stats``), None for another
    app folder (or one that cannot be read: its own reader says why)."""
    import tomllib

    path = app / "pyproject.toml" if app.is_dir() else app
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    config = data.get("tool", {}).get("flwr", {}).get("app", {}).get("config")
    if isinstance(config, dict) and config.get("mode") == MODE:
        return dict(config)
    return None


def default_delta(noise: str, delta: float | None) -> float:
    """The delta a statistics run uses: given, else :data:`DEFAULT_DELTA` for gaussian noise."""
    if delta is not None:
        return delta
    return DEFAULT_DELTA if noise == "gaussian" else 0.0


# ---------------------------------------------------------------------------- the site's side
def _json_record(data: Any) -> ConfigRecord:
    return ConfigRecord({"json": json.dumps(data, allow_nan=False)})


def site_statistics(content: RecordDict, context: Context) -> RecordDict:
    """The site's answer to ``query.statistics`` (its gate has accepted the plan): what it
    releases of its data card, or why it cannot."""
    from medfed.flower.gate import site_id

    config = dict(context.node_config)
    try:
        released = _released(content, config)
    except Exception as exc:  # the coordinator records the reason against this site
        reason = str(exc) if isinstance(exc, MedfedError) else f"{type(exc).__name__}: {exc}"
        return RecordDict(
            {
                "failure": ConfigRecord({"reason": reason}),
                "site": _json_record({"site": site_id(config)}),
            }
        )
    return RecordDict({"statistics": _json_record(released)})


def _released(content: RecordDict, config: dict[str, Any]) -> dict[str, Any]:
    from medfed.config import load_manifest
    from medfed.data.cache import TensorCache, default_cache_dir
    from medfed.data.checks import check_site
    from medfed.governance.policy import load_policy

    plan = Plan.from_json(json.loads(str(content.config_records["plan"]["json"])))
    if not is_statistics_plan(plan):
        raise ConfigError("the message's plan is not a statistics run's; nothing is released")
    settings = statistics_settings(plan)
    manifest = config.get("manifest")
    if not manifest:
        raise ConfigError(
            "this SuperNode has no site manifest: start it with --node-config "
            '\'manifest="/path/to/site.toml" state-dir="/path/to/state"\''
        )
    cache_dir = config.get("cache-dir")
    cache = TensorCache(Path(str(cache_dir)) if cache_dir else default_cache_dir())
    report = check_site(load_manifest(str(manifest)), cache)
    if report.unusable:
        raise ConfigError(f"site manifest {manifest}: {report.unusable}")
    policy = config.get("policy")
    floor = load_policy(str(policy)).min_count if policy else 0
    return release(report.to_dict(), settings, policy_min_count=floor)


# ---------------------------------------------------------------------------- the coordinator
def run_statistics(grid: Grid, deployment: StatisticsDeployment) -> FederationStatistics:
    """Ask every listed site for its statistics; write and return ``statistics.json``."""
    plan = deployment.plan()
    answers = _ask(grid, deployment, plan)
    sites = {site: answers.get(site) or _missing(deployment) for site in deployment.sites}
    statistics = federation_statistics(
        deployment.settings, sites, run_name=deployment.run_name, plan=plan, engine="flower"
    )
    write_statistics(deployment.run_dir, statistics)
    return statistics


def _missing(deployment: StatisticsDeployment) -> SiteStatistics:
    return SiteStatistics(
        status="failed",
        reason=f"no answer: its SuperNode did not connect within {deployment.wait_s:g} s or "
        f"did not reply within {deployment.reply_timeout_s:g} s; start it, or raise wait-s or "
        "reply-timeout-s",
    )


def _answer(reply: Message, listed: list[str]) -> tuple[str, SiteStatistics] | None:
    """The site and its entry, from one reply (None: a reply naming no listed site)."""
    from medfed.flower.messenger import refusal_of

    refusal = refusal_of(reply)
    if refusal is not None:
        site, rules = refusal
        reason = f"refused by its policy, rule {rules[0]['rule']}: {rules[0]['reason']}"
        return site, SiteStatistics(status="refused", reason=reason, refusals=rules)
    if reply.has_error():
        return None
    records = reply.content.config_records
    try:
        if "statistics" in records:
            released = json.loads(str(records["statistics"]["json"]))
            site = str(released["site"])
        else:
            site = str(json.loads(str(records["site"]["json"]))["site"])
            return site, SiteStatistics(status="failed", reason=str(records["failure"]["reason"]))
    except (KeyError, TypeError, ValueError):
        return None  # a reply that names no site cannot be told apart
    try:
        return site, site_entry(released)
    except (MedfedError, TypeError, ValueError) as exc:
        return site, SiteStatistics(status="failed", reason=f"its statistics are malformed: {exc}")


def _ask(grid: Grid, d: StatisticsDeployment, plan: Plan) -> dict[str, SiteStatistics]:
    """Each SuperNode once, as it connects, until every listed site answered or ``wait-s``
    passed; each exchange waits up to ``reply-timeout-s`` for its replies (a site reads and
    checks every scan it holds before it answers)."""
    deadline = time.monotonic() + d.wait_s
    answers: dict[str, SiteStatistics] = {}
    asked: set[int] = set()
    record = _json_record(plan.to_json())
    while len(answers) < len(d.sites) and time.monotonic() < deadline:
        new = [n for n in grid.get_node_ids() if n not in asked]
        messages = [
            Message(RecordDict({"plan": record}), dst_node_id=n, message_type=KIND) for n in new
        ]
        asked |= set(new)
        if messages:
            for reply in grid.send_and_receive(messages, timeout=d.reply_timeout_s):
                found = _answer(reply, d.sites)
                if found is not None and found[0] in d.sites:
                    answers[found[0]] = found[1]
        if len(answers) < len(d.sites):
            time.sleep(0.5)
    return answers
