"""A deployed run as a site approves it: its plan and the plan's hash.

The plan holds what decides what runs on a site's data and what leaves it: the app (medfed and
its version), the run's name and sites, the resolved training settings (without ``lr`` where
the sites' modality sets the learning rate), secure aggregation and its bound, the starting
weights' sha256
(of the file, "" for a random start) and the outputs the run sends out of each site. The hash
is the sha256 of the plan as canonical JSON, so the coordinator, ``medfed deploy approve`` and
the SuperNode compute it alike; a change to any of these is a new plan, to be approved again.
How long the server waits, where it writes the run and whether it resumes are not part of it.

Nothing here loads training code or torch: a SuperNode's gate decides on a message with it
before anything heavy loads. The starting weights' sha256 is computed where the weights are read
(:func:`medfed.federation.pretrained.starting_sha256`).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medfed import __version__
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError

APP = "medfed"

RUN_OUTPUTS = ("updates", "figures", "data_card")
"""What a deployed run sends out of every site: the weights it shares, its validation and test
figures (aggregates: counts, sums, intervals; each site keeps its per-scan predictions in its
own state folder), and the site's description (label map, input shape, number of training
scans, the manifest's declared facts)."""
PREDICTIONS = "predictions"
"""The output a run adds when it asks for each test scan's prediction and score (run config
``predictions = "coordinator"``): a site whose policy forbids it refuses the run."""


@dataclass(frozen=True)
class Plan:
    """What a site is asked to approve (see the module's docstring)."""

    app: str
    version: str
    run_name: str
    sites: list[str]
    train: dict[str, Any]
    secure_aggregation: bool
    secure_bound: float
    starting_sha256: str
    outputs: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "the run's plan") -> Plan:
        """A plan as a message or file spells it (ConfigError when it is not one)."""
        names = set(cls.__dataclass_fields__)
        if not isinstance(data, Mapping) or set(data) != names:
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(f"{where}: not a medfed run plan (holds {got})")
        plan = cls(**data)
        ok = (
            all(isinstance(getattr(plan, k), str) for k in ("app", "version", "run_name"))
            and isinstance(plan.sites, list)
            and isinstance(plan.train, Mapping)
            and isinstance(plan.outputs, list)
            and isinstance(plan.secure_aggregation, bool)
            and isinstance(plan.starting_sha256, str)
        )
        if not ok:
            raise ConfigError(f"{where}: a run plan with fields of the wrong kind")
        return plan

    @property
    def sha256(self) -> str:
        return plan_sha256(self)

    @property
    def config(self) -> TrainConfig:
        return TrainConfig.from_dict(dict(self.train), where="the run's plan")

    def lines(self) -> list[str]:
        """The plan in words, one line each, for an operator deciding on it."""
        c = self.config
        dp = f"DP-SGD, epsilon {c.dp_epsilon:g}" if c.dp.enabled else "no differential privacy"
        secure = "secure aggregation (SecAgg+)" if self.secure_aggregation else "plain aggregation"
        start = self.starting_sha256 or "random (seeded)"
        return [
            f"plan sha256: {self.sha256}",
            f"run: {self.run_name} ({self.app} {self.version}), sites: {', '.join(self.sites)}",
            f"algorithm: {c.algorithm}; backbone: {c.backbone}; {c.rounds} rounds of "
            f"{c.local_steps} local steps",
            f"privacy: {dp}; {secure}",
            f"starting weights: {start}",
            f"leaves each site: {', '.join(self.outputs)}",
        ]


def plan_sha256(plan: Plan) -> str:
    text = json.dumps(plan.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def make_plan(
    config: TrainConfig,
    sites: list[str],
    *,
    run_name: str,
    secure_aggregation: bool,
    secure_bound: float,
    starting_sha256: str,
    predictions_to_coordinator: bool = False,
) -> Plan:
    """The plan of a run with these (resolved) settings; ``predictions_to_coordinator``: the
    sites send each test scan's prediction (the plan lists ``predictions``)."""
    return Plan(
        app=APP,
        version=__version__,
        run_name=run_name,
        sites=list(sites),
        train=config.to_dict(),
        secure_aggregation=bool(secure_aggregation),
        secure_bound=float(secure_bound) if secure_aggregation else 0.0,
        starting_sha256=starting_sha256,
        outputs=[*RUN_OUTPUTS, *([PREDICTIONS] if predictions_to_coordinator else [])],
    )


def app_run_config(app: Path) -> dict[str, Any]:
    """The run config of an app folder ``medfed deploy app`` wrote."""
    path = app / "pyproject.toml" if app.is_dir() else app
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"--run {app}: no pyproject.toml there; give the folder 'medfed deploy app' wrote"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--run {path}: not a readable app folder ({exc})") from None
    config = data.get("tool", {}).get("flwr", {}).get("app", {}).get("config")
    if not isinstance(config, Mapping) or "train" not in config:
        raise ConfigError(
            f"--run {path}: not a medfed app (no [tool.flwr.app.config] with 'train'); give "
            "the folder 'medfed deploy app' wrote"
        )
    return dict(config)
