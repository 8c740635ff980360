"""The ServerApp: a deployed run's rounds, aggregation and run directory, on the SuperLink.

It drives the same :class:`~medfed.federation.coordinator.Coordinator` as the in-process engine and
writes the same run directory, so ``medfed evaluate``, ``medfed route`` and the dashboard read a
deployed run unchanged. Sites are known by the id in their manifest (Flower's node ids are
random); the run's config names them in order, which fixes each site's index.

Run config (``[tool.flwr.app.config]`` of the app folder ``medfed deploy app`` writes):
``train`` (TOML of the training settings), ``sites`` (comma-separated ids), ``run-dir``,
``run-name``, ``wait-s`` (how long to wait for every site to connect), ``reply-timeout-s`` (how
long one round waits for replies), ``resume``, ``secure-aggregation`` with ``secure-bound``
(SecAgg+, :mod:`medfed.flower.secure`), and ``on-refusal`` (``stop`` or ``continue`` when a
site's policy refuses the run). A run config with ``mode = "statistics"`` (``medfed deploy
stats``) is a statistics-only run instead (:mod:`medfed.flower.statistics`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.federation.coordinator import Coordinator
from medfed.federation.plan import Settled, plan_run, settle
from medfed.federation.pretrained import starting_sha256
from medfed.federation.rounds import RoundLoop, RoundSource
from medfed.flower.deploy import refuse_insecure_settings, refuse_unsupported
from medfed.flower.link import FlowerLink
from medfed.flower.messenger import Messenger
from medfed.flower.node import RunSettings, train_config_from_toml
from medfed.flower.secure import DEFAULT_BOUND
from medfed.flower.waits import run_target
from medfed.governance.plan import Plan, make_plan
from medfed.governance.policy import SHA256
from medfed.models.device import resolve_device
from medfed.runs import RunDir

app = ServerApp()

PREDICTIONS = ("site", "coordinator")
"""Where a deployed run's per-scan test predictions go (run config ``predictions``)."""
ON_REFUSAL = ("stop", "continue")
"""What a run does when a site's policy refuses it (run config ``on-refusal``)."""


@dataclass(frozen=True)
class Deployment:
    """The run config of a deployed run: its settings settled (the algorithm built and the
    refusals that need no scans passed) before the server waits for the sites."""

    settled: Settled
    sites: list[str]
    run_dir: Path
    run_name: str
    wait_s: float
    reply_timeout_s: float
    resume: bool
    # SecAgg+: the server sees only the weighted mean of each round's updates.
    secure_aggregation: bool = False
    secure_bound: float = DEFAULT_BOUND
    # When a site's policy refuses the run: "stop" the run, or "continue" without that site.
    on_refusal: str = "stop"
    # The starting weights' sha256 as the app was written (the plan the sites approve names it).
    init_sha256: str = ""
    # Where the per-scan test predictions go (run config ``predictions``): "site" keeps them in
    # each site's state folder; "coordinator" asks for them (the plan lists them as an output).
    predictions: str = "site"

    @property
    def config(self) -> TrainConfig:
        """The settled settings; a learning rate left unset (None) is decided by the run's
        plan, once the server knows the sites' modality."""
        return self.settled.config

    def plan(self) -> Plan:
        """The run's plan as each site's gate checks it (:mod:`medfed.governance.plan`)."""
        return make_plan(
            self.config,
            self.sites,
            run_name=self.run_name,
            secure_aggregation=self.secure_aggregation,
            secure_bound=self.secure_bound,
            starting_sha256=self.init_sha256,
            predictions_to_coordinator=self.predictions == "coordinator",
        )

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> Deployment:
        target = run_target(run_config, ("train", "sites", "run-dir"), "medfed deploy app")
        sites = target["sites"]
        if "lr-from-modality" in run_config:
            raise ConfigError(
                "run config 'lr-from-modality': this app folder was written by an older medfed "
                "(a plan now leaves lr out where the sites' modality sets it); write it again "
                "with 'medfed deploy app' and have the sites approve its plan"
            )
        where = "run config 'train'"
        config = train_config_from_toml(str(run_config["train"]), where)
        refuse_unsupported(config)
        settled = settle(config, sites, where=where)  # before the wait for the sites
        config, algorithm = settled.config, settled.algorithm
        flags = ("resume", "secure-aggregation", "secure-aggregation-two-sites")
        resume, secure, two_sites = (run_config.get(k, False) for k in flags)
        for key, value in zip(flags, (resume, secure, two_sites), strict=True):
            if not isinstance(value, bool):
                raise ConfigError(f"run config {key!r} must be true or false, got {value!r}")
        bound = run_config.get("secure-bound", DEFAULT_BOUND)
        if isinstance(bound, bool) or not isinstance(bound, int | float):
            raise ConfigError(f"run config 'secure-bound' must be a number > 0, got {bound!r}")
        if secure:
            refuse_insecure_settings(
                config, algorithm, len(sites), float(bound), two_sites=two_sites
            )
        on_refusal = run_config.get("on-refusal", "stop")
        if on_refusal not in ON_REFUSAL:
            raise ConfigError(
                f"run config 'on-refusal' must be one of {', '.join(ON_REFUSAL)}, got "
                f"{on_refusal!r}"
            )
        return cls(
            settled=settled,
            **target,
            resume=resume,
            secure_aggregation=secure,
            secure_bound=float(bound),
            on_refusal=on_refusal,
            init_sha256=_init_sha256(run_config, config.init),
            predictions=_predictions(run_config),
        )


def _predictions(run_config: dict[str, Any]) -> str:
    value = run_config.get("predictions", "site")
    if value not in PREDICTIONS:
        raise ConfigError(
            f"run config 'predictions' must be one of {', '.join(PREDICTIONS)}, got {value!r} "
            "(site: each site keeps its per-scan predictions; coordinator: they are sent)"
        )
    return str(value)


def _init_sha256(run_config: dict[str, Any], init: str) -> str:
    value = run_config.get("init-sha256", "")
    if not isinstance(value, str) or (value and not SHA256.fullmatch(value)):
        raise ConfigError(f"run config 'init-sha256' must be a sha256 hash, got {value!r}")
    if init and not value:  # an app folder written before the plan named its weights' hash
        try:
            return starting_sha256(init)
        except ConfigError as exc:
            raise ConfigError(
                f"run config 'init-sha256' is missing and the starting weights cannot be read "
                f"here ({exc}); write the app folder again with 'medfed deploy app'"
            ) from None
    return value


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_config = dict(context.run_config)
    if run_config.get("mode") == "statistics":  # 'medfed deploy stats': no training
        from medfed.flower.statistics import StatisticsDeployment, run_statistics

        run_statistics(grid, StatisticsDeployment.from_run_config(run_config))
        return
    FlowerRun(grid, Deployment.from_run_config(run_config)).run()


def _say(line: str) -> None:
    log(logging.INFO, "medfed: %s", line)


class FlowerRun:
    """One deployed run: finds the sites, then runs the shared round loop, reaching each site
    by Flower messages (:class:`~medfed.flower.link.FlowerLink`)."""

    def __init__(self, grid: Grid, deployment: Deployment) -> None:
        self.grid, self.d = grid, deployment
        self.run_dir = RunDir(deployment.run_dir)
        self.setup = resolve_device(deployment.config.device)
        self.messenger = Messenger(
            grid, deployment.sites, deployment.reply_timeout_s, deployment.wait_s
        )

    def run(self) -> dict[str, Any]:
        if self.d.config.init and starting_sha256(self.d.config.init) != self.d.init_sha256:
            raise ConfigError(
                f"the starting weights {self.d.config.init} changed since the app folder was "
                "written (their sha256 is not the plan's); write the app again and have the "
                "sites approve its plan"
            )
        approved = self.d.plan()  # what each site's gate checks (and its operator approved)
        infos = self.messenger.discover(approved.to_json())
        refused = self.refused()
        plan = plan_run(self.d.settled, infos)
        self.server = Coordinator(plan, self.run_dir, self.setup)
        report = self.server.init_report
        settings = RunSettings(
            self.d.run_name,
            plan.config,
            self.server.spec,
            self.d.sites,
            # nothing to send where the file went into the frozen encoder alone
            init_sha256=report.sha256 if report and report.loaded else "",
            plan=approved.to_json(),
        )
        inputs = RoundSource(self.server)
        secure_bound = self.d.secure_bound if self.d.secure_aggregation else None
        link = FlowerLink(self.messenger, self.server, settings, inputs, secure_bound)
        event: dict[str, Any] = {"engine": "flower", "plan_sha256": approved.sha256}
        if refused:
            event["refused_sites"] = refused
        if self.d.secure_aggregation:
            event |= {"secure_aggregation": "secagg+", "secure_bound": self.d.secure_bound}
        # A line per round (every few, past 20) in the ServerApp's log, which 'flwr run
        # --stream' shows: round i/N, the sites' figures and the time so far.
        loop = RoundLoop(self.server, link, inputs=inputs, say=_say)
        return loop.train(resume=self.d.resume, **event)

    def refused(self) -> dict[str, list[dict[str, str]]]:
        """The sites whose policy refused the run, recorded; the run goes on without them, or
        stops (ConfigError, events.jsonl says why) as its ``on-refusal`` setting says."""
        refused = dict(self.messenger.refused)
        if not refused:
            return {}
        left = [s for s in self.d.sites if s not in refused]
        words = "; ".join(f"{site}: {rules[0]['rule']}" for site, rules in refused.items())
        if self.d.on_refusal == "stop" or not left:
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
            for site, rules in refused.items():
                self.run_dir.log_event("site_refused", site=site, refusals=rules)
            why = f"site policies refused the run ({words})"
            self.run_dir.log_event("failed", reason=why)
            raise ConfigError(
                f"{why}; change the run, or have those sites' operators change their policy or "
                "approve the plan ('medfed deploy policy check', 'medfed deploy approve')"
                + ("" if left else "; no site is left to train")
            )
        self.d = dataclasses.replace(self.d, sites=left)
        self.messenger.keep_only(left)
        return refused
