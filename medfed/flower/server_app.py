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
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from medfed.config import TrainConfig, valid_site_id
from medfed.errors import ConfigError
from medfed.federation.coordinator import Coordinator
from medfed.federation.plan import checked_algorithm, plan_run, resolved_settings
from medfed.federation.rounds import RoundLoop, RoundSource
from medfed.flower.deploy import MAX_WAIT_S, refuse_insecure_settings, refuse_unsupported
from medfed.flower.link import FlowerLink
from medfed.flower.messenger import Messenger
from medfed.flower.node import RunSettings, train_config_from_toml
from medfed.flower.secure import DEFAULT_BOUND
from medfed.models.device import resolve_device
from medfed.runs import RunDir

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


@app.main()
def main(grid: Grid, context: Context) -> None:
    FlowerRun(grid, Deployment.from_run_config(dict(context.run_config))).run()


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
        infos = self.messenger.discover()
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
        inputs = RoundSource(self.server)
        secure_bound = self.d.secure_bound if self.d.secure_aggregation else None
        link = FlowerLink(self.messenger, self.server, settings, inputs, secure_bound)
        event: dict[str, Any] = {"engine": "flower"}
        if self.d.secure_aggregation:
            event |= {"secure_aggregation": "secagg+", "secure_bound": self.d.secure_bound}
        return RoundLoop(self.server, link, inputs=inputs).train(resume=self.d.resume, **event)
